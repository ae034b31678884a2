package policy

import (
	"slices"
	"sort"
)

// A splicing is a sorted list of a previous snapshot with some items
// removed and some fresh ones merged in, described so that every list
// parallel to it (selection summaries) and every kept item's new position
// follow without reading the kept items again: a build from changes
// touches what changed, not the 100,000 policies around it.
type splicing struct {
	n       int   // the old list's length
	removed []int // old indexes removed, ascending and distinct
	// ins are the fresh items' places among the kept items: fresh item j
	// goes right before kept item ins[j] (len(kept): at the end); ascending.
	ins []int
}

// spliceSorted removes the old items at removed (ascending, distinct) and
// merges fresh (sorted by compare) in, kept items first on ties, comparing
// fresh items with kept ones only along binary searches.
func spliceSorted[T any](old []T, removed []int, fresh []T, compare func(T, T) int) ([]T, splicing) {
	sp := splicing{n: len(old), removed: removed, ins: make([]int, len(fresh))}
	kept := keepOf(sp, old)
	lo := 0
	for j, v := range fresh {
		lo += sort.Search(len(kept)-lo, func(i int) bool { return compare(v, kept[lo+i]) < 0 })
		sp.ins[j] = lo
	}
	return layout(sp, kept, fresh), sp
}

// keepOf returns old (a list sp describes) without the removed items, as a
// new slice.
func keepOf[T any](sp splicing, old []T) []T {
	kept := make([]T, 0, len(old)-len(sp.removed))
	from := 0
	for _, r := range sp.removed {
		kept = append(kept, old[from:r]...)
		from = r + 1
	}
	return append(kept, old[from:]...)
}

// layout merges fresh into kept at sp's places.
func layout[T any](sp splicing, kept, fresh []T) []T {
	out := make([]T, 0, len(kept)+len(fresh))
	from := 0
	for j, at := range sp.ins {
		out = append(append(out, kept[from:at]...), fresh[j])
		from = at
	}
	return append(out, kept[from:]...)
}

// spliceParallel lays out a list parallel to the one sp describes: old's
// kept items and fresh's items where their counterparts went.
func spliceParallel[T any](sp splicing, old, fresh []T) []T {
	return layout(sp, keepOf(sp, old), fresh)
}

// newIndex is where the kept old item i went.
func (sp splicing) newIndex(i int) int {
	k := i - sort.SearchInts(sp.removed, i) // kept items before it
	return k + sort.Search(len(sp.ins), func(j int) bool { return sp.ins[j] > k })
}

// freshIndex is where fresh item j went.
func (sp splicing) freshIndex(j int) int { return sp.ins[j] + j }

// isFresh reports whether the new list's item at i is a fresh one.
func (sp splicing) isFresh(i int) bool {
	j := sort.Search(len(sp.ins), func(j int) bool { return sp.freshIndex(j) >= i })
	return j < len(sp.ins) && sp.freshIndex(j) == i
}

// moved calls visit for every kept old index whose item changed position.
// The shift is constant between removed items and insertion places, so it
// is computed once per stretch; stretches that keep their place are not
// walked.
func (sp splicing) moved(visit func(i int)) {
	cuts := []int{0, sp.n}
	for _, r := range sp.removed {
		cuts = append(cuts, r, r+1)
	}
	for _, at := range sp.ins {
		cuts = append(cuts, sp.oldOfKept(at))
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	for c := 0; c+1 < len(cuts); c++ {
		from, to := cuts[c], cuts[c+1]
		if _, gone := slices.BinarySearch(sp.removed, from); gone {
			continue // a stretch of one removed item
		}
		if sp.newIndex(from) == from {
			continue
		}
		for i := from; i < to; i++ {
			visit(i)
		}
	}
}

// oldOfKept is the old index of kept item k (n when k is past the last).
func (sp splicing) oldOfKept(k int) int {
	i := k
	for _, r := range sp.removed {
		if r <= i {
			i++
		}
	}
	return min(i, sp.n)
}
