package etcdstore

import (
	"context"
	"os"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/etcdstore/etcdtest"
	"github.com/meridian-mesh/meridian/internal/storage/storagetest"
)

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "etcdstore", Level: hclog.Warn, Output: t.Output()})
}

// TestConformance runs the shared suite on a real 3-member etcd cluster.
// Each store of the suite lives under its own prefix (the suite's directory
// for it), so reopening finds the same data. etcd compaction is
// cluster-wide and the suite's stores share the cluster, so here the
// tombstone window is only the store's own mark; TestCompactEtcd covers
// compacting etcd itself. Small transaction limits make the suite's larger
// batches span several groups.
func TestConformance(t *testing.T) {
	cluster := etcdtest.Start(t, 3, etcdtest.Options{})
	cli := cluster.Client(t)
	tests := []struct {
		name   string
		maxOps int
	}{
		{"etcd defaults", 0},
		{"small groups", 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			storagetest.Run(t, storagetest.Factory{
				Open: func(t *testing.T, o storagetest.Options) (storage.Store, error) {
					return Open(t.Context(), Config{Client: cli, Prefix: o.Dir + "/" + tc.name + "/", Logger: testLogger(t),
						Clock: o.Clock, TombstoneRetention: o.TombstoneRetention, MaxTxnOps: tc.maxOps})
				},
				ExpireTombstones: func(ctx context.Context, s storage.Store) error {
					_, err := s.(*Store).ExpireTombstones(ctx)
					return err
				},
			})
		})
	}
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }
