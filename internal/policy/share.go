package policy

import (
	"slices"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Sharing unchanged policies with the previous snapshot.
//
// A rebuild after one change used to clone every unchanged policy (clone.go)
// so that it could number it. At 100,000 policies that was 60 MB of new
// structs per rebuild, and renumbering wrote into all of them: most of a
// rebuild, and most of the garbage that made the next collection cycle
// come early. Usually nothing about an unchanged policy differs in the next
// snapshot: its position, its entries' positions and override orders stay
// where they were, and its targets resolve to the same services. Such a
// policy is now held as it is. Published snapshots are read concurrently,
// so a shared struct is never written: the rebuild compares the numbers it
// would write (unshare) and clones only the policies whose numbers change,
// such as those after an inserted one.

// sameEnvironment reports whether unchanged policies can be shared: there is
// a previous snapshot, and what resolving targets and top-level references
// reads (MeshServices, MeshExternalServices, MeshMultiZoneServices,
// MeshGateways, MeshHTTPRoutes) is the very same resources as there (routes:
// the same content, parsedPolicy.holds, or a parse kept as it is). The
// infrastructure is indexed already; policies are the policy resources,
// kept the previous snapshot's parses that stay as they are.
func (b *builder) sameEnvironment(policies []*resource.Resource, kept []keptParse) bool {
	p := b.prevSnap
	if p == nil {
		return false
	}
	s := b.s
	if len(s.services) != len(p.services) || len(s.externals) != len(p.externals) ||
		len(s.multis) != len(p.multis) || len(s.gateways) != len(p.gateways) {
		return false
	}
	for k, ms := range s.services {
		if old := p.services[k]; old == nil || old.res != ms.res {
			return false
		}
	}
	for k, r := range s.externals {
		if p.externals[k] != r {
			return false
		}
	}
	for k, r := range s.multis {
		if p.multis[k] != r {
			return false
		}
	}
	for k, g := range s.gateways {
		if old := p.gateways[k]; old == nil || old.res != g.res {
			return false
		}
	}
	// The routes: every one is a resource the previous snapshot had (kept
	// parses are), and it had no others.
	routes, prevRoutes := 0, 0
	for _, r := range policies {
		if r.Type != "MeshHTTPRoute" {
			continue
		}
		d, _ := b.reg.Lookup(r.Type)
		if prev, ok := b.prev.get(typedName{d, b.normNS(r.Namespace), r.Name}); !ok || !prev.holds(r, b.s.defs) {
			return false
		}
		routes++
	}
	for _, kp := range kept {
		if kp.k.desc.Name == "MeshHTTPRoute" {
			routes++
		}
	}
	if t := p.types["MeshHTTPRoute"]; t != nil {
		prevRoutes = len(t.policies) + len(t.skipped)
	}
	return routes == prevRoutes
}

// unshare clones the shared policies of t whose numbers in this snapshot
// (position, entry positions, override orders) differ from what they hold,
// and puts the clones in their places in t's lists. It also sets t's
// override lists (a clone takes its source's place there: same definition,
// same position). Afterwards every shared policy of t holds exactly the
// numbers this snapshot gives it.
func (b *builder) unshare(t *typeIndex) {
	own := b.own
	moved := map[*policy]bool{}
	for i, p := range t.policies {
		if p.owner != own && p.idx != i {
			moved[p] = true
		}
	}
	t.overTo, t.overFrom = overrideOrder(t.to), overrideOrder(t.from)
	t.overProxy = proxyOverrideOrder(t.policies)
	for _, es := range [][]*entry{t.to, t.from} {
		for i, e := range es {
			if e.pol.owner != own && e.pos != i {
				moved[e.pol] = true
			}
		}
	}
	for _, es := range [][]*entry{t.overTo, t.overFrom} {
		for k, e := range es {
			if e.pol.owner != own && e.o.order != overrideOrderBase+k {
				moved[e.pol] = true
			}
		}
	}
	for k, p := range t.overProxy {
		if p.owner != own && p.proxyOver.order != overrideOrderBase+k {
			moved[p] = true
		}
	}
	if len(moved) == 0 {
		return
	}
	clones := make(map[*entry]*entry)
	policyClones := make(map[*policy]*policy, len(moved))
	for i, p := range t.policies {
		if !moved[p] {
			continue
		}
		c := b.cloneResolved(p)
		t.policies[i] = c
		policyClones[p] = c
		for j, e := range p.to {
			clones[e] = c.to[j]
		}
		for j, e := range p.from {
			clones[e] = c.from[j]
		}
	}
	for _, es := range [][]*entry{t.to, t.from, t.overTo, t.overFrom} {
		for i, e := range es {
			if c, ok := clones[e]; ok {
				es[i] = c
			}
		}
	}
	for i, p := range t.overProxy {
		if c, ok := policyClones[p]; ok {
			t.overProxy[i] = c
		}
	}
}

// cloneResolved clones a shared policy for this snapshot, keeping its
// resolved targets and warnings: sharing implies they resolve the same here
// (sameEnvironment), and both are read-only once resolved. The clone takes
// p's place in the parse table: the next snapshot starts from it.
func (b *builder) cloneResolved(p *policy) *policy {
	c := b.clones.policy(p)
	c.owner = b.own
	c.warnings = slices.Clip(p.warnings)
	for j, e := range p.to {
		c.to[j].target = e.target
	}
	b.s.parses.m.set(typedName{p.desc, b.normNS(p.resNS), p.resName}, parsedPolicy{pol: c})
	return c
}
