package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// Zone token lifecycle on the global: revoke one token, rotate and retire
// signing keys, list keys.

func (a *app) revokeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "revoke", Short: "Revoke credentials"}
	cmd.AddCommand(&cobra.Command{
		Use:   "zone-token ID",
		Short: "Revoke one zone token by its id (printed when it was issued); its live streams end at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, _, err := a.client.do(cmd.Context(), "DELETE", "/tokens/zone/"+url.PathEscape(args[0]), nil, nil, "")
			if err != nil {
				return err
			}
			var out struct {
				StreamsEnded int `json:"streamsEnded"`
			}
			_ = json.Unmarshal(body, &out)
			fmt.Fprintf(a.stdout, "zone token %s revoked (%d live stream(s) ended)\n", args[0], out.StreamsEnded)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "dataplane-token ID",
		Short: "Revoke one Dataplane token by its id (zone control plane); its agents' sessions and workloads' xDS streams end at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, _, err := a.client.do(cmd.Context(), "DELETE", "/tokens/dataplane/"+url.PathEscape(args[0]), nil, nil, "")
			if err != nil {
				return err
			}
			var out struct {
				StreamsEnded int `json:"streamsEnded"`
			}
			_ = json.Unmarshal(body, &out)
			fmt.Fprintf(a.stdout, "dataplane token %s revoked (%d xDS stream(s) ended)\n", args[0], out.StreamsEnded)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "user-token ID",
		Short: "Revoke one user token by its id (printed when it was issued); it authenticates nobody from then on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, _, err := a.client.do(cmd.Context(), "DELETE", "/tokens/user/"+url.PathEscape(args[0]), nil, nil, ""); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "user token %s revoked\n", args[0])
			return nil
		},
	})
	return cmd
}

func (a *app) rotateCommand() *cobra.Command {
	var overlap string
	rotate := &cobra.Command{
		Use:   "zone-token-key [--overlap 24h]",
		Short: "Make a new zone token signing key; tokens of the old key keep working for --overlap",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := time.ParseDuration(overlap); err != nil {
				return fmt.Errorf("--overlap: %w", err)
			}
			req, _ := json.Marshal(map[string]string{"overlap": overlap})
			body, _, err := a.client.do(cmd.Context(), "POST", "/tokens/zone/signing-keys", nil, req, "")
			if err != nil {
				return err
			}
			var out struct {
				KID, Previous, PreviousRetiresAt string
			}
			if err := json.Unmarshal(body, &out); err != nil {
				return fmt.Errorf("unexpected response: %s", body)
			}
			fmt.Fprintf(a.stdout, "new signing key %s; key %s verifies until %s: issue new zone tokens before then\n",
				out.KID, out.Previous, out.PreviousRetiresAt)
			return nil
		},
	}
	rotate.Flags().StringVar(&overlap, "overlap", "24h", "how long tokens of the old key keep working")
	cmd := &cobra.Command{Use: "rotate", Short: "Rotate signing keys (global control plane)"}
	cmd.AddCommand(rotate)
	return cmd
}

func (a *app) retireCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "retire", Short: "Retire rotated-out signing keys now (global control plane)"}
	cmd.AddCommand(&cobra.Command{
		Use:   "zone-token-key KID",
		Short: "Stop accepting tokens of a rotated-out signing key now; their live streams end",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, _, err := a.client.do(cmd.Context(), "DELETE", "/tokens/zone/signing-keys/"+url.PathEscape(args[0]), nil, nil, ""); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "signing key %s retired\n", args[0])
			return nil
		},
	})
	return cmd
}

// inspectZoneTokenKeysCommand lists the signing keys.
func (a *app) inspectZoneTokenKeysCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "zone-token-keys",
		Short: "List the zone token signing keys (global control plane)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			body, _, err := a.client.do(cmd.Context(), "GET", "/tokens/zone/signing-keys", nil, nil, "")
			if err != nil {
				return err
			}
			var page struct {
				Items []struct {
					KID      string     `json:"kid"`
					Current  bool       `json:"current"`
					RetireAt *time.Time `json:"retireAt"`
				} `json:"items"`
			}
			if err := json.Unmarshal(body, &page); err != nil {
				return fmt.Errorf("unexpected response: %s", body)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "KID\tSTATE\tRETIRES")
			for _, k := range page.Items {
				state, retires := "previous", "-"
				if k.Current {
					state = "current (signs new tokens)"
				}
				if k.RetireAt != nil {
					retires = k.RetireAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", k.KID, state, retires)
			}
			return tw.Flush()
		},
	}
}
