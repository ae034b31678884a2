package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/version"
)

// versionCommand prints the client's version and the server's (its mode,
// and zone for a zone). A server that cannot be reached is reported after
// the client's version, and the command fails.
func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show the client's and the control plane's versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(a.stdout, "Client: meridianctl %s\n", version.Version)
			body, _, err := a.client.do(cmd.Context(), "GET", "/", nil, nil, "")
			if err != nil {
				return err
			}
			var index struct {
				Version     string `json:"version"`
				Mode        string `json:"mode"`
				Zone        string `json:"zone"`
				Environment string `json:"environment"`
			}
			if err := json.Unmarshal(body, &index); err != nil {
				return fmt.Errorf("decode response: %w", err)
			}
			plane := index.Mode + " control plane"
			if index.Zone != "" {
				plane = fmt.Sprintf("zone control plane %q (%s)", index.Zone, index.Environment)
			}
			fmt.Fprintf(a.stdout, "Server: Meridian %s, %s at %s\n", index.Version, plane, a.client.base.Redacted())
			return nil
		},
	}
}
