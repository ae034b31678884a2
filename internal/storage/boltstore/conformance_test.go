package boltstore

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/storagetest"
)

// testLogger shows the store's warnings and errors in the test output.
func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "boltstore", Level: hclog.Warn, Output: t.Output()})
}

// TestConformance runs the shared suite twice: with the production
// settings, and with tiny watch chunks, commit groups and a tiny cache of
// decoded log entries so that chunk boundaries (also inside one batch's
// revision), group splitting and cache eviction are exercised by small
// tests too.
func TestConformance(t *testing.T) {
	tests := []struct {
		name          string
		watchChunk    int
		maxWriteGroup int
		eventCache    int
	}{
		{"defaults", defaultWatchChunk, 0, eventCacheSize},
		{"tiny chunks, groups and cache", 2, 2, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			storagetest.Run(t, storagetest.Factory{
				Open: func(t *testing.T, o storagetest.Options) (storage.Store, error) {
					s, err := Open(Config{
						Path:               filepath.Join(o.Dir, "meridian.db"),
						Logger:             testLogger(t),
						Clock:              o.Clock,
						TombstoneRetention: o.TombstoneRetention,
						MaxWriteGroup:      tc.maxWriteGroup,
					})
					if err != nil {
						return nil, err
					}
					s.watchChunk = tc.watchChunk // before any Watch
					s.events = newEventCache(tc.eventCache)
					return s, nil
				},
				ExpireTombstones: func(ctx context.Context, s storage.Store) error {
					_, err := s.(*Store).ExpireTombstones(ctx)
					return err
				},
			})
		})
	}
}
