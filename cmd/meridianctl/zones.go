package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/spf13/cobra"
)

func (a *app) generateCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "generate", Short: "Generate credentials"}
	cmd.AddCommand(a.generateZoneTokenCommand(), a.generateUserTokenCommand(), a.generateDataplaneTokenCommand())
	return cmd
}

// generateZoneTokenCommand asks the global for a zone token and prints it,
// ready for zone-cp --zone-token-file.
func (a *app) generateZoneTokenCommand() *cobra.Command {
	var zone, validFor string
	cmd := &cobra.Command{
		Use:   "zone-token --zone NAME [--valid-for 24h]",
		Short: "Issue a token a zone control plane presents to the global (global control plane)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if zone == "" {
				return fmt.Errorf("--zone is required")
			}
			if _, err := time.ParseDuration(validFor); err != nil {
				return fmt.Errorf("--valid-for: %w", err)
			}
			return a.issueToken(cmd, "/tokens/zone", map[string]any{"zone": zone, "validFor": validFor})
		},
	}
	cmd.Flags().StringVar(&zone, "zone", "", "zone name the token is bound to (required)")
	cmd.Flags().StringVar(&validFor, "valid-for", "24h", "how long the token is valid")
	return cmd
}

// issueToken POSTs req to path and prints the token of the answer alone
// on stdout (ready for a token file).
func (a *app) issueToken(cmd *cobra.Command, path string, req map[string]any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	resp, _, err := a.client.do(cmd.Context(), "POST", path, nil, body, "")
	if err != nil {
		return err
	}
	var out api.TokenResponse
	if err := json.Unmarshal(resp, &out); err != nil || out.Token == "" {
		return fmt.Errorf("unexpected response: %s", resp)
	}
	fmt.Fprintln(a.stdout, out.Token)
	fmt.Fprintf(a.stderr, "token id %s, expires %s (revoke it with: meridianctl revoke %s %s)\n",
		out.ID, out.ExpiresAt, strings.TrimPrefix(path, "/tokens/")+"-token", out.ID)
	return nil
}

// generateUserTokenCommand asks a control plane for a user token.
func (a *app) generateUserTokenCommand() *cobra.Command {
	var name, validFor string
	var groups, meshes []string
	cmd := &cobra.Command{
		Use:   "user-token --name NAME --group mesh-system:admin|mesh-system:viewer [--mesh M]... [--valid-for 24h]",
		Short: "Issue a user token for the REST API (admin only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return fmt.Errorf("--name is required")
			}
			if len(groups) == 0 {
				return fmt.Errorf("--group is required (mesh-system:admin or mesh-system:viewer)")
			}
			if _, err := time.ParseDuration(validFor); err != nil {
				return fmt.Errorf("--valid-for: %w", err)
			}
			return a.issueToken(cmd, "/tokens/user", map[string]any{"name": name, "groups": groups, "meshes": meshes, "validFor": validFor})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "who the token is for (required)")
	cmd.Flags().StringSliceVar(&groups, "group", nil, "group: mesh-system:admin or mesh-system:viewer (repeatable)")
	cmd.Flags().StringSliceVar(&meshes, "mesh", nil, "confine the token to this mesh (repeatable; none = all meshes)")
	cmd.Flags().StringVar(&validFor, "valid-for", "24h", "how long the token is valid")
	return cmd
}

func (a *app) inspectZonesCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "zones",
		Short: "Show every zone's sync status (global control plane)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			// A zone answers GET /zones too (its own, empty, list of Zone
			// resources): say where the sync status lives instead.
			if err := a.client.checkPlane(cmd.Context(), "global"); err != nil {
				return err
			}
			body, _, err := a.client.do(cmd.Context(), "GET", "/zones", nil, nil, "")
			if err != nil {
				return err
			}
			if output != "table" {
				return a.printRaw(body, output)
			}
			var page api.List[api.ZoneItem]
			if err := json.Unmarshal(body, &page); err != nil {
				return fmt.Errorf("decode response: %w", err)
			}
			return a.printZones(page.Items)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, yaml or json")
	return cmd
}

func (a *app) printZones(rows []api.ZoneItem) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSTATUS\tVERSION\tCONNECTED\tLAST HEARTBEAT\tBATCHES G>Z (NACKED)\tBATCHES Z>G (NACKED)\tLAST ERROR")
	for _, z := range rows {
		status := "Offline"
		if z.Connected {
			status = "Online"
		}
		lastErr := z.GlobalToZone.LastNackError
		if lastErr == "" {
			lastErr = z.LastError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d (%d)\t%d (%d)\t%s\n", z.Zone, status, dash(z.SoftwareVersion),
			ago(z.ConnectTime), ago(z.LastHeartbeat), z.GlobalToZone.BatchesSent, z.GlobalToZone.BatchesNacked,
			z.ZoneToGlobal.BatchesSent, z.ZoneToGlobal.BatchesNacked, dash(lastErr))
	}
	return tw.Flush()
}

func ago(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return time.Since(*t).Round(time.Second).String() + " ago"
}

// generateDataplaneTokenCommand asks a zone for a Dataplane token, ready
// for meridian-dp --dataplane-token-file.
func (a *app) generateDataplaneTokenCommand() *cobra.Command {
	var mesh, name, namespace, validFor string
	var tags []string
	cmd := &cobra.Command{
		Use:   "dataplane-token --mesh M (--name N [--namespace NS] | --tag k=v...) [--valid-for 24h]",
		Short: "Issue the token a workload's agent (meridian-dp) joins a zone with (zone control plane, admin only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mesh == "" {
				return fmt.Errorf("--mesh is required")
			}
			if name == "" && len(tags) == 0 {
				return fmt.Errorf("give --name (one Dataplane) or --tag (every Dataplane it registers must carry the tags)")
			}
			if _, err := time.ParseDuration(validFor); err != nil {
				return fmt.Errorf("--valid-for: %w", err)
			}
			req := map[string]any{"mesh": mesh, "validFor": validFor}
			if name != "" {
				req["name"] = name
			}
			if namespace != "" {
				req["namespace"] = namespace
			}
			if len(tags) > 0 {
				m := map[string]string{}
				for _, t := range tags {
					k, v, ok := strings.Cut(t, "=")
					if !ok || k == "" || v == "" {
						return fmt.Errorf("--tag %q: want key=value", t)
					}
					m[k] = v
				}
				req["tags"] = m
			}
			return a.issueToken(cmd, "/tokens/dataplane", req)
		},
	}
	cmd.Flags().StringVar(&mesh, "mesh", "", "mesh of the Dataplane (required)")
	cmd.Flags().StringVar(&name, "name", "", "the one Dataplane the token admits")
	cmd.Flags().StringVar(&namespace, "namespace", "", "namespace of the Dataplane (Kubernetes zones)")
	cmd.Flags().StringArrayVar(&tags, "tag", nil, "a tag every inbound of the Dataplanes the token admits must carry (key=value, repeatable)")
	cmd.Flags().StringVar(&validFor, "valid-for", "24h", "how long the token is valid")
	return cmd
}
