// Command zone-cp is Meridian's zone control plane: it holds the zone's
// proxies and local policies, syncs with the global control plane and
// computes every proxy's effective configuration.
package main

import (
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/controlplane"
	"github.com/meridian-mesh/meridian/internal/version"
)

func main() {
	controlplane.Execute(newCommand())
}

func newCommand() *cobra.Command {
	var (
		common          controlplane.CommonFlags
		zone            string
		globalAddress   string
		systemNamespace string
		environment     string
		tokenFile       string
		caFile          string
		skipVerify      bool
		xdsAddress      string
		xdsCertFile     string
		xdsKeyFile      string
		grace           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "zone-cp",
		Short: "Meridian zone control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := common.Prepare(cmd, "zone-cp")
			if err != nil {
				return err
			}
			p, err := plane.NewZone(zone, environment, systemNamespace, globalAddress != "")
			if err != nil {
				return err
			}
			return controlplane.Run(cmd.Context(), controlplane.Config{
				Plane:              p,
				DataDir:            common.DataDir,
				APIAddress:         common.APIAddress,
				DebugAddress:       common.DebugAddress,
				Version:            version.Version,
				Logger:             logger.With("zone", zone),
				TombstoneRetention: common.TombstoneRetention,
				LocalhostIsAdmin:   common.LocalhostIsAdmin,
				AllowedHosts:       common.AllowedHosts,
				APIReadTimeout:     common.APIReadTimeout,
				GlobalAddress:      globalAddress,
				ZoneTokenFile:      tokenFile,
				KDSCAFile:          caFile,
				KDSSkipVerify:      skipVerify,
				TLSCertFile:        common.TLSCertFile,
				TLSKeyFile:         common.TLSKeyFile,
				APITLS:             common.APITLS,
				SyncStream:         common.SyncStream(),
				XDSAddress:         xdsAddress,
				XDSTLSCertFile:     xdsCertFile,
				XDSTLSKeyFile:      xdsKeyFile,
				DataplaneGrace:     grace,
			})
		},
	}
	common.Register(cmd, "127.0.0.1:5681")
	fs := cmd.Flags()
	fs.StringVar(&zone, "zone", "", "name of this zone (required)")
	fs.StringVar(&globalAddress, "global-address", "", "global control plane KDS address HOST:PORT; empty = standalone zone")
	fs.StringVar(&systemNamespace, "system-namespace", plane.DefaultSystemNamespace, "the control plane's system namespace")
	fs.StringVar(&environment, "environment", "kubernetes", "zone environment: kubernetes or universal")
	fs.StringVar(&tokenFile, "zone-token-file", "", "file holding this zone's token issued by the global")
	fs.StringVar(&caFile, "kds-ca-file", "", "CA bundle (PEM) to verify the global's KDS certificate")
	fs.BoolVar(&skipVerify, "kds-skip-verify", false, "do not verify the global's KDS certificate (testing only)")
	fs.StringVar(&xdsAddress, "xds-address", controlplane.DefaultXDSAddress, "address HOST:PORT of the xDS server and the agents' service (meridian-dp); empty turns the data plane off")
	fs.StringVar(&xdsCertFile, "xds-tls-cert-file", "", "certificate (PEM) of the xDS server; empty = generated into the data dir (xds-server.crt)")
	fs.StringVar(&xdsKeyFile, "xds-tls-key-file", "", "private key (PEM) of --xds-tls-cert-file")
	fs.DurationVar(&grace, "dataplane-grace-period", time.Minute, "how long a Dataplane an agent registered outlives the agent")
	return cmd
}
