package boltstore

import (
	"context"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// TestPageFill: a bulk write (a cold zone's full snapshot, keys in order)
// leaves the resources bucket's leaf pages filled to about bulkFill, and
// the log, whose keys only grow, fills its pages whole even when written one
// put at a time. bbolt's default would leave about half of every page empty.
func TestPageFill(t *testing.T) {
	ctx := context.Background()
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "f.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	batch := storage.Batch{Puts: make([]*resource.Resource, 5000)}
	for i := range batch.Puts {
		batch.Puts[i] = benchResource(i, 0)
	}
	if _, err := s.Apply(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if fill := leafFill(t, s.db, bucketResources); fill < 0.8 {
		t.Errorf("resources after a bulk write: leaf pages %.0f%% full, want at least 80%%", fill*100)
	}
	for i := range 2000 {
		if _, _, err := s.Put(ctx, benchResource(100000+i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if fill := leafFill(t, s.db, bucketLog); fill < 0.9 {
		t.Errorf("log after single puts: leaf pages %.0f%% full, want at least 90%%", fill*100)
	}
}

// leafFill is the share of the bucket's leaf pages in use.
func leafFill(t *testing.T, db *bolt.DB, bucket string) float64 {
	t.Helper()
	var st bolt.BucketStats
	if err := db.View(func(tx *bolt.Tx) error {
		st = tx.Bucket([]byte(bucket)).Stats()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return float64(st.LeafInuse) / float64(st.LeafPageN*db.Info().PageSize)
}
