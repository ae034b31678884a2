package kds

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// storedGlobal is the global's stored MeshTimeout name, version 1, with the
// labels a policy written on the global carries.
func storedGlobal(i int) *resource.Resource {
	r := stored(timeout(fmt.Sprintf("t-%06d", i), "", ""), 1)
	r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal, resource.LabelPolicyRole: resource.RoleSystem})
	return r
}

// BenchmarkZoneCopiesHeap100000 reports the heap the global's zone copies
// of 100,000 MeshTimeouts hold (heap-MiB, after a GC; run with -benchtime
// 1x): what a global holding 100,000 policies keeps for its zone sessions
// whatever their number.
func BenchmarkZoneCopiesHeap100000(b *testing.B) {
	const n = 100000
	d, _ := testRegistry.Lookup("MeshTimeout")
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		rs := make([]*resource.Resource, n)
		for i := range rs {
			rs[i] = storedGlobal(i)
		}
		copies := newZoneCopies()
		for _, r := range rs {
			copies.toZone(d, r)
		}
		rs = nil // the store's resources are not the cache's to keep
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		runtime.KeepAlive(copies)
	}
}
