package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-mesh/meridian/internal/condition"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Inputs are the resources of one mesh as one zone control plane sees them.
type Inputs struct {
	Registry *resource.Registry
	Mesh     string
	// Zone is this zone's name; it becomes the implicit kuma.io/zone tag of
	// every inbound and the zone of policies written here.
	Zone string
	// SystemNamespace is the zone's system namespace. Required.
	SystemNamespace string
	// Previous, when set, is the snapshot this one replaces: the policies
	// it was built from that are among Resources (the same name, spec,
	// labels and, for legacy policies, creation time: parsedPolicy.holds;
	// Previous keeps none of the resources) reuse its parse and order
	// instead of decoding JSON and sorting again (the bulk of building a
	// snapshot), and unchanged policies are shared with it (share.go).
	// Optional; the result is the same either way. It must have been built
	// with the same Registry, SystemNamespace and Zone, else it is ignored.
	// The build takes Previous's parse table: a second snapshot built from
	// the same Previous parses afresh (still correct, not faster), and Previous
	// itself answers queries as before.
	//
	// Resources: policies of every type, Dataplanes, MeshServices,
	// MeshExternalServices, MeshMultiZoneServices and MeshGateways of Mesh. Other infrastructure
	// types are ignored. The snapshot keeps the pointers of the
	// infrastructure and Dataplanes, and of policies it could not parse; of
	// the others it keeps what it parsed. The caller must not change the
	// resources afterwards (resource.Resource is immutable by contract).
	Resources []*resource.Resource
	Previous  *MeshSnapshot
	// Changes, instead of Resources, gives the resources as Previous's
	// with changes applied (delta.go): for one changed policy among
	// 100,000 the build then costs what changed, not what is there, and
	// the caller need not keep the resources it gave before (the zone's
	// view keeps none). It fails with ErrPreviousTaken when a snapshot was
	// built from Previous already.
	Changes *Changes
}

// WhenBudget is the time one snapshot's queries may spend evaluating `when`
// expressions, all queries together: past it, an expression counts as false
// with a warning, until the next snapshot. It bounds what a few costly
// expressions can take from a zone's cores.
const WhenBudget = 2 * time.Second

// mergerOf is t's merger drawing on s's `when` budget.
func (s *MeshSnapshot) mergerOf(t *typeIndex) merger {
	m := t.merger
	m.budget = s.when
	return m
}

// MeshSnapshot is an immutable, pre-indexed view of one mesh in one zone.
// It is built once by NewMeshSnapshot and then queried concurrently: every
// method is a pure function of the snapshot and its arguments (but a
// `when` expression evaluated after the snapshot spent its WhenBudget,
// which counts as false with a warning).
type MeshSnapshot struct {
	mesh, zone, sysNS string
	// when is the time this snapshot's queries may spend on `when`
	// expressions together (docs/policy.md#defaults-and-overrides).
	when *condition.Budget

	dataplanes map[nsName]*dataplane
	dpList     []*dataplane // sorted by namespace, name

	types     map[string]*typeIndex
	typeNames []string // sorted names of types that have policies or warnings

	services    map[nsName]*meshService
	svcByName   map[string][]*meshService // by display name
	externals   map[nsName]*resource.Resource
	extByName   map[string][]*resource.Resource // by display name
	multis      map[nsName]*resource.Resource   // MeshMultiZoneServices
	multiByName map[string][]*resource.Resource // by display name
	gateways    map[string]*gateway
	// infra are the resources built from that are neither policies nor
	// Dataplanes (those above, and types the engine ignores), so that a
	// build from changes can list every resource (delta.go).
	infra       []*resource.Resource
	routes      map[nsName]*policy // MeshHTTPRoutes, for targetRefs of kind MeshHTTPRoute
	routeByName map[string][]*policy

	// Memos shared by every query: a type's from-rules depend only on the
	// list of entries that apply, and an outbound's conf only on its entry
	// lists, so Dataplanes selected by the same entries share one
	// computation. They are filled lazily and concurrently (sync.Map) and never
	// change a result; they die with the snapshot, but toMemo, which the next
	// snapshot reads (prevToMemo).
	fromMemo sync.Map // type + entry signature → *fromResult
	// explainMemo holds the explanations asked for (explainKey →
	// *Explanation).
	explainMemo sync.Map
	explained   atomic.Int64 // explanations memoized
	// toMemo: type + stable signature of the Mesh entries → *resultMemo of
	// outbound signature → *outboundResult. Its keys name policies by
	// parse (policyDef.uid), not by position, so the next snapshot can
	// reuse what this one computed (prevToMemo): after one policy changes,
	// the outbounds it does not reach keep their result, origins included.
	toMemo *sync.Map
	// prevToMemo is the previous snapshot's toMemo (not the snapshot:
	// only its outbound results stay alive, one generation back).
	prevToMemo *sync.Map

	// effectiveDPs are the Dataplanes with their implicit outbounds
	// (*dataplane → *dataplane), and svcNames the mesh's services they
	// are made from; both on first use.
	effectiveDPs sync.Map
	implicitSets sync.Map // own services → *implicitOutbounds
	svcNamesOnce sync.Once
	svcNames     []string

	// statuses of every policy (docs/policy.md#status), computed on first use.
	statusOnce sync.Once
	status     *statusSet

	// parses lets the next snapshot reuse parsed policies (Inputs.Previous).
	// The next snapshot built from this one takes it (parseTable.take), so
	// that a build from changes can update it in place.
	reg    *resource.Registry
	parses parseTable
	// shapes numbers the patch shapes of the contributions parsed here and
	// in the snapshots this one was built from (shape.go).
	shapes *shapeTable
	// refs shares the targetRefs parsed here and in the snapshots this one
	// was built from (refs.go).
	refs *refTable
	// defs shares contribution and entry definitions the same way (defs.go).
	defs *defTable
}

