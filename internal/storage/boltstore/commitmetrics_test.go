package boltstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

// TestStoreCommitMetrics: every write the embedded store commits shows in
// the commit histograms, on the process's own registry.
func TestStoreCommitMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := boltstore.NewCommitMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "m.db"), Commits: m})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	const puts = 3
	for i := range puts {
		r := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("t-%d", i),
			Spec: []byte(`{"targetRef":{"kind":"Mesh"}}`)}
		if _, _, err := store.Put(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	// The committer observes a commit after answering its writers, so the
	// last Put may return just before its commit is counted.
	got := map[string][2]float64{} // name → count, sum
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			h := f.GetMetric()[0].GetHistogram()
			got[f.GetName()] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
		}
		if got["meridian_store_commit_writes"][0] >= puts || time.Now().After(deadline) {
			break
		}
	}
	if w := got["meridian_store_commit_writes"]; w[0] != puts || w[1] != puts {
		t.Errorf("meridian_store_commit_writes: count %v, sum %v; want %d and %d (sequential puts commit one by one)", w[0], w[1], puts, puts)
	}
	if d := got["meridian_store_commit_duration_seconds"]; d[0] != puts || d[1] <= 0 {
		t.Errorf("meridian_store_commit_duration_seconds: count %v, sum %v; want %d commits of some duration", d[0], d[1], puts)
	}
	if _, err := boltstore.NewCommitMetrics(reg); err == nil {
		t.Error("registering the commit metrics twice on one registry succeeded")
	}
}
