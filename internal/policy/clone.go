package policy

import "github.com/meridian-mesh/meridian/internal/resource"

// Cloning unchanged policies from the previous snapshot.
//
// A parsed policy is mostly a function of its resource: policyDef,
// entryDef and contributionDef (decoded confs, effective targetRef, scope,
// client tags, origins and their encoded metadata) are shared by every
// snapshot that holds the same version of the resource. A snapshot also
// keeps its own state: positions in the sorted lists (idx, pos, order),
// resolved to-targets and the warnings resolving produced. When that state
// would not change, the next snapshot holds the policy as it is (share.go).
// Otherwise it cannot renumber the previous snapshot's structs (published
// snapshots are immutable and queried concurrently); it makes small new
// ones around the shared definitions. That is far cheaper than parsing
// again (a dozen small objects per policy, which dominated rebuilds at
// 10,000 policies), and the arena below allocates them in chunks, so a
// rebuild leaves the garbage collector a few hundred objects instead of
// tens of thousands.

// cloneChunk is how many values one arena allocation holds.
const cloneChunk = 256

// chunks hands out values of T from slices allocated cloneChunk at a time.
// The values of one chunk live as long as any of them is referenced; they
// all belong to one snapshot, which is what keeps them.
type chunks[T any] struct{ free []T }

func (c *chunks[T]) one() *T {
	if len(c.free) == 0 {
		c.free = make([]T, cloneChunk)
	}
	v := &c.free[0]
	c.free = c.free[1:]
	return v
}

// many returns n zero values as one slice (capacity n: appending copies).
func (c *chunks[T]) many(n int) []T {
	if n == 0 {
		return nil
	}
	if n > cloneChunk/4 {
		return make([]T, n)
	}
	if len(c.free) < n {
		c.free = make([]T, cloneChunk)
	}
	s := c.free[:n:n]
	c.free = c.free[n:]
	return s
}

// cloneArena is a builder's allocator for cloned policies.
type cloneArena struct {
	policies      chunks[policy]
	entries       chunks[entry]
	entryPtrs     chunks[*entry]
	contributions chunks[contribution]
	// seen maps a contribution of the policy being cloned to its copy:
	// the entries of one rule's matches share a contribution, and the
	// copies must share it too.
	seen []contributionCopy
}

type contributionCopy struct{ from, to *contribution }

// policy returns prev (parsed by an earlier snapshot from a resource with
// the same spec and labels) for this snapshot: resource r, prev's
// definitions, and none of prev's snapshot state. Only reads prev.
func (a *cloneArena) policy(prev *policy, r *resource.Resource) *policy {
	p := a.policies.one()
	*p = policy{policyDef: prev.policyDef, res: r}
	a.seen = a.seen[:0]
	p.to = a.cloneEntries(p, prev.to)
	p.from = a.cloneEntries(p, prev.from)
	p.proxy = a.contribution(p, prev.proxy)
	p.proxyOver = a.contribution(p, prev.proxyOver)
	p.legacyConf = a.contribution(p, prev.legacyConf)
	return p
}

func (a *cloneArena) cloneEntries(p *policy, prev []*entry) []*entry {
	out := a.entryPtrs.many(len(prev))
	for i, pe := range prev {
		e := a.entries.one()
		*e = entry{entryDef: pe.entryDef, pol: p, c: a.contribution(p, pe.c), o: a.contribution(p, pe.o)}
		out[i] = e
	}
	return out
}

func (a *cloneArena) contribution(p *policy, prev *contribution) *contribution {
	if prev == nil {
		return nil
	}
	for _, cc := range a.seen {
		if cc.from == prev {
			return cc.to
		}
	}
	c := a.contributions.one()
	*c = contribution{contributionDef: prev.contributionDef, pol: p, plain: prev.plain}
	a.seen = append(a.seen, contributionCopy{prev, c})
	return c
}
