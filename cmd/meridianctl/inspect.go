package main

import (
	"fmt"
	"maps"
	"net/url"
	"strings"

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
	var mesh, namespace, output, proxy string
	var rules, config, xdsView bool
	var ex explainFlags
	cmd := &cobra.Command{
		Use:   "dataplane NAME [-o json|yaml] [--rules|--config|--xds [--proxy grpc|envoy]|--explain --type T (--outbound S [--route R] | --inbound P --client k:v,...)]",
		Short: "Summarize a proxy's effective config and xDS state (default), or show its rules, config, xDS resources, or why a field has its value (zone control plane)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n := countTrue(rules, config, xdsView, ex.explain); n > 1 {
				return fmt.Errorf("--rules, --config, --xds and --explain exclude each other")
			}
			q := url.Values{}
			if namespace != "" {
				q.Set("namespace", namespace)
			}
			if proxy != "" && !xdsView {
				return fmt.Errorf("--proxy goes with --xds")
			}
			if ex.explain {
				return a.explain(cmd, mesh, args[0], q, ex, output)
			}
			if output == "" {
				output = "summary"
				if rules || config || xdsView {
					output = "json"
				}
			}
			if output != "json" && output != "yaml" && output != "summary" {
				return fmt.Errorf("--output: want summary, json or yaml, got %q", output)
			}
			view := "_rules"
			switch {
			case xdsView:
				view = "_xds"
			case config || output == "summary":
				view = "_config"
			}
			path := "/meshes/" + url.PathEscape(mesh) + "/dataplanes/" + url.PathEscape(args[0]) + "/" + view
			vq := q
			if proxy != "" {
				vq = url.Values{}
				maps.Copy(vq, q)
				vq.Set("proxy", proxy)
			}
			body, _, err := a.client.do(cmd.Context(), "GET", path, vq, nil, "")
			if err != nil {
				return err
			}
			if output == "summary" {
				if err := a.printConfigSummary(body); err != nil {
					return err
				}
				// The data plane's state, where the zone serves xDS.
				if xb, _, err := a.client.do(cmd.Context(), "GET", strings.TrimSuffix(path, view)+"_xds", q, nil, ""); err == nil {
					return a.printXDSSummary(xb)
				}
				return nil
			}
			return a.printRaw(body, output)
		},
	}
	cmd.Flags().StringVarP(&mesh, "mesh", "m", "default", "mesh")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the Dataplane")
	cmd.Flags().BoolVar(&rules, "rules", false, "show the rules per policy type (default)")
	cmd.Flags().BoolVar(&config, "config", false, "show the effective config per inbound and outbound, with RBAC")
	cmd.Flags().BoolVar(&xdsView, "xds", false, "show what the proxy gets over xDS (Envoy's config dump shape), its connection, ACKs and NACKs")
	cmd.Flags().StringVar(&proxy, "proxy", "", "with --xds: render for this kind of proxy, grpc or envoy (default: the kind its agent runs)")
	cmd.Flags().BoolVar(&ex.explain, "explain", false, "explain one policy type's effective conf field by field: who set each field, who lost and why")
	cmd.Flags().StringVar(&ex.typ, "type", "", "with --explain: the policy type, e.g. MeshTimeout")
	cmd.Flags().StringVar(&ex.outbound, "outbound", "", "with --explain: the outbound's service")
	cmd.Flags().StringVar(&ex.route, "route", "", "with --explain --outbound: the MeshHTTPRoute whose traffic to explain (name, or namespace/name)")
	cmd.Flags().IntVar(&ex.inbound, "inbound", 0, "with --explain: the inbound's port")
	cmd.Flags().StringVar(&ex.client, "client", "", "with --explain --inbound: the client's tags, k:v,k2:v2")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: summary (default), json or yaml (the full _rules or, with --config, _config document); --explain: table, json or yaml")
	return cmd
}

func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
