package policyview_test

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/meridian-mesh/meridian/internal/policyview"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

// BenchmarkViewHeap100000 reports the heap a zone's view of 100,000
// MeshTimeouts holds (with the store under it) once it has built the mesh's
// snapshot, computed its statuses and one proxy's rules: heap-MiB measured
// after a collection, against the heap with the store open and loaded
// (inuse-MiB: the spans, which resident memory pays). Run with -benchtime
// 1x. Each policy has its own name, display name and conf, as a zone's
// copies of global policies do.
func BenchmarkViewHeap100000(b *testing.B) {
	const n = 100000
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(b.TempDir(), "db")})
		if err != nil {
			b.Fatal(err)
		}
		batch := storage.Batch{Puts: []*resource.Resource{dataplane("web-1", "web")}}
		for i := range n {
			batch.Puts = append(batch.Puts, &resource.Resource{Type: "MeshTimeout", Mesh: "default",
				Namespace: "kuma-system", Name: fmt.Sprintf("t-%d-5f9b2c7d", i),
				Labels: resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal,
					resource.LabelDisplayName: fmt.Sprintf("t-%d", i), resource.LabelPolicyRole: "system"}),
				Spec: fmt.Appendf(nil, `{"targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}}]}`, 1+i%1000)})
		}
		if _, err := store.Apply(ctx, batch); err != nil {
			b.Fatal(err)
		}
		batch = storage.Batch{}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		v, err := policyview.New(policyview.Config{Registry: resource.NewDefaultRegistry(), Store: store, Plane: testZone})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- v.Run(ctx) }()
		snap, err := v.Snapshot(ctx, "default")
		if err != nil {
			b.Fatal(err)
		}
		snap.ComputeStatuses()
		if _, err := snap.Rules("web-1", ""); err != nil {
			b.Fatal(err)
		}
		snap = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "inuse-MiB")
		runtime.KeepAlive(v)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		store.Close()
	}
}
