package policy

import (
	"cmp"
	"slices"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Ordering (docs/policy.md#ordering). Everything sorts ascending: the later item is the
// more specific one and wins the merge.

// kindRank orders targetRef kinds as Kuma 2.14 does: Mesh < Dataplane <
// MeshSubset < MeshGateway < MeshService < MeshServiceSubset <
// MeshHTTPRoute. A MeshExternalService or MeshMultiZoneService entry names
// one destination like a MeshService and ranks with it (an outbound is one
// of the three, so their relative order never decides a merge).
func kindRank(kind string) int {
	switch kind {
	case resource.KindMesh:
		return 0
	case resource.KindDataplane:
		return 1
	case resource.KindMeshSubset:
		return 2
	case resource.KindMeshGateway:
		return 3
	case resource.KindMeshService, resource.KindMeshExternalService, resource.KindMeshMultiZoneService:
		return 4
	case resource.KindMeshServiceSubset:
		return 5
	case resource.KindMeshHTTPRoute:
		return 6
	}
	return 0
}

// entryKindRank orders to/from entries by their own targetRef (Kuma's
// CompareByToEntry): by kind, and among MeshService entries one naming a
// port (sectionName) after one naming the whole service.
func entryKindRank(ref *targetRef) int {
	r := 2 * kindRank(ref.Kind)
	if ref.Kind == resource.KindMeshService && ref.SectionName != "" {
		r++
	}
	return r
}

// compareDataplaneRefs orders two top-level Dataplane targetRefs (Kuma's
// CompareDataplaneKind): by labels < by name, and without sectionName <
// with it. Any other pair is equal here.
func compareDataplaneRefs(a, b *targetRef) int {
	if a.Kind != resource.KindDataplane || b.Kind != resource.KindDataplane {
		return 0
	}
	byName := func(r *targetRef) bool { return r.Name != "" }
	byLabels := func(r *targetRef) bool { return r.Labels != nil }
	switch {
	case byName(a) && byLabels(b):
		return 1
	case byLabels(a) && byName(b):
		return -1
	}
	return cmp.Compare(boolRank(a.SectionName != ""), boolRank(b.SectionName != ""))
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// roleRank: system < producer < consumer < workload-owner
// (docs/policy.md#ordering: a consumer's namespace beats the producer's,
// which beats the system namespace).
func roleRank(role string) int {
	switch role {
	case resource.RoleProducer:
		return 1
	case resource.RoleConsumer:
		return 2
	case resource.RoleWorkloadOwner:
		return 3
	}
	return 0
}

// comparePolicyLevel compares docs/policy.md#ordering keys 1-3.
func comparePolicyLevel(a, b *policy) int {
	if c := cmp.Compare(kindRank(a.top.Kind), kindRank(b.top.Kind)); c != 0 {
		return c
	}
	if c := compareDataplaneRefs(a.top, b.top); c != 0 {
		return c
	}
	if c := cmp.Compare(a.origin, b.origin); c != 0 {
		return c
	}
	return cmp.Compare(roleRank(a.role), roleRank(b.role))
}

// compareNames is key 4: the lexicographically smaller display name sorts
// later (wins). Display names can tie (the same name in two namespaces or
// zones); the namespace and then the stored name break the tie in the same
// direction so that the order is total and stable across runs.
func compareNames(a, b *policy) int {
	if c := cmp.Compare(b.display, a.display); c != 0 {
		return c
	}
	if c := cmp.Compare(b.ownNS, a.ownNS); c != 0 {
		return c
	}
	if c := cmp.Compare(b.resNS, a.resNS); c != 0 {
		return c
	}
	return cmp.Compare(b.resName, a.resName)
}

func comparePolicies(a, b *policy) int {
	if c := comparePolicyLevel(a, b); c != 0 {
		return c
	}
	return compareNames(a, b)
}

// compareEntries sorts concatenated to/from entries: the policy keys 1-3,
// the entry's own targetRef kind, the policy name (key 4), the array index.
func compareEntries(a, b *entry) int {
	if c := comparePolicyLevel(a.pol, b.pol); c != 0 {
		return c
	}
	if c := cmp.Compare(a.kind, b.kind); c != 0 {
		return c
	}
	if c := compareNames(a.pol, b.pol); c != 0 {
		return c
	}
	return cmp.Compare(a.index, b.index)
}

func sortEntries(es []*entry) { slices.SortStableFunc(es, compareEntries) }

// authority ranks who may override (docs/policy.md#defaults-and-overrides): consumer and workload-owner
// policies (which may not carry overrides) < producer < zone system <
// global system.
func authority(p *policy) int {
	switch {
	case p.origin == originGlobal:
		return 3
	case p.role == resource.RoleSystem:
		return 2
	case p.role == resource.RoleProducer:
		return 1
	}
	return 0
}

// compareOverrides orders override blocks as the overrides pass applies
// them; the last applied wins. Authority first (a global override beats
// everything a zone or namespace writes, whatever its target), then
// specificity reversed, so that among equals the less specific override is
// applied last and wins ("less specific beats more specific"),
// then the name as in docs/policy.md#ordering (the smaller name is applied last), then the
// array index (the later item is applied last). kind is the entry's own
// targetRef rank; proxy-wide blocks pass 0.
func compareOverrides(a, b *policy, aKind, bKind, aIndex, bIndex int) int {
	if c := cmp.Compare(authority(a), authority(b)); c != 0 {
		return c
	}
	if c := cmp.Compare(kindRank(b.top.Kind), kindRank(a.top.Kind)); c != 0 {
		return c
	}
	if c := compareDataplaneRefs(b.top, a.top); c != 0 {
		return c
	}
	if c := cmp.Compare(bKind, aKind); c != 0 {
		return c
	}
	if c := compareNames(a, b); c != 0 {
		return c
	}
	return cmp.Compare(aIndex, bIndex)
}

// overrideOrder lists the entries of es (sorted or not) that have an
// override block in the overrides pass's order: the k-th one's block is
// numbered overrideOrderBase + k, after every default.
func overrideOrder(es []*entry) []*entry {
	var os []*entry
	for _, e := range es {
		if e.o != nil {
			os = append(os, e)
		}
	}
	slices.SortStableFunc(os, func(a, b *entry) int { return compareOverrides(a.pol, b.pol, a.kind, b.kind, a.index, b.index) })
	return os
}

// proxyOverrideOrder lists the policies of ps that have a proxy-wide
// override block in the overrides pass's order (numbered as overrideOrder's).
func proxyOverrideOrder(ps []*policy) []*policy {
	var os []*policy
	for _, p := range ps {
		if p.proxyOver != nil {
			os = append(os, p)
		}
	}
	slices.SortStableFunc(os, func(a, b *policy) int { return compareOverrides(a, b, 0, 0, 0, 0) })
	return os
}

// sortByOrder sorts contributions by their order (the overrides pass's
// order for override blocks).
func sortByOrder(cs []*contribution) {
	slices.SortFunc(cs, func(a, b *contribution) int { return cmp.Compare(a.order, b.order) })
}
