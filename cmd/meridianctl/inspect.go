package main

import (
	"fmt"
	"net/url"

	"github.com/spf13/cobra"
)

func (a *app) inspectCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show what the control plane computed",
	}
	cmd.AddCommand(a.inspectDataplaneCommand(), a.inspectZonesCommand(), a.inspectZoneTokenKeysCommand())
	return cmd
}

// inspectDataplaneCommand prints a zone's _rules (default) or _config view of
// one proxy.
func (a *app) inspectDataplaneCommand() *cobra.Command {
	var mesh, namespace, output string
	var rules, config bool
	var ex explainFlags
	cmd := &cobra.Command{
		Use:   "dataplane NAME [-o json|yaml] [--rules|--config|--explain --type T (--outbound S [--route R] | --inbound P --client k:v,...)]",
		Short: "Summarize a proxy's effective config (default), or show its rules, config, or why a field has its value (zone control plane)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (rules && config) || (ex.explain && (rules || config)) {
				return fmt.Errorf("--rules, --config and --explain exclude each other")
			}
			q := url.Values{}
			if namespace != "" {
				q.Set("namespace", namespace)
			}
			if ex.explain {
				return a.explain(cmd, mesh, args[0], q, ex, output)
			}
			if output == "" {
				output = "summary"
				if rules || config {
					output = "json"
				}
			}
			if output != "json" && output != "yaml" && output != "summary" {
				return fmt.Errorf("--output: want summary, json or yaml, got %q", output)
			}
			view := "_rules"
			if config || output == "summary" {
				view = "_config"
			}
			path := "/meshes/" + url.PathEscape(mesh) + "/dataplanes/" + url.PathEscape(args[0]) + "/" + view
			body, _, err := a.client.do(cmd.Context(), "GET", path, q, nil, "")
			if err != nil {
				return err
			}
			if output == "summary" {
				return a.printConfigSummary(body)
			}
			return a.printRaw(body, output)
		},
	}
	cmd.Flags().StringVarP(&mesh, "mesh", "m", "default", "mesh")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the Dataplane")
	cmd.Flags().BoolVar(&rules, "rules", false, "show the rules per policy type (default)")
	cmd.Flags().BoolVar(&config, "config", false, "show the effective config per inbound and outbound, with RBAC")
	cmd.Flags().BoolVar(&ex.explain, "explain", false, "explain one policy type's effective conf field by field: who set each field, who lost and why")
	cmd.Flags().StringVar(&ex.typ, "type", "", "with --explain: the policy type, e.g. MeshTimeout")
	cmd.Flags().StringVar(&ex.outbound, "outbound", "", "with --explain: the outbound's service")
	cmd.Flags().StringVar(&ex.route, "route", "", "with --explain --outbound: the MeshHTTPRoute whose traffic to explain (name, or namespace/name)")
	cmd.Flags().IntVar(&ex.inbound, "inbound", 0, "with --explain: the inbound's port")
	cmd.Flags().StringVar(&ex.client, "client", "", "with --explain --inbound: the client's tags, k:v,k2:v2")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: summary (default), json or yaml (the full _rules or, with --config, _config document); --explain: table, json or yaml")
	return cmd
}
