package policy

import (
	"fmt"
	"reflect"
	"testing"
)

func TestRefTableSharesOnlyPlainRefs(t *testing.T) {
	tests := []struct {
		name   string
		a, b   targetRef
		shared bool
	}{
		{"equal kinds", targetRef{Kind: "Mesh"}, targetRef{Kind: "Mesh"}, true},
		{"equal names", targetRef{Kind: "MeshService", Name: "a", Namespace: "ns"}, targetRef{Kind: "MeshService", Name: "a", Namespace: "ns"}, true},
		{"other section", targetRef{Kind: "MeshService", Name: "a", SectionName: "http"}, targetRef{Kind: "MeshService", Name: "a"}, false},
		{"other mesh", targetRef{Kind: "MeshService", Name: "a", Mesh: "m"}, targetRef{Kind: "MeshService", Name: "a"}, false},
		{"labels", targetRef{Kind: "Dataplane", Labels: map[string]string{"a": "b"}}, targetRef{Kind: "Dataplane", Labels: map[string]string{"a": "b"}}, false},
		{"empty labels are not absent", targetRef{Kind: "Dataplane", Labels: map[string]string{}}, targetRef{Kind: "Dataplane"}, false},
		{"tags", targetRef{Kind: "MeshSubset", Tags: map[string]string{"a": "b"}}, targetRef{Kind: "MeshSubset", Tags: map[string]string{"a": "b"}}, false},
		{"proxy types", targetRef{Kind: "Mesh", ProxyTypes: []string{"Sidecar"}}, targetRef{Kind: "Mesh", ProxyTypes: []string{"Sidecar"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs := newRefTable()
			a, b := refs.intern(tt.a), refs.intern(tt.b)
			// The interned ref carries its tags as a sorted list too.
			for _, r := range []*targetRef{&tt.a, &tt.b} {
				if len(r.Tags) > 0 {
					r.tags = tagList(r.Tags)
				}
			}
			if !reflect.DeepEqual(*a, tt.a) || !reflect.DeepEqual(*b, tt.b) {
				t.Fatalf("interned %+v, %+v; want %+v, %+v", *a, *b, tt.a, tt.b)
			}
			if (a == b) != tt.shared {
				t.Errorf("shared = %v, want %v", a == b, tt.shared)
			}
		})
	}
}

func TestRefTableIsBounded(t *testing.T) {
	refs := newRefTable()
	first := refs.intern(targetRef{Kind: "Mesh"})
	for i := range maxSharedRefs + 10 {
		refs.intern(targetRef{Kind: "MeshService", Name: fmt.Sprint(i)})
	}
	if n := len(refs.m); n > maxSharedRefs {
		t.Fatalf("table holds %d refs, more than %d", n, maxSharedRefs)
	}
	if !reflect.DeepEqual(*first, targetRef{Kind: "Mesh"}) {
		t.Fatalf("a ref handed out before the table started afresh changed: %+v", *first)
	}
}