// parsedPolicy is what a snapshot remembers of one policy for the next: the
// policy as this snapshot holds it, or the resource and why it could not be
// parsed. The next snapshot shares or clones pol when it is handed a
// resource with the same content (holds), or builds from changes
// (delta.go). Neither the resource of a parsed policy nor its decoded spec
// is kept: the parse holds everything later snapshots need.
type parsedPolicy struct {
	pol *policy
	res *resource.Resource // when pol is nil
	err error
}

// holds reports whether pp is the parse of r, a resource of its name: r
// is the resource pp failed on, or has the spec (by fingerprint, defs'),
// labels and (for a legacy policy, whose ties it breaks) creation time of
// the one pp's policy was parsed from. Nothing else of a resource goes into
// its parse.
func (pp parsedPolicy) holds(r *resource.Resource, defs *defTable) bool {
	p := pp.pol
	if p == nil {
		return pp.res == r
	}
	return p.specSum == defs.specSum(r.Spec) && p.labels.Equal(r.Labels) &&
		(p.legacy == nil || p.legacy.created.Equal(r.CreationTime))
}

// key is pp's resource's namespace and name.
func (pp parsedPolicy) key() (namespace, name string) {
	if pp.pol != nil {
		return pp.pol.resNS, pp.pol.resName
	}
	return pp.res.Namespace, pp.res.Name
}

// parseMap holds a snapshot's parsedPolicies by name: those with a policy as
// the policy alone, the few that failed in full.
// A map of whole parsedPolicies was 72 bytes a slot, 12 MB of a zone's heap
// at 100,000 policies; of pointers, 48. Owned by one build at a time.
type parseMap struct {
	pols   map[typedName]*policy
	failed map[typedName]parsedPolicy
}

func newParseMap(n int) *parseMap {
	return &parseMap{pols: make(map[typedName]*policy, n), failed: map[typedName]parsedPolicy{}}
}

// get is k's parse; a nil map holds none.
func (m *parseMap) get(k typedName) (parsedPolicy, bool) {
	if m == nil {
		return parsedPolicy{}, false
	}
	if p, ok := m.pols[k]; ok {
		return parsedPolicy{pol: p}, true
	}
	pp, ok := m.failed[k]
	return pp, ok
}

// set records pp.
func (m *parseMap) set(k typedName, pp parsedPolicy) {
	if pp.pol != nil {
		m.pols[k] = pp.pol
		delete(m.failed, k)
		return
	}
	m.failed[k] = pp
	delete(m.pols, k)
}

func (m *parseMap) remove(k typedName) {
	delete(m.pols, k)
	delete(m.failed, k)
}

func (m *parseMap) len() int { return len(m.pols) + len(m.failed) }

