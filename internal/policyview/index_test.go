package policyview

import (
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestResourceIndexCounts: the count a mesh's pending-changes bound reads
// follows puts, overwrites and removals, and lookups find by the whole key.
func TestResourceIndexCounts(t *testing.T) {
	r := func(typ, ns, name string) *resource.Resource {
		return &resource.Resource{Type: typ, Mesh: "default", Namespace: ns, Name: name}
	}
	x := resourceIndex{byType: map[string]map[nameKey]*resource.Resource{}}
	a, a2, b, c := r("MeshTimeout", "", "a"), r("MeshTimeout", "", "a"), r("MeshTimeout", "ns", "a"), r("MeshRetry", "", "a")
	steps := []struct {
		name  string
		do    func()
		count int
	}{
		{"put a", func() { x.put(a) }, 1},
		{"put a again (a new version)", func() { x.put(a2) }, 1},
		{"same name, other namespace", func() { x.put(b) }, 2},
		{"same name, other type", func() { x.put(c) }, 3},
		{"remove an absent key", func() { x.remove(resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "zz"}) }, 3},
		{"remove an absent type", func() { x.remove(resource.Key{Type: "MeshRateLimit", Mesh: "default", Name: "a"}) }, 3},
		{"remove b", func() { x.remove(b.Key()) }, 2},
	}
	for _, s := range steps {
		s.do()
		if x.count != s.count {
			t.Fatalf("after %s: count %d, want %d", s.name, x.count, s.count)
		}
	}
	if got := x.get(a.Key()); got != a2 {
		t.Errorf("get(a) = %p, want the latest version %p", got, a2)
	}
	if got := x.get(b.Key()); got != nil {
		t.Errorf("get(b) after removal = %v", got)
	}
	if got := x.get(c.Key()); got != c {
		t.Errorf("get(c) = %v", got)
	}
	x.remove(c.Key())
	if _, ok := x.byType["MeshRetry"]; ok {
		t.Error("an emptied type keeps its map")
	}
}
