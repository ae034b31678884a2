package kds

import (
	"fmt"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestBatchBuilderKeepsTheLastChangePerKey: small batches (searched in
// order) and large ones (indexed past smallBatchEntries) keep each key once,
// in first-seen order, with its last change and the batch size adjusted.
func TestBatchBuilderKeepsTheLastChangePerKey(t *testing.T) {
	for _, distinct := range []int{1, smallBatchEntries, smallBatchEntries + 1, 40} {
		t.Run(fmt.Sprint(distinct), func(t *testing.T) {
			b := newBatchBuilder()
			key := func(i int) resource.Key {
				return resource.Key{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprint("t", i)}
			}
			wantSize := 0
			for i := range distinct {
				b.add(entry{wireKey: key(i), size: 10})
				wantSize += 10
			}
			// Rewrite the first, the last and (for large batches) one in
			// the middle; the latest size counts.
			for _, i := range []int{0, distinct - 1, distinct / 2} {
				b.add(entry{wireKey: key(i), size: 100 + i})
			}
			last := map[int]int{}
			for _, i := range []int{0, distinct - 1, distinct / 2} {
				last[i] = 100 + i
			}
			wantSize = 0
			for i := range distinct {
				if s, ok := last[i]; ok {
					wantSize += s
				} else {
					wantSize += 10
				}
			}
			if b.len() != distinct || b.size != wantSize {
				t.Fatalf("%d entries of size %d, want %d of %d", b.len(), b.size, distinct, wantSize)
			}
			for i, e := range b.entries {
				want := 10
				if s, ok := last[i]; ok {
					want = s
				}
				if e.wireKey != key(i) || e.size != want {
					t.Fatalf("entry %d: %v size %d, want %v size %d", i, e.wireKey, e.size, key(i), want)
				}
			}
			if got := b.build(); len(got.Upserts)+len(got.Removals) != distinct || b.len() != 0 || b.index != nil || b.size != 0 {
				t.Fatalf("build: %d upserts and removals, want %d; builder left with %d entries", len(got.Upserts)+len(got.Removals), distinct, b.len())
			}
		})
	}
}