// each calls fn with every parse.
func (m *parseMap) each(fn func(typedName, parsedPolicy)) {
	for k, p := range m.pols {
		fn(k, parsedPolicy{pol: p})
	}
	for k, pp := range m.failed {
		fn(k, pp)
	}
}

// parseTable is a snapshot's policies by name: every policy resource it was
// built from, parsed or not.
type parseTable struct {
	mu sync.Mutex
	m  *parseMap
}

// take hands the table's map over to the snapshot being built from this
// one, and leaves nil: a build from changes updates it in place, and the
// published snapshot never reads it. A second build from the same previous
// snapshot parses afresh.
func (t *parseTable) take() *parseMap {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.m
	t.m = nil
	return m
}

// fromResult is a memoized from-rule computation; the RBAC filter (for
// MeshTrafficPermission) is derived on first use, by `_config` only. Its
// rules carry no origins, their blocks instead (ruleBlocks), rendered per
// query (rendered), as outboundResult does.
type fromResult struct {
	rules      []Rule
	ruleBlocks [][]*contribution // by rule
	leaves     []cellLeaf        // the cells the rules were rendered from
	entries    []*entry          // the inbound's entries, in apply order
	warns      []string
	err        error

	rbacOnce sync.Once
	rbac     RBACFilter
}

// rendered is the rules with their origins, or (lazy) their blocks.
func (fr *fromResult) rendered(lazy bool) []Rule {
	if fr.rules == nil {
		return nil
	}
	out := make([]Rule, len(fr.rules))
	for i, r := range fr.rules {
		if lazy {
			r.lazy = lazyOrigin{set: true, blocks: fr.ruleBlocks[i]}
		} else {
			r.Origin = originsOf(fr.ruleBlocks[i])
		}
		out[i] = r
	}
	return out
}

func (fr *fromResult) rbacFilter(mesh string) RBACFilter {
	fr.rbacOnce.Do(func() { fr.rbac = rbacFilter(mesh, fr.rules) })
	return fr.rbac
}

// nsName is a namespaced name; ns is "" for the system namespace.
type nsName struct{ ns, name string }

// typeIndex holds one policy type's parsed policies and sorted entries.
type typeIndex struct {
	desc     *resource.TypeDescriptor
	merger   merger
	policies []*policy  // sorted by docs/policy.md#ordering keys 1-4
	quick    []quickSel // quick[i] summarizes how policies[i] selects, and its warnings (select.go); may be shared with a previous snapshot's type, never written
	to, from []*entry   // concatenated and sorted by docs/policy.md#ordering's entry keys
	// overTo and overFrom are the entries of to and from with an override
	// block, overProxy the policies with a proxy-wide one, in the
	// overrides pass's order (their blocks' order counts from
	// overrideOrderBase in it).
	overTo, overFrom []*entry
	overProxy        []*policy
	// warnings are about policies that cannot be evaluated at all (bad spec,
	// mixed roles, unresolvable top-level targetRef); every Dataplane sees them.
	warnings []string
	skipped  map[nsName]bool // policies not evaluated because of such a problem

	// sources[i] is the previous snapshot's policy policies[i] was cloned
	// from (nil when parsed afresh); only while building (finishType).
	sources []*policy

	// toIdx indexes to by target (views.go), made on first use; from
	// toSeed when the type was spliced from a type whose index was made
	// (the lists a change did not touch are kept).
	toOnce sync.Once
	toIdx  atomic.Pointer[toIndex]
	toSeed *toSeed

	// summed is the summary of quick (select.go), made on first use: a
	// finished type's policies keep their selectors and warnings. A type
	// spliced from one that selects as it does shares that type's quick
	// array and summary (selectsAsBefore).
	summaryOnce sync.Once
	summed      atomic.Pointer[typeSummary]
	// matchedAll is allMatched's list (select.go), made on first use.
	matchedAll atomic.Pointer[[]bool]
}

// summary is t's typeSummary.
func (t *typeIndex) summary() *typeSummary {
	t.summaryOnce.Do(func() {
		if t.summed.Load() == nil {
			t.summed.Store(summarize(t.quick))
		}
	})
	return t.summed.Load()
}

