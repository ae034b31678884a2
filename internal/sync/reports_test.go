package sync

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/sync/mapping"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

func TestReportsReplacePerZone(t *testing.T) {
	var r reports
	report := func(reason string, names ...string) *syncv1.PolicyStatusReport {
		rep := &syncv1.PolicyStatusReport{}
		for _, n := range names {
			rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: n},
				Conditions: []*syncv1.Condition{{Type: "Enforced", Status: "True", Reason: reason}}})
		}
		return rep
	}
	r.set("zone-2", report("Enforced", "a", "b"))
	r.set("zone-1", report("PartiallyEnforced", "a"))
	got := r.get("MeshTimeout", "default", "a")
	if len(got) != 2 || got[0].Zone != "zone-1" || got[0].Conditions[0].Reason != "PartiallyEnforced" || got[1].Zone != "zone-2" {
		t.Fatalf("a: %+v", got)
	}
	r.set("zone-2", report("Enforced")) // an empty report clears zone-2's
	if got := r.get("MeshTimeout", "default", "b"); len(got) != 0 {
		t.Fatalf("b after zone-2's empty report: %+v", got)
	}
}

// bigReporter reports n statuses once.
type bigReporter struct{ n int }

func (r bigReporter) PolicyStatusReport() (*syncv1.PolicyStatusReport, <-chan struct{}) {
	rep := &syncv1.PolicyStatusReport{}
	for i := range r.n {
		rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{
			Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: "policy-" + itoa(i)},
			Conditions: []*syncv1.Condition{
				{Type: "Accepted", Status: "True", Reason: "Accepted", Message: "the policy is valid and its references resolve"},
				{Type: "Enforced", Status: "True", Reason: "Enforced", Message: "the policy applies to at least one Dataplane"},
			}})
	}
	return rep, make(chan struct{})
}

// TestLargeStatusReportArrivesInChunks: a zone holding many of the global's
// policies reports more than a gRPC message may carry (100,000 policies
// make ~20 MB); the report travels in chunks and takes effect whole. A
// single message this size used to break the stream at every connection,
// so nothing the zone wrote reached the global any more.
func TestLargeStatusReportArrivesInChunks(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	const n = 40000 // ~6 MB: over gRPC's 4 MiB default receive limit
	z := c.zone("zone-1", zoneOpts{reporter: bigReporter{n: n}}).start()
	eventually(t, wait, "connected", z.connected)
	eventually(t, wait, "the whole report on the global", func() bool {
		first := c.server.PolicyStatuses("MeshTimeout", "default", "policy-0")
		last := c.server.PolicyStatuses("MeshTimeout", "default", "policy-"+itoa(n-1))
		return len(first) == 1 && len(last) == 1
	})
	writeZone(t, z.store, "zone-1", timeout("after-report", "", ""))
	eventually(t, wait, "the zone's writes still reach the global", func() bool {
		return exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "after-report", "zone-1"))
	})
}

func TestChunkReport(t *testing.T) {
	rep, _ := bigReporter{n: 1000}.PolicyStatusReport()
	chunks := chunkReport(rep, 16<<10)
	total := 0
	for i, ch := range chunks {
		total += len(ch.GetStatuses())
		if ch.GetMore() != (i < len(chunks)-1) {
			t.Errorf("chunk %d of %d: more=%v", i, len(chunks), ch.GetMore())
		}
		if size := proto.Size(ch); size > 16<<10 {
			t.Errorf("chunk %d is %d bytes", i, size)
		}
	}
	if total != 1000 || len(chunks) < 2 {
		t.Errorf("%d statuses in %d chunks", total, len(chunks))
	}
	if got := chunkReport(&syncv1.PolicyStatusReport{}, 1024); len(got) != 1 || got[0].GetMore() {
		t.Errorf("an empty report: %v", got)
	}
}
