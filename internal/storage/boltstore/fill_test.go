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

// TestBulkWriteOutOfOrder: a bulk write whose puts are not in key order is
// written sorted (bulkOrder), with the result of applying them in the
// order given: each outcome and stored resource at its put's index, and
// a key given twice ending as its later put.
func TestBulkWriteOutOfOrder(t *testing.T) {
	ctx := context.Background()
	s := openTempStore(t, Config{})
	const n = 3000
	batch := storage.Batch{Puts: make([]*resource.Resource, n)}
	for i := range batch.Puts {
		batch.Puts[i] = benchResource((i*7919)%n, 0) // every name once, out of order
	}
	batch.Puts[n-1] = benchResource((10*7919)%n, 1)
	if bulkOrder(batch.Puts) == nil {
		t.Fatal("bulkOrder: nil for puts out of order")
	}
	res, err := s.Apply(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range batch.Puts {
		if got := res.Stored[i]; got.Name != p.Name || string(got.Spec) != string(p.Spec) {
			t.Fatalf("Stored[%d] is %s %s, want %s %s", i, got.Name, got.Spec, p.Name, p.Spec)
		}
	}
	if res.Outcomes[10] != storage.Created || res.Outcomes[n-1] != storage.Updated {
		t.Errorf("outcomes of the key given twice: %v then %v, want created then updated", res.Outcomes[10], res.Outcomes[n-1])
	}
	got, err := s.Get(ctx, batch.Puts[10].Key())
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Spec) != string(batch.Puts[n-1].Spec) || got.Version != 2 {
		t.Errorf("key given twice: stored version %d %s, want version 2 %s", got.Version, got.Spec, batch.Puts[n-1].Spec)
	}
	list, err := s.List(ctx, storage.ListOptions{Type: "MeshTimeout"})
	if err != nil {
		t.Fatal(err)
	}
	if list.Total != n-1 { // the last put replaced one name's only put
		t.Errorf("listed %d, want %d", list.Total, n-1)
	}
}

// TestBulkOrderKeepsSortedInput: puts already in key order, or too few to
// be a bulk write, are written as given, with no sort and no index.
func TestBulkOrderKeepsSortedInput(t *testing.T) {
	sorted := make([]*resource.Resource, bulkPuts)
	for i := range sorted {
		sorted[i] = benchResource(i, 0)
	}
	if bulkOrder(sorted) != nil {
		t.Error("bulkOrder: an order for sorted puts")
	}
	few := []*resource.Resource{benchResource(2, 0), benchResource(1, 0)}
	if bulkOrder(few) != nil {
		t.Error("bulkOrder: an order for a batch below bulkPuts")
	}
}
