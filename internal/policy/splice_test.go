package policy

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSpliceSorted: against filtering and a stable merge, over random
// lists with many equal keys: the new list, every kept item's new index,
// every fresh item's, which items moved, and parallel lists.
func TestSpliceSorted(t *testing.T) {
	t.Parallel()
	type item struct{ key, id int }
	compare := func(a, b item) int { return cmp.Compare(a.key, b.key) }
	rng := rand.New(rand.NewPCG(3, 5))
	for round := 0; round < 2000; round++ {
		n := rng.IntN(30)
		if round%10 == 0 {
			n = rng.IntN(300) // many removed and fresh items
		}
		old := make([]item, n)
		for i := range old {
			old[i] = item{rng.IntN(10), i}
		}
		slices.SortStableFunc(old, compare)
		var removed []int
		for i := range old {
			if rng.IntN(4) == 0 {
				removed = append(removed, i)
			}
		}
		fresh := make([]item, rng.IntN(6+n/10))
		for j := range fresh {
			fresh[j] = item{rng.IntN(10), 1000 + j}
		}
		slices.SortStableFunc(fresh, compare)

		var want []item
		for i, v := range old {
			if !slices.Contains(removed, i) {
				want = append(want, v)
			}
		}
		want = append(want, fresh...) // kept first on ties: a stable sort of kept then fresh
		slices.SortStableFunc(want, compare)

		got, sp := spliceSorted(old, removed, fresh, compare)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: got %v, want %v", round, got, want)
		}
		moved := map[int]bool{}
		sp.moved(func(i int) { moved[i] = true })
		for i, v := range old {
			if slices.Contains(removed, i) {
				if moved[i] {
					t.Fatalf("round %d: removed %d reported moved", round, i)
				}
				continue
			}
			at := sp.newIndex(i)
			if at >= len(got) || got[at] != v {
				t.Fatalf("round %d: newIndex(%d) = %d, not where %v is in %v", round, i, at, v, got)
			}
			if moved[i] != (at != i) {
				t.Fatalf("round %d: item %d now at %d, moved %v", round, i, at, moved[i])
			}
		}
		for j, v := range fresh {
			at := sp.freshIndex(j)
			if got[at] != v || !sp.isFresh(at) {
				t.Fatalf("round %d: freshIndex(%d) = %d, not where %v is in %v", round, j, at, v, got)
			}
		}
		fresh0 := 0
		for i := range got {
			if sp.isFresh(i) {
				fresh0++
			}
		}
		if fresh0 != len(fresh) {
			t.Fatalf("round %d: %d positions fresh, want %d", round, fresh0, len(fresh))
		}
		ids := spliceParallel(sp, func() []int {
			out := make([]int, len(old))
			for i, v := range old {
				out[i] = v.id
			}
			return out
		}(), func() []int {
			out := make([]int, len(fresh))
			for j, v := range fresh {
				out[j] = v.id
			}
			return out
		}())
		for i, v := range got {
			if ids[i] != v.id {
				t.Fatalf("round %d: parallel list %v, want the ids of %v", round, ids, got)
			}
		}
	}
}
