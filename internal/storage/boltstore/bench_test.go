package boltstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func benchStore(b *testing.B) *Store {
	b.Helper()
	s, err := Open(Config{Path: filepath.Join(b.TempDir(), "bench.db")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// benchResource is a MeshTimeout of realistic size (~300 bytes of spec);
// seq goes into the spec so that every write is a real change.
func benchResource(name int, seq int) *resource.Resource {
	return &resource.Resource{
		Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("timeout-%05d", name),
		Labels: resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal, "team": "payments"}),
		Spec: fmt.Appendf(nil, `{"targetRef":{"kind":"MeshService","name":"backend-%d"},"to":[{"targetRef":{"kind":"Mesh"},`+
			`"default":{"connectionTimeout":"5s","idleTimeout":"1h","http":{"requestTimeout":"15s","streamIdleTimeout":"30m",`+
			`"maxStreamDuration":"0s","maxConnectionDuration":"0s"}}}],"seq":%d}`, name, seq),
	}
}

func BenchmarkPut(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	n := 0
	for b.Loop() {
		if _, _, err := s.Put(ctx, benchResource(n%10000, n)); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "puts/s")
}

// BenchmarkPutConcurrent8 is BENCHMARKS.md's "8 clients" write load: eight
// goroutines each doing single Puts, sharing commits through the group
// committer.
func BenchmarkPutConcurrent8(b *testing.B) {
	const clients = 8
	s := benchStore(b)
	ctx := context.Background()
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > b.N {
					return
				}
				if _, _, err := s.Put(ctx, benchResource(i%10000, i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
}

func BenchmarkApply1000(b *testing.B) {
	const size = 1000
	s := benchStore(b)
	ctx := context.Background()
	n := 0
	for b.Loop() {
		batch := storage.Batch{Puts: make([]*resource.Resource, size)}
		for j := range batch.Puts {
			batch.Puts[j] = benchResource((n*size+j)%10000, n)
		}
		if _, err := s.Apply(ctx, batch); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(n*size)/b.Elapsed().Seconds(), "resources/s")
}

func BenchmarkList10000(b *testing.B) {
	const total = 10000
	s := benchStore(b)
	ctx := context.Background()
	for i := 0; i < total; i += 1000 {
		batch := storage.Batch{}
		for j := i; j < i+1000; j++ {
			batch.Puts = append(batch.Puts, benchResource(j, 0))
		}
		if _, err := s.Apply(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("all", func(b *testing.B) {
		for b.Loop() {
			res, err := s.List(ctx, storage.ListOptions{Type: "MeshTimeout", Mesh: "default"})
			if err != nil || len(res.Items) != total {
				b.Fatalf("list: %d items, %v", len(res.Items), err)
			}
		}
	})
	// A label selector that matches nothing: what the global's sync does
	// to find a zone's own resources among the global's (a zone's full
	// snapshot), and a filtered API list.
	b.Run("labels-no-match", func(b *testing.B) {
		for b.Loop() {
			res, err := s.List(ctx, storage.ListOptions{Type: "MeshTimeout",
				Labels: map[string]string{resource.LabelOrigin: resource.OriginZone, resource.LabelZone: "zone-1"}})
			if err != nil || len(res.Items) != 0 {
				b.Fatalf("list: %d items, %v", len(res.Items), err)
			}
		}
	})
}

// BenchmarkApplyCold100000 is a cold zone's full snapshot: 100,000
// resources in one batch into an empty store, in the order given.
func BenchmarkApplyCold100000(b *testing.B) {
	const size = 100000
	for _, order := range []string{"sorted", "shuffled"} {
		b.Run(order, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				b.StopTimer()
				s := benchStore(b)
				batch := storage.Batch{Puts: make([]*resource.Resource, size), Owned: true} // as a zone applies it
				for j := range batch.Puts {
					batch.Puts[j] = benchResource(j, 0)
				}
				if order == "shuffled" {
					rand.New(rand.NewPCG(1, 2)).Shuffle(size, func(i, j int) { batch.Puts[i], batch.Puts[j] = batch.Puts[j], batch.Puts[i] })
				}
				b.StartTimer()
				if _, err := s.Apply(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
