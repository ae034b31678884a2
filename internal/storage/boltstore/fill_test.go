package boltstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
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

// TestPageFillOfSmallBatches: batches of 100 puts whose names follow one
// another (t-12300...t-12399 lands in one run among the earlier keys) fill
// the resources bucket's pages to about bulkFill; batches of names spread
// at random keep bbolt's half fill, whose room the next keys take (90% fill
// there left pages half empty: a 90% page split again at once).
func TestPageFillOfSmallBatches(t *testing.T) {
	for _, tc := range []struct {
		order    string
		min, max float64
	}{{"sequential", 0.75, 1}, {"random", 0.6, 0.75}} {
		t.Run(tc.order, func(t *testing.T) {
			ctx := context.Background()
			s, err := Open(Config{Path: filepath.Join(t.TempDir(), "f.db")})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const n = 20000
			names := rand.New(rand.NewPCG(1, 2)).Perm(n)
			if tc.order == "sequential" {
				slices.Sort(names)
			}
			for i := 0; i < n; i += 100 {
				var batch storage.Batch
				for _, j := range names[i : i+100] {
					r := benchResource(j, 0)
					r.Name = fmt.Sprintf("t-%d", j) // numbered, not zero-padded: runs land among earlier keys
					batch.Puts = append(batch.Puts, r)
				}
				if _, err := s.Apply(ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			if fill := leafFill(t, s.db, bucketResources); fill < tc.min || fill > tc.max {
				t.Errorf("resources: leaf pages %.0f%% full, want %.0f%% to %.0f%%", fill*100, tc.min*100, tc.max*100)
			}
		})
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
