package policy

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
// 10,000 policies).
//
// A clone's structs are allocated per policy: the policy, and one array
// each of its entries, their pointers and its contributions, four objects
// whatever its size. They used to come from chunks of 256 values shared by
// the policies of one build, which left fewer objects still, but a chunk
// lives as long as any of its values: once later builds had cloned some of
// a chunk's policies again, or replaced them, the rest kept it all alive.
// Over 500 changes that each moved most of 100,000 policies, the heap grew
// from 166 to 552 MiB; per policy it stays at the size of a fresh build.

// cloneArena clones policies for one build. Owned by the build.
type cloneArena struct {
	// seen maps a contribution of the policy being cloned to its copy:
	// the entries of one rule's matches share a contribution, and the
	// copies must share it too.
	seen []contributionCopy
}

type contributionCopy struct{ from, to *contribution }

// policy returns prev (parsed by an earlier snapshot from the same
// resource) for this snapshot: prev's resource and definitions, and none
// of prev's snapshot state. Only reads prev.
func (a *cloneArena) policy(prev *policy) *policy {
	p := &policy{policyDef: prev.policyDef}
	a.seen = a.seen[:0]
	n := len(prev.to) + len(prev.from)
	ptrs, entries := make([]*entry, n), make([]entry, n)
	contribs := make([]contribution, a.distinctContributions(prev))
	p.to = a.cloneEntries(p, prev.to, ptrs[:len(prev.to):len(prev.to)], entries, &contribs)
	p.from = a.cloneEntries(p, prev.from, ptrs[len(prev.to):], entries[len(prev.to):], &contribs)
	p.proxy = a.contribution(p, prev.proxy, &contribs)
	p.proxyOver = a.contribution(p, prev.proxyOver, &contribs)
	p.legacyConf = a.contribution(p, prev.legacyConf, &contribs)
	return p
}

// distinctContributions counts prev's contributions, each shared one once;
// it leaves seen empty.
func (a *cloneArena) distinctContributions(prev *policy) int {
	count := func(c *contribution) {
		if c == nil {
			return
		}
		for _, cc := range a.seen {
			if cc.from == c {
				return
			}
		}
		a.seen = append(a.seen, contributionCopy{from: c})
	}
	for _, list := range [][]*entry{prev.to, prev.from} {
		for _, e := range list {
			count(e.c)
			count(e.o)
		}
	}
	count(prev.proxy)
	count(prev.proxyOver)
	count(prev.legacyConf)
	n := len(a.seen)
	a.seen = a.seen[:0]
	return n
}

// cloneEntries clones prev into out, taking the entries from entries and
// the contributions from the front of *contribs.
func (a *cloneArena) cloneEntries(p *policy, prev, out []*entry, entries []entry, contribs *[]contribution) []*entry {
	if len(prev) == 0 {
		return nil
	}
	for i, pe := range prev {
		e := &entries[i]
		*e = entry{entryDef: pe.entryDef, pol: p, c: a.contribution(p, pe.c, contribs), o: a.contribution(p, pe.o, contribs)}
		out[i] = e
	}
	return out
}

func (a *cloneArena) contribution(p *policy, prev *contribution, contribs *[]contribution) *contribution {
	if prev == nil {
		return nil
	}
	for _, cc := range a.seen {
		if cc.from == prev {
			return cc.to
		}
	}
	c := &(*contribs)[0]
	*contribs = (*contribs)[1:]
	*c = contribution{contributionDef: prev.contributionDef, pol: p, plain: prev.plain}
	a.seen = append(a.seen, contributionCopy{prev, c})
	return c
}
