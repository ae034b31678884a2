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
	cmd.AddCommand(a.inspectDataplaneCommand(), a.inspectZonesCommand())
	return cmd
}

// inspectDataplaneCommand prints a zone's _rules (default) or _config view of
// one proxy.
func (a *app) inspectDataplaneCommand() *cobra.Command {
	var mesh, namespace, output string
	var rules, config bool
	cmd := &cobra.Command{
		Use:   "dataplane NAME [--rules|--config]",
		Short: "Show a proxy's policy rules or effective config (zone control plane)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rules && config {
				return fmt.Errorf("--rules and --config exclude each other")
			}
			if output != "json" && output != "yaml" {
				return fmt.Errorf("--output: want json or yaml, got %q", output)
			}
			view := "_rules"
			if config {
				view = "_config"
			}
			q := url.Values{}
			if namespace != "" {
				q.Set("namespace", namespace)
			}
			path := "/meshes/" + url.PathEscape(mesh) + "/dataplanes/" + url.PathEscape(args[0]) + "/" + view
			body, _, err := a.client.do(cmd.Context(), "GET", path, q, nil, "")
			if err != nil {
				return err
			}
			return a.printRaw(body, output)
		},
	}
	cmd.Flags().StringVarP(&mesh, "mesh", "m", "default", "mesh")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the Dataplane")
	cmd.Flags().BoolVar(&rules, "rules", false, "show the rules per policy type (default)")
	cmd.Flags().BoolVar(&config, "config", false, "show the effective config per inbound and outbound, with RBAC")
	cmd.Flags().StringVarP(&output, "output", "o", "json", "output format: json or yaml")
	return cmd
}
