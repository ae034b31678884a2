package sync

import (
	"testing"

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
