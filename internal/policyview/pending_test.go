package policyview

import (
	"slices"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestPendingChanges: before a mesh's first build its pending changes are
// every resource (a delete forgets one); a build takes them all, and from
// then on they are changes against that build's snapshot: puts, and deletes
// kept as keys.
func TestPendingChanges(t *testing.T) {
	r := func(name string) *resource.Resource {
		return &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name}
	}
	m := meshOf(map[string]*meshState{}, "default")
	a, b, b2, c := r("a"), r("b"), r("b"), r("c")
	m.note(a.Key(), a)
	m.note(b.Key(), b)
	m.note(c.Key(), c)
	m.note(c.Key(), nil)
	first := m.takeInputs()
	if first.changes != nil || first.prev != nil {
		t.Fatalf("the first build is from changes: %+v", first)
	}
	if got := names(first.resources); got != "a,b" {
		t.Fatalf("the first build's resources: %s, want a,b", got)
	}
	m.snapshot = nil // as if built: what matters is that pending is no longer whole
	m.note(b.Key(), b2)
	m.note(a.Key(), nil)
	m.note(c.Key(), c)
	m.note(c.Key(), nil)
	next := m.takeInputs()
	if next.changes == nil || next.resources != nil {
		t.Fatalf("the second build is not from changes: %+v", next)
	}
	if got := names(next.changes.Put); got != "b" || next.changes.Put[0] != b2 {
		t.Errorf("put: %s, want the new b", got)
	}
	var deleted []string
	for _, k := range next.changes.Deleted {
		deleted = append(deleted, k.Name)
	}
	slices.Sort(deleted)
	if got := strings.Join(deleted, ","); got != "a,c" {
		t.Errorf("deleted: %s, want a,c (c may never have been built: the snapshot ignores it)", got)
	}
	if len(m.pending) != 0 || m.whole {
		t.Errorf("after a build: %d pending, whole %v", len(m.pending), m.whole)
	}
}

func names(rs []*resource.Resource) string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
