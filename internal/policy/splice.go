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
	kept := func(k int) T { return old[sp.oldOfKept(k)] }
	nKept, lo := len(old)-len(removed), 0
	for j, v := range fresh {
		lo += sort.Search(nKept-lo, func(i int) bool { return compare(v, kept(lo+i)) < 0 })
		sp.ins[j] = lo
	}
	return spliceParallel(sp, old, fresh), sp
}

// spliceParallel lays out a list parallel to the one sp describes: old's
// kept items and fresh's items where their counterparts went, in one pass
// over runs of old.
func spliceParallel[T any](sp splicing, old, fresh []T) []T {
	out := make([]T, 0, len(old)-len(sp.removed)+len(fresh))
	next := 0 // the first removed index not passed yet
	// copyKept appends the kept items of old[from:to].
	copyKept := func(from, to int) {
		for ; next < len(sp.removed) && sp.removed[next] < to; next++ {
			out = append(out, old[from:sp.removed[next]]...)
			from = sp.removed[next] + 1
		}
		out = append(out, old[from:to]...)
	}
	from := 0
	for j, at := range sp.ins {
		to := sp.oldOfKept(at)
		copyKept(from, to)
		out = append(out, fresh[j])
		from = to
	}
	copyKept(from, len(old))
	return out
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

// oldOfKept is the old index of kept item k (n when k is past the last):
// k plus the number m of removed items before it, the smallest m with
// removed[m] - m > k (removed[m] - m never decreases).
func (sp splicing) oldOfKept(k int) int {
	m := sort.Search(len(sp.removed), func(m int) bool { return sp.removed[m]-m > k })
	return min(k+m, sp.n)
}
