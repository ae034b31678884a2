// Command global-cp is Meridian's global control plane: it holds fleet-wide
// policies, serves them to zones over KDS and exposes the REST API.
package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-mesh/meridian/internal/controlplane"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/replica"
	"github.com/meridian-mesh/meridian/internal/version"
)

func main() {
	controlplane.Execute(newCommand())
}

func newCommand() *cobra.Command {
	var (
		common     controlplane.CommonFlags
		kdsAddress string
		store      string
		etcd       replica.EtcdConfig
		kdsLimits  kds.ConnLimits
		kdsConnTO  time.Duration
		zoneQuota  kds.ZoneQuota
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
				Plane:                plane.NewGlobal(""),
				DataDir:              common.DataDir,
				APIAddress:           common.APIAddress,
				DebugAddress:         common.DebugAddress,
				Version:              version.Version,
				Logger:               logger,
				TombstoneRetention:   common.TombstoneRetention,
				LocalhostIsAdmin:     common.LocalhostIsAdmin,
				AllowedHosts:         common.AllowedHosts,
				APIReadTimeout:       common.APIReadTimeout,
				KDSAddress:           kdsAddress,
				TLSCertFile:          common.TLSCertFile,
				TLSKeyFile:           common.TLSKeyFile,
				APITLS:               common.APITLS,
				SyncStream:           common.SyncStream(),
				Store:                store,
				Etcd:                 etcd,
				KDSConnLimits:        kdsLimits,
				KDSConnectionTimeout: kdsConnTO,
				ZoneQuota:            zoneQuota,
			})
		},
	}
	common.Register(cmd, "127.0.0.1:5681")
	fs := cmd.Flags()
	fs.StringVar(&kdsAddress, "kds-address", "127.0.0.1:5685", "KDS (zone sync) gRPC listen address")
	fs.IntVar(&kdsLimits.Max, "kds-max-connections", 4096, "KDS connections kept at most (0: no limit)")
	fs.IntVar(&kdsLimits.PerSource, "kds-max-connections-per-source", 256, "KDS connections kept at most from one IP address (0: no limit)")
	fs.IntVar(&zoneQuota.MaxResources, "kds-zone-max-resources", 200000, "resources one zone may store on the global (0: no limit)")
	fs.Int64Var(&zoneQuota.MaxBytes, "kds-zone-max-bytes", 1<<30, "bytes of resources one zone may store on the global (0: no limit)")
	fs.DurationVar(&kdsConnTO, "kds-connection-timeout", 10*time.Second, "a KDS connection must finish its TLS and HTTP/2 setup within this")
	fs.StringVar(&store, "store", "bolt", "store: bolt (embedded file in --data-dir) or etcd (replicas sharing --etcd-endpoints)")
	fs.StringSliceVar(&etcd.Endpoints, "etcd-endpoints", nil, "etcd client URLs, comma-separated (with --store etcd)")
	fs.StringVar(&etcd.Prefix, "etcd-prefix", "/meridian/", "key prefix of this Meridian in etcd")
	fs.StringVar(&etcd.CAFile, "etcd-ca-file", "", "CA certificate (PEM) that verifies the etcd members")
	fs.StringVar(&etcd.CertFile, "etcd-cert-file", "", "client certificate (PEM) presented to etcd")
	fs.StringVar(&etcd.KeyFile, "etcd-key-file", "", "private key (PEM) of --etcd-cert-file")
	fs.IntVar(&etcd.MaxTxnOps, "etcd-max-txn-ops", 128, "the cluster's --max-txn-ops: no write sends more operations in one transaction")
	fs.IntVar(&etcd.MaxTxnBytes, "etcd-max-txn-bytes", 1536*1024, "the cluster's --max-request-bytes: no write sends a bigger transaction")
	fs.StringVar(&etcd.SecretsKeyFile, "etcd-secrets-key-file", "", "32-byte key (raw, hex or base64) encrypting the replicas' shared signing keys in etcd (required with --store etcd)")
	fs.StringVar(&etcd.Name, "replica-name", "", "this replica's name in the leader election (default: host name and API address)")
	return cmd
}