type meshService struct {
	res     *resource.Resource
	display string
	origNS  string // namespace the service lives in where it was created ("" = none/system)
	zone    string // kuma.io/zone label, "" when local or unknown
	ports   []servicePort
}

type gateway struct {
	res       *resource.Resource
	selectors []selector
}

// buildMark identifies one build (policy.owner); not empty, so that every
// mark has its own address.
type buildMark struct{ _ byte }

// builder carries what parsing needs while a snapshot is built.
type builder struct {
	s     *MeshSnapshot
	own   *buildMark
	reg   *resource.Registry
	zone  string
	sysNS string
	prev  *parseMap
	// prevSnap is the previous snapshot (Inputs.Previous) when it is
	// usable, prevTypes its type indexes: the order of unchanged policies
	// is kept from them (finishType).
	prevSnap  *MeshSnapshot
	prevTypes map[string]*typeIndex
	// share says unchanged policies are taken from the previous snapshot
	// as they are, not cloned: everything their resolved targets and
	// warnings depend on (the infrastructure they name, the routes) is
	// the very same as there (sameEnvironment). Those whose positions
	// change are cloned after all (unshare, share.go).
	share bool
	// clones hands out the structs of policies cloned from the previous
	// snapshot in chunks (clone.go).
	clones cloneArena
	// all is the one target of every to-entry of kind Mesh (everyOutbound).
	all *toTarget
	// perType counts the policies of each type, so that a type's lists
	// are allocated once at their size.
	perType map[*resource.TypeDescriptor]int
}

// everyOutbound is the resolved target of a to-entry of kind Mesh. Targets
// are read-only once resolved, so the snapshot's entries share one: at
// 10,000 policies a struct per entry was a tenth of a rebuild's
// allocation, and every page a rebuild allocates afresh costs a page fault.
func (b *builder) everyOutbound() *toTarget {
	if b.all == nil {
		b.all = &toTarget{all: true}
	}
	return b.all
}

