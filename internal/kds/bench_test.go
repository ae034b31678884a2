package kds

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// BenchmarkZoneSinkUpsert: the zone's per-resource cost of receiving a
// global policy (validation, authority check, mapping).
func BenchmarkZoneSinkUpsert(b *testing.B) {
	st := openStore(b, filepath.Join(b.TempDir(), "z.db"), storeOpts{})
	defer st.Close()
	sink := zoneSink{reg: testRegistry, store: st, zone: zonePlane("zone-1", plane.EnvKubernetes)}
	r := timeout("default-timeout-global", "", "")
	r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: "global", resource.LabelPolicyRole: "system"})
	d, _ := testRegistry.Lookup("MeshTimeout")
	w := toWire(mapping.ToZone(d, r))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sink.upsert(ctx, w); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidate(b *testing.B) {
	r := timeout("default-timeout-global", "", "")
	b.ReportAllocs()
	for b.Loop() {
		_ = testRegistry.Validate(r, zonePlane("zone-1", plane.EnvKubernetes))
	}
}

func BenchmarkGet(b *testing.B) {
	st := openStore(b, filepath.Join(b.TempDir(), "z.db"), storeOpts{})
	defer st.Close()
	put(b, st, timeout("x", "", ""))
	key := resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "x"}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = st.Get(context.Background(), key)
	}
}

// BenchmarkFanOutOneChange: the global's cost of turning one changed policy
// into the entries of 100 zone sessions, mapping per session (before) or
// once for all of them (zoneCopies).
func BenchmarkFanOutOneChange(b *testing.B) {
	r := timeout("default-timeout-global", "", "")
	r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: "global", resource.LabelPolicyRole: "system"})
	for _, shared := range []bool{false, true} {
		name := "per-session"
		var copies *zoneCopies
		if shared {
			name, copies = "shared", newZoneCopies()
		}
		b.Run(name, func(b *testing.B) {
			outs := make([]*outbound, 100)
			for i := range outs {
				outs[i] = &outbound{src: globalSource{reg: testRegistry, zone: "zone-" + itoa(i), copies: copies},
					pending: newBatchBuilder()}
			}
			b.ReportAllocs()
			version := uint64(0)
			for b.Loop() {
				version++
				r.Version = version // a new version: the first session maps it
				for _, o := range outs {
					send, _ := o.src.put(r)
					o.pending.add(putEntry(r.Key(), send))
					_ = o.pending.build() // the batch a session sends for one change
				}
			}
		})
	}
}

// BenchmarkStageSnapshot100000: a cold zone staging a full snapshot of
// 100,000 resources (batchSet.add per resource) before it applies them.
func BenchmarkStageSnapshot100000(b *testing.B) {
	const n = 100000
	rs := make([]*resource.Resource, n)
	wires := make([]*syncv1.ResourceKey, n)
	for i := range rs {
		rs[i] = timeout("t-"+strconv.Itoa(i), "", "")
		wires[i] = keyToWire(rs[i].Key())
	}
	b.ReportAllocs()
	for b.Loop() {
		var set batchSet
		for i, r := range rs {
			set.add(r, wires[i])
		}
		if !set.has(rs[n-1].Key()) {
			b.Fatal("last resource not staged")
		}
	}
}
