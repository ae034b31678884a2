package kds

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func TestSplitBatch(t *testing.T) {
	var b storage.Batch
	for i := range 10 {
		b.Puts = append(b.Puts, &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("p%d", i), Spec: []byte(`{}`)})
	}
	for i := range 5 {
		b.Deletes = append(b.Deletes, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("d%d", i)})
	}
	b.Meta = map[string][]byte{"resume": []byte("7"), "store": []byte("id")}
	b.Owned = true
	big := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: "big", Spec: []byte(`"` + strings.Repeat("x", 5000) + `"`)}
	tests := []struct {
		name      string
		batch     storage.Batch
		limits    storage.Limits
		wantParts int
	}{
		{"no limits: whole", b, storage.Limits{}, 1},
		{"roomy: whole", b, storage.Limits{Ops: 127, Bytes: 1 << 20}, 1},
		{"4 ops per part", b, storage.Limits{Ops: 4}, 5}, // 4+4+4+3 puts and deletes, then the 2 meta alone
		{"bytes bound", storage.Batch{Puts: []*resource.Resource{big, big, big}}, storage.Limits{Ops: 100, Bytes: 8000}, 3},
	}
	for _, tc := range tests {
		parts := splitBatch(tc.batch, tc.limits)
		if len(parts) != tc.wantParts {
			t.Errorf("%s: %d parts, want %d", tc.name, len(parts), tc.wantParts)
		}
		puts, dels := 0, 0
		for i, p := range parts {
			if tc.limits.Ops > 0 && len(p.Puts)+len(p.Deletes)+len(p.Meta) > tc.limits.Ops {
				t.Errorf("%s: part %d has %d ops, limit %d", tc.name, i, len(p.Puts)+len(p.Deletes)+len(p.Meta), tc.limits.Ops)
			}
			if p.Meta != nil && i != len(parts)-1 {
				t.Errorf("%s: meta in part %d of %d (the resume point must come last)", tc.name, i, len(parts))
			}
			if p.Owned != tc.batch.Owned {
				t.Errorf("%s: part %d Owned %v, the batch's %v", tc.name, i, p.Owned, tc.batch.Owned)
			}
			if len(p.Puts) > 0 && dels > 0 {
				t.Errorf("%s: puts after deletes", tc.name)
			}
			puts, dels = puts+len(p.Puts), dels+len(p.Deletes)
		}
		if puts != len(tc.batch.Puts) || dels != len(tc.batch.Deletes) || parts[len(parts)-1].Meta == nil && tc.batch.Meta != nil {
			t.Errorf("%s: %d puts %d deletes after splitting, want %d and %d, meta last", tc.name, puts, dels, len(tc.batch.Puts), len(tc.batch.Deletes))
		}
	}
}