// NewMeshSnapshot parses and indexes in. It fails only on inputs that are a
// caller's mistake (no registry, nil resources, another mesh, unknown types,
// duplicates). Problems inside resources (undecodable specs, references to
// missing resources) become warnings in the query results.
func NewMeshSnapshot(in Inputs) (*MeshSnapshot, error) {
	if in.Registry == nil {
		return nil, errors.New("policy snapshot: no registry")
	}
	sysNS := in.SystemNamespace
	if sysNS == "" {
		return nil, errors.New("policy snapshot: no system namespace")
	}
	var s *MeshSnapshot
	var err error
	if in.Changes != nil {
		s, err = fromChanges(in, sysNS)
	} else {
		var prevParses *parseMap
		if p := in.Previous; p != nil {
			prevParses = p.parses.take()
		}
		s, err = build(in, sysNS, prevParses, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("policy snapshot of mesh %q: %w", in.Mesh, err)
	}
	return s, nil
}

// build indexes in.Resources and the previous snapshot's parses kept (a
// build from changes that cannot splice); prevParses is in.Previous's parse
// table (taken), or nil.
func build(in Inputs, sysNS string, prevParses *parseMap, kept []keptParse) (*MeshSnapshot, error) {
	s := &MeshSnapshot{
		mesh: in.Mesh, zone: in.Zone, sysNS: sysNS, when: condition.NewBudget(WhenBudget),
		dataplanes: map[nsName]*dataplane{}, types: map[string]*typeIndex{},
		services: map[nsName]*meshService{}, svcByName: map[string][]*meshService{},
		externals: map[nsName]*resource.Resource{}, extByName: map[string][]*resource.Resource{},
		multis: map[nsName]*resource.Resource{}, multiByName: map[string][]*resource.Resource{},
		gateways: map[string]*gateway{}, routes: map[nsName]*policy{}, routeByName: map[string][]*policy{},
		reg: in.Registry, parses: parseTable{m: newParseMap(len(in.Resources))}, toMemo: &sync.Map{},
	}
	b := &builder{s: s, own: new(buildMark), reg: in.Registry, zone: in.Zone, sysNS: sysNS}
	if p := in.Previous; p != nil && p.reg == in.Registry && p.sysNS == sysNS && p.zone == in.Zone {
		b.prev, b.prevSnap, b.prevTypes, s.shapes, s.refs, s.defs = prevParses, p, p.types, p.shapes, p.refs, p.defs
		s.prevToMemo = p.toMemo
	} else {
		s.shapes, s.refs, s.defs = newShapeTable(), newRefTable(), newDefTable()
	}
	if err := b.index(in.Resources, kept); err != nil {
		return nil, err
	}
	return s, nil
}

// keptParse is a previous snapshot's parse that a build keeps as it is,
// with its name in the parse table.
type keptParse struct {
	k  typedName
	pp parsedPolicy
}

// index sorts resources into infrastructure and policies, and adds the
// policies kept. Infrastructure goes first: resolving policy references
// needs it.
func (b *builder) index(rs []*resource.Resource, kept []keptParse) error {
	seen := map[typedName]struct{}{}
	policies := make([]*resource.Resource, 0, len(rs))
	var dps []*resource.Resource
	b.perType = map[*resource.TypeDescriptor]int{}
	for _, kp := range kept {
		b.perType[kp.k.desc]++
	}
	for i, r := range rs {
		d, err := b.check(i, r)
		if err != nil {
			return err
		}
		switch {
		case d.IsPolicy():
			// Policies are checked for duplicates as they are parsed: the
			// parse table is keyed by name.
			policies = append(policies, r)
			b.perType[d]++
			continue
		}
		k := typedName{d, b.normNS(r.Namespace), r.Name}
		if _, dup := seen[k]; dup {
			return fmt.Errorf("%s: duplicate resource", r.Key())
		}
		seen[k] = struct{}{}
		switch {
		case r.Type == "Dataplane":
			dps = append(dps, r)
		default:
			b.addInfra(r)
		}
	}
	for _, r := range dps {
		b.addDataplane(r)
	}
	sortDataplanes(b.s.dpList)
	b.share = b.sameEnvironment(policies, kept)
	return b.addPolicies(policies, kept)
}

// typedName identifies a resource within one mesh (the duplicate check; a
// snapshot holds one mesh's resources): 40 bytes against resource.Key's 64,
// hashed over two strings instead of four.
type typedName struct {
	desc     *resource.TypeDescriptor
	ns, name string
}

func (b *builder) check(i int, r *resource.Resource) (*resource.TypeDescriptor, error) {
	if r == nil {
		return nil, fmt.Errorf("resources[%d] is nil", i)
	}
	d, ok := b.reg.Lookup(r.Type)
	if !ok {
		return nil, fmt.Errorf("%s: unknown resource type %q", r.Key(), r.Type)
	}
	if d.Scope == resource.ScopeMesh && r.Mesh != b.s.mesh {
		return nil, fmt.Errorf("%s: belongs to mesh %q", r.Key(), r.Mesh)
	}
	return d, nil
}

// normNS maps the system namespace to "".
func (b *builder) normNS(ns string) string {
	if ns == b.sysNS {
		return ""
	}
	return ns
}

func (b *builder) addInfra(r *resource.Resource) {
	key := nsName{b.normNS(r.Namespace), r.Name}
	b.s.infra = append(b.s.infra, r)
	switch r.Type {
	case "MeshService":
		ms := &meshService{res: r, display: r.DisplayName(), origNS: b.ownNamespace(r), zone: r.Labels.Get(resource.LabelZone), ports: portsOf(r)}
		b.s.services[key] = ms
		b.s.svcByName[ms.display] = append(b.s.svcByName[ms.display], ms)
	case "MeshExternalService":
		b.s.externals[key] = r
		b.s.extByName[r.DisplayName()] = append(b.s.extByName[r.DisplayName()], r)
	case "MeshMultiZoneService":
		b.s.multis[key] = r
		b.s.multiByName[r.DisplayName()] = append(b.s.multiByName[r.DisplayName()], r)
	case "MeshGateway":
		var spec struct {
			Selectors []selector `json:"selectors"`
		}
		_ = json.Unmarshal(r.Spec, &spec) // an unreadable gateway selects nothing
		b.s.gateways[r.Name] = &gateway{res: r, selectors: spec.Selectors}
	}
}

// addPolicies parses every policy resource and takes the kept parses, then
// resolves references (a policy may name a route of another type) and
// sorts per type. It fails on a duplicate.
func (b *builder) addPolicies(rs []*resource.Resource, kept []keptParse) error {
	parsed := make([]*policy, 0, len(rs)+len(kept))
	add := func(k typedName, p, src *policy, err error, failed *resource.Resource) {
		t := b.typeIndex(k.desc)
		if err != nil {
			t.warnings = append(t.warnings, skippedWarning(k.desc, failed, err))
			t.skipped[nsName{k.ns, k.name}] = true
			return
		}
		t.policies = append(t.policies, p)
		t.sources = append(t.sources, src)
		parsed = append(parsed, p)
		if k.desc.Name == "MeshHTTPRoute" {
			b.s.routes[nsName{k.ns, k.name}] = p
			b.s.routeByName[p.display] = append(b.s.routeByName[p.display], p)
		}
	}
	for _, kp := range kept {
		p, src, err := b.reuse(kp.k, kp.pp)
		add(kp.k, p, src, err, kp.pp.res)
	}
	for _, r := range rs {
		d, _ := b.reg.Lookup(r.Type)
		k := typedName{d, b.normNS(r.Namespace), r.Name}
		if _, dup := b.s.parses.m.get(k); dup {
			return fmt.Errorf("%s: duplicate resource", r.Key())
		}
		p, src, err := b.parsePolicy(r, d, k)
		add(k, p, src, err, r)
	}
	for _, p := range parsed {
		if p.owner != b.own {
			// Shared: its targets were resolved in the same environment.
			b.checkTopOf(p)
			continue
		}
		b.resolve(p)
	}
	for _, name := range sortedKeys(b.s.types) {
		b.finishType(b.s.types[name])
		b.s.typeNames = append(b.s.typeNames, name)
	}
	return nil
}

func (b *builder) typeIndex(d *resource.TypeDescriptor) *typeIndex {
	t := b.s.types[d.Name]
	if t == nil {
		appendFields := d.AppendFields
		if d.Rules && !d.OneRule {
			// HTTP route rules of several routes on one outbound are all
			// kept, those with equal matches merged (keyed.go); matching
			// precedence is the Envoy generator's job. A TCP route's one
			// rule has no matches to tell it from another's: the most
			// specific replaces the rest.
			appendFields = append(append([]string(nil), appendFields...), "rules")
		}
		n := b.perType[d]
		m := newMerger(appendFields)
		if d.Rules && !d.OneRule {
			// Rules with equal matches merge into one (keyed.go).
			m.keyed = map[string]string{"rules": "matches"}
		}
		t = &typeIndex{desc: d, merger: m, skipped: map[nsName]bool{},
			policies: make([]*policy, 0, n), sources: make([]*policy, 0, n)}
		b.s.types[d.Name] = t
	}
	return t
}

// resolve checks the top-level reference and resolves to-entry targets.
func (b *builder) resolve(p *policy) {
	if !b.checkTopOf(p) {
		return
	}
	for _, e := range p.to {
		e.target = b.resolveTo(p, e)
	}
}

// checkTopOf adds the warning about p's top-level reference to its type's,
// if any; false when p has no targetRef shape.
func (b *builder) checkTopOf(p *policy) bool {
	if p.desc.Shape != resource.ShapeTargetRef {
		return false
	}
	if w := b.checkTop(p); w != "" {
		t := b.s.types[p.desc.Name]
		t.warnings = append(t.warnings, w)
	}
	return true
}

func (b *builder) finishType(t *typeIndex) {
	slices.Sort(t.warnings) // resources arrive in store order; output must not depend on it
	if prev := b.prevTypes[t.desc.Name]; prev != nil {
		b.keepOrder(t, prev)
	} else {
		slices.SortStableFunc(t.policies, comparePolicies)
		for _, p := range t.policies {
			t.to = append(t.to, p.to...)
			t.from = append(t.from, p.from...)
		}
		sortEntries(t.to)
		sortEntries(t.from)
	}
	t.sources = nil
	b.unshare(t)
	if t.quick == nil {
		t.quick = make([]quickSel, len(t.policies))
		for i, p := range t.policies {
			t.quick[i] = quickSelOf(p)
		}
	}
	// Shared policies already hold these numbers (unshare), and the
	// previous snapshot's readers may be reading them: only this
	// snapshot's own structs are written.
	own := b.own
	for i, p := range t.policies {
		if p.owner == own {
			p.idx = i
		}
	}
	for i, e := range t.to {
		if e.pol.owner == own {
			e.pos, e.c.order = i, i
		}
	}
	for i, e := range t.from {
		if e.pol.owner == own {
			e.pos, e.c.order = i, i
		}
	}
	for k, e := range t.overTo { // set by unshare
		if e.pol.owner == own {
			e.o.order = overrideOrderBase + k
		}
	}
	for k, e := range t.overFrom {
		if e.pol.owner == own {
			e.o.order = overrideOrderBase + k
		}
	}
	for i, p := range t.policies {
		if p.proxy != nil && p.owner == own {
			p.proxy.order = i
		}
	}
	for k, p := range t.overProxy {
		if p.owner == own {
			p.proxyOver.order = overrideOrderBase + k
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// keepOrder sorts t's policies and entries using the previous snapshot's
// order: policies cloned from it keep their relative order (the sort keys
// are part of the shared definitions and the resource's name), so only the
// new and changed ones are sorted, then merged in. At 100,000 policies
// this replaces two sorts that took about a fifth of a rebuild.
func (b *builder) keepOrder(t, prev *typeIndex) {
	kept := make([]*policy, len(prev.policies))
	keptTo := make([]*entry, len(prev.to))
	keptFrom := make([]*entry, len(prev.from))
	var fresh []*policy
	var freshTo, freshFrom []*entry
	for i, p := range t.policies {
		src := t.sources[i]
		if src == nil || src.idx >= len(kept) || prev.policies[src.idx] != src {
			fresh = append(fresh, p)
			freshTo = append(freshTo, p.to...)
			freshFrom = append(freshFrom, p.from...)
			continue
		}
		kept[src.idx] = p
		for j, e := range p.to {
			keptTo[src.to[j].pos] = e
		}
		for j, e := range p.from {
			keptFrom[src.from[j].pos] = e
		}
	}
	slices.SortStableFunc(fresh, comparePolicies)
	sortEntries(freshTo)
	sortEntries(freshFrom)
	keptList := make([]*policy, 0, len(kept))
	keptQuick := make([]quickSel, 0, len(kept))
	for i, p := range kept {
		if p != nil {
			keptList = append(keptList, p)
			keptQuick = append(keptQuick, prev.quick[i])
		}
	}
	t.policies = mergeSorted(keptList, fresh, comparePolicies)
	t.to = mergeSorted(withoutNil(keptTo), freshTo, compareEntries)
	t.from = mergeSorted(withoutNil(keptFrom), freshFrom, compareEntries)
	t.quick = keepQuick(t.policies, keptList, keptQuick)
}

// keepQuick builds the selection summary of policies (the kept ones in
// their order, with fresh ones merged in) taking the kept ones' from
// keptQuick: a summary depends only on the policy's definition, and
// reading every definition again cost a cache miss per policy.
func keepQuick(policies, kept []*policy, keptQuick []quickSel) []quickSel {
	quick := make([]quickSel, len(policies))
	j := 0
	for i, p := range policies {
		if j < len(kept) && p == kept[j] {
			quick[i] = keptQuick[j]
			j++
			continue
		}
		quick[i] = quickSelOf(p)
	}
	return quick
}

func withoutNil[T any](s []*T) []*T {
	return slices.DeleteFunc(s, func(v *T) bool { return v == nil })
}

// mergeSorted merges two sorted lists; on ties a's item comes first.
func mergeSorted[T any](a, b []T, compare func(T, T) int) []T {
	if len(b) == 0 {
		return a
	}
	out := make([]T, 0, len(a)+len(b))
	if len(b)*bits.Len(uint(len(a))) < len(a) {
		// A few changed items among many kept ones (a rebuild after one
		// change): find each one's place by binary search and copy the
		// runs between. Comparing every kept item read its policy's
		// definition, a cache miss each: a sixth of a rebuild at 100,000.
		for _, v := range b {
			i := sort.Search(len(a), func(i int) bool { return compare(v, a[i]) < 0 })
			out = append(append(out, a[:i]...), v)
			a = a[i:]
		}
		return append(out, a...)
	}
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if compare(b[j], a[i]) < 0 {
			out = append(out, b[j])
			j++
		} else {
			out = append(out, a[i])
			i++
		}
	}
	out = append(out, a[i:]...)
	return append(out, b[j:]...)
}
