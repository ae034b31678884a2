// Command global-cp is Meridian's global control plane: it holds fleet-wide
// policies, serves them to zones over KDS and exposes the REST API.
package main

import (
	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/controlplane"
	"github.com/meridian-mesh/meridian/internal/version"
)

func main() {
	controlplane.Execute(newCommand())
}

func newCommand() *cobra.Command {
	var (
		common     controlplane.CommonFlags
		kdsAddress string
	)
	cmd := &cobra.Command{
		Use:   "global-cp",
		Short: "Meridian global control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := common.Prepare(cmd, "global-cp")
			if err != nil {
				return err
			}
			return controlplane.Run(cmd.Context(), controlplane.Config{
				Mode:               api.ModeGlobal,
				DataDir:            common.DataDir,
				APIAddress:         common.APIAddress,
				DebugAddress:       common.DebugAddress,
				Version:            version.Version,
				Logger:             logger,
				TombstoneRetention: common.TombstoneRetention,
				LocalhostIsAdmin:   common.LocalhostIsAdmin,
				APIReadTimeout:     common.APIReadTimeout,
				KDSAddress:         kdsAddress,
				TLSCertFile:        common.TLSCertFile,
				TLSKeyFile:         common.TLSKeyFile,
				APITLS:             common.APITLS,
				SyncStream:         common.SyncStream(),
			})
		},
	}
	common.Register(cmd, "127.0.0.1:5681")
	fs := cmd.Flags()
	fs.StringVar(&kdsAddress, "kds-address", "127.0.0.1:5685", "KDS (zone sync) gRPC listen address")
	return cmd
}
