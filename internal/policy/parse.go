package policy

import (
	"fmt"
	"sort"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// targetRef is a decoded targetRef (docs/policy.md#selection).
type targetRef struct {
	Kind        string            `json:"kind"`
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels"`
	Tags        map[string]string `json:"tags"`
	Mesh        string            `json:"mesh"`
	SectionName string            `json:"sectionName"`
	ProxyTypes  []string          `json:"proxyTypes"`

	// tags are Tags as a slice sorted by key (matching runs per policy per
	// proxy), set when the ref is made (refTable.intern).
	tags []tag
}

// policy is a policy resource as one snapshot holds it: its definition
// (shared by every snapshot holding the same version of the resource) and
// this snapshot's state: position, warnings from resolving references, and
// entries whose positions and targets are this snapshot's.
type policy struct {
	*policyDef
	// owner marks the build that made this struct (parsed or cloned it).
	// A later snapshot may hold it as it is (share.go), but only its own
	// build ever writes it. A mark, not the snapshot: a policy shared for
	// many rebuilds would keep its first snapshot (memos, statuses, lists)
	// alive, 70 MiB at 100,000 policies.
	owner *buildMark
	idx   int // position in its type's sorted policy list

	to    []*entry
	from  []*entry
	proxy *contribution // proxy-wide default (may carry only unset)
	// proxyOver is the proxy-wide override; nil when there is none.
	proxyOver *contribution
	// legacyConf is the conf of a legacy-shaped policy.
	legacyConf *contribution

	// warnings are about references inside the policy; they are reported to
	// the Dataplanes the policy selects.
	warnings []string
}

// policyDef is everything about a policy that does not depend on the
// Dataplane being computed or on the rest of the snapshot: role, effective
// top-level targetRef, implicit scope, sort key. Never written once parsed.
type policyDef struct {
	desc *resource.TypeDescriptor
	// uid identifies this parse of the resource across the snapshots that
	// share it (defTable.nextUID): the memo of outbound confs a snapshot
	// hands to the next is keyed by it (views.go).
	uid uint64

	role string
	// display is res.DisplayName(), read by every comparison of a sort (a
	// label lookup per call dominated rebuilds at 100,000 policies).
	display string
	origin  int    // originGlobal < originZone
	ownNS   string // the namespace the policy was written in ("" = system)
	zone    string // the zone the policy belongs to ("" = global)

	// top is the effective top-level targetRef (the implicit targetRef of its role applied),
	// shared (refTable): never written.
	top *targetRef
	// scope are tags every selected inbound must carry: kuma.io/zone and
	// k8s.kuma.io/namespace for consumer and workload-owner policies, and
	// kuma.io/zone for zone-originated non-producer policies.
	scope []tag

	// legacy is set for legacy-shaped policies only: a pointer, so that the
	// 100,000 targetRef policies of a large zone do not carry three empty
	// slices each.
	legacy *legacyDef

	// name is policyName(p), set when parsing is done.
	name string

	// The resource's identity and labels, for output (meta) and messages;
	// resNS is its namespace as stored. The policy does not keep its
	// resource: a zone's view kept each policy's resource beside its parse,
	// at 100,000 policies 28 MB of a 106 MB heap.
	mesh, resName, resNS string
	labels               resource.Labels
	// specSum fingerprints the spec (defTable.specSum): with the labels
	// (and a legacy policy's creation time) it tells whether a resource of
	// the same name parses to this policy (parsedPolicy.holds).
	specSum uint64
}

// legacyDef is what a legacy-shaped policy selects.
type legacyDef struct {
	sources, destinations, selectors []selector
	// created is the resource's creation time, which breaks ties between
	// legacy policies of equal rank.
	created time.Time
}

// entry is one to/from item: its definition, and this snapshot's policy,
// blocks, position and resolved target.
type entry struct {
	*entryDef
	pol *policy
	pos int           // position in its type's sorted to/from list
	c   *contribution // the default block (may carry only unset)
	o   *contribution // the override block; nil when there is none

	// to entries: what the entry selects (resolved at snapshot build).
	target *toTarget
}

// entryDef is an entry as parsed; never written once parsed.
type entryDef struct {
	index int
	ref   *targetRef // shared (refTable), never written; from entries: Mesh when absent
	kind  int        // entryKindRank of ref

	// from entries: the client subset as tags; never is set when the
	// targetRef's tags contradict each other (no client can match).
	tags  []tag
	never bool
}

type tag struct{ key, value string }

// Origins of a policy, in sort order (docs/policy.md#ordering keys 2).
const (
	originGlobal = iota
	originZone
)

func policyWarning(p *policy, format string, args ...any) string {
	return p.desc.Name + " " + qualified(p.resNS, p.resName) + ": " + fmt.Sprintf(format, args...)
}

// meta is the policy's Meta for output, made when asked for: kept, it was
// 72 bytes of every policy's definition.
func (p *policy) meta() Meta {
	return Meta{Type: p.desc.Name, Mesh: p.mesh, Name: p.resName, Namespace: p.resNS, Labels: p.labels}
}

func metaOf(r *resource.Resource) Meta {
	return Meta{Type: r.Type, Mesh: r.Mesh, Name: r.Name, Namespace: r.Namespace, Labels: r.Labels}
}

// parsePolicy builds a policy of this snapshot from its decoded form. An
// error means the policy cannot be evaluated at all; the snapshot reports it
// as a warning on every Dataplane.
func (b *builder) parsePolicy(r *resource.Resource, d *resource.TypeDescriptor, k typedName) (p, src *policy, err error) {
	if prev, ok := b.prev.get(k); ok && prev.holds(r, b.s.defs) {
		// The resource the previous snapshot parsed, or one with the same
		// content: that parse holds.
		return b.reuse(k, prev)
	}
	dec, err := decodePolicy(r, d, b.sysNS, b.reg.Conditions())
	if err != nil {
		b.s.parses.m.set(k, parsedPolicy{res: r, err: err})
		return nil, nil, err
	}
	p = b.parseDecoded(r, d, dec)
	finishContributions(p, b.s.shapes)
	p.name = policyName(p)
	b.s.parses.m.set(k, parsedPolicy{pol: p})
	return p, nil, nil
}

// reuse takes prev, the previous snapshot's parse of k, into this one:
// shared as it is, or cloned apart from the state each snapshot sets
// itself (clone.go). src is the previous snapshot's policy.
func (b *builder) reuse(k typedName, prev parsedPolicy) (p, src *policy, err error) {
	switch {
	case prev.pol == nil:
	case b.share:
		p = prev.pol
	default:
		p = b.clones.policy(prev.pol)
		p.owner = b.own
	}
	b.s.parses.m.set(k, parsedPolicy{res: prev.res, pol: p, err: prev.err})
	return p, prev.pol, prev.err
}

// finishContributions caches, once per version of a policy, what a fold
// needs of each contribution: its shape (its where() comes with its
// definition); the clones of later snapshots share them.
func finishContributions(p *policy, shapes *shapeTable) {
	for _, list := range [][]*entry{p.to, p.from} {
		for _, e := range list {
			finishContribution(e.c, shapes)
			finishContribution(e.o, shapes)
		}
	}
	finishContribution(p.proxy, shapes)
	finishContribution(p.proxyOver, shapes)
	finishContribution(p.legacyConf, shapes)
}

func finishContribution(c *contribution, shapes *shapeTable) {
	if c == nil {
		return
	}
	if c.hasConf && !c.atomic && c.when == nil && len(c.unset) == 0 && c.patch != nil {
		c.plain = shapes.id(c.patch)
	}
}

func (b *builder) parseDecoded(r *resource.Resource, d *resource.TypeDescriptor, dec *decodedPolicy) *policy {
	p := &policy{owner: b.own, policyDef: &policyDef{desc: d, uid: b.s.defs.nextUID(), role: dec.role, display: r.DisplayName(),
		mesh: r.Mesh, resName: r.Name, resNS: r.Namespace, labels: r.Labels, specSum: b.s.defs.specSum(r.Spec)}}
	p.origin, p.zone = b.originOf(r)
	p.ownNS = b.ownNamespace(r)
	if d.Shape != resource.ShapeTargetRef {
		p.top = b.s.refs.intern(targetRef{}) // selection reads it: none
		p.legacy = &legacyDef{sources: dec.sources, destinations: dec.destinations, selectors: dec.selectors, created: r.CreationTime}
		p.legacyConf = newContribution(p, nil, -1, "", blockConf, dec.legacy)
		return p
	}
	b.effectiveTop(p, dec.top)
	p.to = b.entries(p, "to", dec.to)
	p.from = append(b.entries(p, "from", dec.from), b.entries(p, "rules", dec.rules)...)
	if d.ProxyWide {
		p.proxy = newContribution(p, b.s.defs, -1, "", blockDefault, dec.proxy.def)
		p.proxyOver = overrideContribution(p, b.s.defs, -1, "", dec.proxy.over)
	}
	return p
}

// originOf reads kuma.io/origin. A policy without the label was written
// locally: it sorts as zone-originated (as Kuma does) and belongs to this
// zone. A global policy belongs to no zone.
func (b *builder) originOf(r *resource.Resource) (origin int, zone string) {
	if r.Labels.Get(resource.LabelOrigin) == resource.OriginGlobal {
		return originGlobal, ""
	}
	if z := r.Labels.Get(resource.LabelZone); z != "" {
		return originZone, z
	}
	return originZone, b.zone
}

// ownNamespace is the namespace the policy was written in: the
// k8s.kuma.io/namespace label of a synced copy, else its namespace.
func (b *builder) ownNamespace(r *resource.Resource) string {
	if ns := r.Labels.Get(resource.LabelNamespace); ns != "" && b.normNS(r.Namespace) == "" {
		return b.normNS(ns)
	}
	return b.normNS(r.Namespace)
}

// effectiveTop applies the implicit targetRef of its role and docs/policy.md#selection's implicit scoping.
func (b *builder) effectiveTop(p *policy, top targetRef) {
	switch {
	case p.role == resource.RoleConsumer || p.role == resource.RoleWorkloadOwner:
		p.scope = b.s.refs.scope(p.zone, p.ownNS, true)
		if top.Kind == "" || top.Kind == resource.KindMesh {
			// "Mesh" (or nothing) in a consumer/workload-owner
			// policy means MeshSubset{kuma.io/zone, k8s.kuma.io/namespace}.
			scope := map[string]string{resource.LabelZone: p.zone, resource.LabelNamespace: p.ownNS}
			top = targetRef{Kind: resource.KindMeshSubset, Tags: scope, ProxyTypes: top.ProxyTypes}
		}
	case p.origin == originZone && p.role != resource.RoleProducer && p.zone != "":
		p.scope = b.s.refs.scope(p.zone, "", false)
	}
	if top.Kind == "" {
		top.Kind = resource.KindMesh
	}
	p.top = b.s.refs.intern(top)
}

// tagList returns tags sorted by key.
func tagList(m map[string]string) []tag {
	tags := make([]tag, 0, len(m))
	for _, k := range sortedKeys(m) {
		tags = append(tags, tag{k, m[k]})
	}
	return tags
}

func (b *builder) entries(p *policy, list string, items []decodedEntry) []*entry {
	out := make([]*entry, 0, len(items))
	for i, item := range items {
		ref := item.ref
		inbound := list == "from" || list == "rules"
		if ref.Kind == "" && inbound {
			// a missing from[].targetRef means Mesh; a rule
			// applies to all inbound traffic.
			ref.Kind = resource.KindMesh
		}
		def := entryDef{index: i, ref: b.s.refs.intern(ref)}
		def.kind = entryKindRank(def.ref)
		if inbound {
			def.tags, def.never = clientTags(*def.ref)
		}
		e := &entry{pol: p}
		e.c = newContribution(p, b.s.defs, i, list, blockDefault, item.def)
		e.o = overrideContribution(p, b.s.defs, i, list, item.over)
		if len(item.matches) == 0 {
			e.entryDef = b.s.defs.entryDef(def)
			out = append(out, e)
			continue
		}
		// A rule with matches applies to the clients of each match: one
		// entry per match, sharing the rule's contribution.
		for _, m := range item.matches {
			def.tags = []tag{m}
			em := *e
			em.entryDef = b.s.defs.entryDef(def)
			out = append(out, &em)
		}
	}
	return out
}

// normalizeConf puts equivalent spellings into one form so that merged confs
// compare equal and consumers see one vocabulary: MeshTrafficPermission
// actions become upper snake case (both spellings are accepted on input).
func normalizeConf(typeName string, conf any) any {
	if typeName != "MeshTrafficPermission" {
		return conf
	}
	obj, ok := conf.(map[string]any)
	if !ok {
		return conf
	}
	a, ok := obj["action"].(string)
	if !ok {
		return conf
	}
	if canon, ok := resource.CanonicalTrafficAction(a); ok && canon != a {
		out := make(map[string]any, len(obj))
		for k, v := range obj {
			out[k] = v
		}
		out["action"] = canon
		return out
	}
	return conf
}

// clientTags turns a from[].targetRef into the tags a client must carry
// : Mesh → none, MeshSubset → its tags, MeshService →
// kuma.io/service, MeshServiceSubset → both. A namespace on the reference
// adds k8s.kuma.io/namespace. never reports contradicting requirements
// (a subset tag naming another service). '*' is not special here: client
// identities are exact principal names.
func clientTags(ref targetRef) (tags []tag, never bool) {
	m := map[string]string{}
	for k, v := range ref.Tags {
		m[k] = v
	}
	add := func(k, v string) {
		if old, ok := m[k]; ok && old != v {
			never = true
		}
		m[k] = v
	}
	switch ref.Kind {
	case resource.KindMesh:
		return nil, false
	case resource.KindMeshService, resource.KindMeshServiceSubset:
		if ref.Kind == resource.KindMeshService {
			m = map[string]string{}
		}
		add(resource.ServiceTag, ref.Name)
	case resource.KindMeshSubset:
	default:
		return nil, true // a kind that cannot select clients selects none
	}
	if ref.Namespace != "" {
		add(resource.LabelNamespace, ref.Namespace)
	}
	tags = make([]tag, 0, len(m))
	for k, v := range m {
		tags = append(tags, tag{k, v})
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i].key < tags[j].key })
	return tags, never
}
