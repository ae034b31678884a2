package policy

import (
	"sync"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// refTable shares equal targetRefs between parsed policies. A targetRef is
// 120 bytes, and each policy kept two or more of them (its top-level one
// and one per entry) although almost all are one of a few values: {kind:
// Mesh}, a MeshService by name. Only refs without labels, tags or proxy
// types are shared (the rest are rare and not comparable cheaply). A
// snapshot passes its table to the snapshot built from it, like shapes.
// Safe for concurrent use; the refs it hands out are never written.
type refTable struct {
	mu sync.Mutex
	m  map[refKey]*targetRef
	// scopes shares the implicit scopes of policies (a zone, with a
	// namespace for consumer and workload-owner policies): equal scopes
	// are then one slice, which matching compares by address first.
	scopes map[scopeKey][]tag
}

type scopeKey struct {
	zone, namespace string
	withNamespace   bool
}

type refKey struct{ kind, name, namespace, mesh, section string }

// maxSharedRefs bounds the table: past it, the table starts afresh (refs
// handed out stay valid; only later ones stop being shared with them), so
// names of services long gone do not accumulate over a zone's life.
const maxSharedRefs = 4096

func newRefTable() *refTable {
	return &refTable{m: map[refKey]*targetRef{}, scopes: map[scopeKey][]tag{}}
}

// scope returns the implicit scope of a policy of zone (and of namespace
// when withNamespace), shared, sorted by key; the caller must not write it.
func (t *refTable) scope(zone, namespace string, withNamespace bool) []tag {
	k := scopeKey{zone, namespace, withNamespace}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.scopes[k]; ok {
		return s
	}
	if len(t.scopes) >= maxSharedRefs {
		t.scopes = make(map[scopeKey][]tag)
	}
	var s []tag
	if withNamespace {
		s = tagList(map[string]string{resource.LabelZone: zone, resource.LabelNamespace: namespace})
	} else {
		s = []tag{{resource.LabelZone, zone}}
	}
	t.scopes[k] = s
	return s
}

// intern returns a ref equal to r that the caller must not write. r is
// copied to the heap only when it is new: taking &r made every call
// allocate (r escaped), 120 bytes of garbage per ref parsed, in the size
// class of the policy structs a build keeps.
func (t *refTable) intern(r targetRef) *targetRef {
	if r.Labels != nil || r.Tags != nil || r.ProxyTypes != nil {
		return heapRef(r)
	}
	k := refKey{kind: r.Kind, name: r.Name, namespace: r.Namespace, mesh: r.Mesh, section: r.SectionName}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.m[k]; ok {
		return p
	}
	if len(t.m) >= maxSharedRefs {
		t.m = make(map[refKey]*targetRef)
	}
	p := heapRef(r)
	t.m[k] = p
	return p
}

func heapRef(r targetRef) *targetRef {
	p := new(targetRef)
	*p = r
	if len(r.Tags) > 0 {
		p.tags = tagList(r.Tags)
	}
	return p
}
