package policy

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Selection (docs/policy.md#selection).

// maxRouteDepth bounds MeshHTTPRoute indirection (a policy targeting a route
// whose targetRef names a route...): validation forbids it, fuzzed or stale
// input must not loop.
const maxRouteDepth = 2

// selectsSection reports whether p's top-level targetRef (and implicit
// scope) selects one section of dp: an inbound, a listener or the gateway.
func (s *MeshSnapshot) selectsSection(p *policy, dp *dataplane, sec *section, depth int) bool {
	tags := sec.tags
	for _, t := range p.scope {
		if tags[t.key] != t.value {
			return false
		}
	}
	ref := p.top
	proxyType := dp.proxyType()
	if len(ref.ProxyTypes) > 0 && !slices.Contains(ref.ProxyTypes, proxyType) {
		return false
	}
	switch ref.Kind {
	case resource.KindMesh:
		return true
	case resource.KindDataplane:
		// Kuma: a Dataplane targetRef selects inbounds and listeners (one
		// by sectionName), and a delegated gateway as a whole; never a
		// builtin gateway.
		if sec.kind == sectionGateway {
			return dp.delegated && s.selectsDataplane(p, dp)
		}
		return s.selectsDataplane(p, dp) && (ref.SectionName == "" || ref.SectionName == sec.name)
	case resource.KindMeshHTTPRoute:
		if depth >= maxRouteDepth {
			return false
		}
		for _, r := range s.lookupRoutes(ref, p.ownNS) {
			if s.selectsSection(r, dp, sec, depth+1) {
				return true
			}
		}
		return false
	}
	if sec.kind == sectionListener {
		return false // listeners carry no tags to select by
	}
	switch ref.Kind {
	case resource.KindMeshSubset:
		return tagListMatch(p.top.tags, tags)
	case resource.KindMeshService:
		return tags[resource.ServiceTag] == ref.Name
	case resource.KindMeshServiceSubset:
		return tags[resource.ServiceTag] == ref.Name && tagListMatch(p.top.tags, tags)
	case resource.KindMeshGateway:
		return proxyType == "Gateway" && !dp.delegated && s.gatewaySelects(ref, tags)
	}
	return false
}

// selectsDataplane: a Dataplane targetRef names dp by labels (all of them
// on the Dataplane), by name, or, with none of labels, name and namespace,
// every Dataplane. A name is resolved as Kuma resolves it: in the zone of
// the policy (a global policy has none, so it names no zone's Dataplane)
// and in the reference's namespace, else the policy's own; it is compared
// with the Dataplane's display name.
func (s *MeshSnapshot) selectsDataplane(p *policy, dp *dataplane) bool {
	ref := p.top
	switch {
	case ref.Labels != nil:
		for k, v := range ref.Labels {
			if got, ok := dp.res.Labels.Lookup(k); !ok || got != v {
				return false
			}
		}
		return true
	case ref.Name != "":
		ns := s.normNS(ref.Namespace)
		if ref.Namespace == "" {
			ns = p.ownNS
		}
		return dp.display == ref.Name && dp.ns == ns && dp.zone == p.zone
	case ref.Namespace != "":
		return false // neither every Dataplane nor one by name (Kuma)
	}
	return true
}

// tagsMatch: every selector tag is present with the same value, or with any
// value when the selector says '*' (Kuma's TagSelector).
func tagsMatch(selector, tags map[string]string) bool {
	for k, v := range selector {
		if !tagMatches(k, v, tags) {
			return false
		}
	}
	return true
}

func tagListMatch(selector []tag, tags map[string]string) bool {
	for _, t := range selector {
		if !tagMatches(t.key, t.value, tags) {
			return false
		}
	}
	return true
}

func tagMatches(key, want string, tags map[string]string) bool {
	got, ok := tags[key]
	return ok && (want == "*" || want == got)
}

func (s *MeshSnapshot) gatewaySelects(ref *targetRef, tags map[string]string) bool {
	gw := s.gateways[ref.Name]
	if gw == nil || !tagsMatch(ref.Tags, tags) {
		return false
	}
	for _, sel := range gw.selectors {
		if tagsMatch(sel.Match, tags) {
			return true
		}
	}
	return false
}

// selectsDP: a policy applies to a Dataplane when it selects any of its
// sections (inbounds, listeners, gateway).
func (s *MeshSnapshot) selectsDP(p *policy, dp *dataplane) bool {
	for i := range dp.sections {
		if s.selectsSection(p, dp, &dp.sections[i], 0) {
			return true
		}
	}
	return false
}

// matchedPolicies marks, by policy index, the policies of t applying to dp.
// The result is never written. A view matching every policy of the type
// (a zone's policies mostly target the Mesh) gets the type's shared
// all-true list (allMatched) instead of making and filling its own.
func (s *MeshSnapshot) matchedPolicies(t *typeIndex, dp *dataplane) []bool {
	secs := newSectionFacts(dp.sections)
	// matched stays nil while every policy so far applies; runs cover the
	// policies in order, so at the first that does not, all before it do.
	var matched []bool
	set := func(from, to int32, ok bool) {
		if matched == nil {
			if ok {
				return
			}
			matched = make([]bool, len(t.policies))
			for j := range from {
				matched[j] = true
			}
		}
		for j := from; j < to; j++ {
			matched[j] = ok
		}
	}
	for _, r := range t.summary().runs {
		if r.q == nil {
			for i := r.start; i < r.end; i++ {
				set(i, i+1, s.selectsDP(t.policies[i], dp))
			}
			continue
		}
		in := secs.inScope(r.q.scope)
		ok := false
		for j := range dp.sections {
			if r.q.selects(in[j], secs.service[j]) {
				ok = true
				break
			}
		}
		set(r.start, r.end, ok)
	}
	if matched == nil {
		return t.allMatched()
	}
	return matched
}

// allMatched is a list of len(t.policies) trues, made once per type index
// and shared: never written.
func (t *typeIndex) allMatched() []bool {
	if all := t.matchedAll.Load(); all != nil {
		return *all
	}
	all := make([]bool, len(t.policies))
	for i := range all {
		all[i] = true
	}
	t.matchedAll.Store(&all)
	return all
}

// matchesEvery reports whether matched (matchedPolicies') holds every
// policy of t.
func (t *typeIndex) matchesEvery(matched []bool) bool {
	if all := t.matchedAll.Load(); all != nil && len(matched) > 0 && len(*all) == len(matched) && &(*all)[0] == &matched[0] {
		return true
	}
	return !slices.Contains(matched, false)
}

// selectionRun is a run of consecutive policies of a type that select
// alike: all by q, or (q nil) each as selectsDP decides.
type selectionRun struct {
	start, end int32
	q          *quickSel
}

// typeSummary is what every Dataplane's view reads of a type's policies,
// made once per type index from its quick array (summary).
type typeSummary struct {
	// runs cover the policies in order. A type's policies sort by their
	// top-level targetRef's kind and mostly share the zone's scope, so
	// 10,000 policies make a few runs: matching reads those, not every
	// policy's selector.
	runs []selectionRun
	// warned are the indexes of the policies with warnings of their own,
	// in order: a view reads those of its matched policies.
	warned []int32
}

// summarize makes a typeSummary of quick.
func summarize(quick []quickSel) *typeSummary {
	sum := &typeSummary{}
	start := 0
	for i := range quick {
		q := &quick[i]
		if q.warned {
			sum.warned = append(sum.warned, int32(i))
		}
		if i > start && !alike(q, &quick[start]) {
			sum.runs = append(sum.runs, runOf(quick, start, i))
			start = i
		}
	}
	if start < len(quick) {
		sum.runs = append(sum.runs, runOf(quick, start, len(quick)))
	}
	return sum
}

// selectsAsBefore reports whether the type spliced from prevT by sp, with
// fresh policies selecting as freshQuick, selects as prevT does: each
// fresh policy took the place of a removed one (one policy changed, the
// common case), selects alike and has warnings as it had. prevT's quick
// array, and its summary (alike is an equivalence, so the runs keep their
// bounds), then hold for the new type. Summarizing 10,000 policies took a
// fifth of the first view after a change.
func selectsAsBefore(prevT *typeIndex, sp splicing, freshQuick []quickSel) bool {
	if len(sp.removed) != len(freshQuick) {
		return false
	}
	for j := range freshQuick {
		old := sp.removed[j]
		if sp.freshIndex(j) != old || !alike(&freshQuick[j], &prevT.quick[old]) || freshQuick[j].warned != prevT.quick[old].warned {
			return false
		}
	}
	return true
}

// alike: q and o select alike (both by selectsDP, or the same way). The
// scopes of a type's policies are mostly one interned slice: compared by
// address first.
func alike(q, o *quickSel) bool {
	if q.kind != o.kind || len(q.scope) != len(o.scope) || len(q.service) != len(o.service) {
		return false
	}
	if q.kind == quickNone {
		return true
	}
	if len(q.scope) > 0 && &q.scope[0] != &o.scope[0] && !slices.Equal(q.scope, o.scope) {
		return false
	}
	return q.service == o.service
}

func runOf(quick []quickSel, start, end int) selectionRun {
	r := selectionRun{start: int32(start), end: int32(end)}
	if q := &quick[start]; q.kind != quickNone {
		r.q = q
	}
	return r
}

// sectionFacts is what quick selectors read of a Dataplane's sections,
// read once per query: each section's service, and which sections are in
// the last scope asked about. Policies of a type mostly share a scope (a
// zone's policies carry the zone's tag), so matching 10,000 of them reads
// each section's tags once instead of once or twice per policy.
type sectionFacts struct {
	secs    []section
	service []string
	scope   []tag
	in      []bool
}

func newSectionFacts(secs []section) *sectionFacts {
	f := &sectionFacts{secs: secs, service: make([]string, len(secs))}
	for j := range secs {
		f.service[j] = sectionService(&secs[j])
	}
	return f
}

func (f *sectionFacts) inScope(scope []tag) []bool {
	if f.in != nil && sameTags(f.scope, scope) {
		return f.in
	}
	if f.in == nil {
		f.in = make([]bool, len(f.secs))
	}
	f.scope = scope
	for j := range f.secs {
		f.in[j] = inScope(scope, &f.secs[j])
	}
	return f.in
}

// quickSel is what selecting needs of the most common top-level targetRefs
// (kind Mesh, or MeshService by name, without proxyTypes),
// kept in an array beside a type's policies. Matching 100,000 policies then
// reads one array in order instead of every policy's definition, a cache
// miss each: the largest part of a `_rules` query at that size once folds
// stopped walking saturated patches.
type quickSel struct {
	kind quickKind
	// warned: the policy has warnings of its own (typeSummary.warned).
	warned  bool
	scope   []tag  // the policy's scope (shared with its definition)
	service string // quickService: the kuma.io/service it selects
}

// sameTags: equal tag lists; the implicit scopes are shared (refTable),
// so equal ones are mostly the same slice.
func sameTags(a, b []tag) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0] || slices.Equal(a, b)
}

// inScope reports whether sec carries every tag of the scope.
func inScope(scope []tag, sec *section) bool {
	for _, t := range scope {
		if sec.tags[t.key] != t.value {
			return false
		}
	}
	return true
}

type quickKind uint8

const (
	quickNone    quickKind = iota // selectsSection decides
	quickAll                      // selects every section
	quickService                  // selects sections (not listeners) of service
)

func quickSelOf(p *policy) quickSel {
	q := selectorOf(p)
	q.warned = len(p.warnings) > 0
	return q
}

func selectorOf(p *policy) quickSel {
	ref := p.top
	if len(ref.ProxyTypes) > 0 {
		return quickSel{}
	}
	switch ref.Kind {
	case resource.KindMesh:
		return quickSel{kind: quickAll, scope: p.scope}
	case resource.KindMeshService:
		if ref.Name == "" {
			return quickSel{} // selected by labels: selectsSection decides
		}
		return quickSel{kind: quickService, scope: p.scope, service: ref.Name}
	}
	return quickSel{}
}

// selectsSectionAt is selectsSection for t.policies[i].
func (s *MeshSnapshot) selectsSectionAt(t *typeIndex, i int, dp *dataplane, sec *section) bool {
	if q := &t.quick[i]; q.kind != quickNone {
		return q.selects(inScope(q.scope, sec), sectionService(sec))
	}
	return s.selectsSection(t.policies[i], dp, sec, 0)
}

// selects reports whether q selects a section given whether the section
// is in q's scope and its sectionService.
func (q *quickSel) selects(inScope bool, service string) bool {
	return inScope && (q.kind == quickAll || service == q.service)
}

// sectionService is the service a MeshService top-level targetRef selects
// sec by: its kuma.io/service tag, "" for a listener (which no quick
// selector selects by service: theirs always name one).
func sectionService(sec *section) string {
	if sec.kind == sectionListener {
		return ""
	}
	return sec.tags[resource.ServiceTag]
}

// lookupRoutes resolves a targetRef of kind MeshHTTPRoute: by labels, or by
// name in the reference's namespace (empty = the policy's own), then in the
// system namespace, then by display name (a synced copy).
func (s *MeshSnapshot) lookupRoutes(ref *targetRef, ownNS string) []*policy {
	if ref.Name == "" {
		var out []*policy
		for _, key := range sortedNSKeys(s.routes) {
			if r := s.routes[key]; hasLabels(r.labels, ref.Labels) {
				out = append(out, r)
			}
		}
		return out
	}
	ns := s.normNS(ref.Namespace)
	if ref.Namespace == "" {
		ns = ownNS
	}
	for _, key := range []nsName{{ns, ref.Name}, {"", ref.Name}} {
		if r := s.routes[key]; r != nil {
			return []*policy{r}
		}
	}
	var out []*policy
	for _, r := range s.routeByName[ref.Name] {
		if ns == "" || r.ownNS == ns {
			out = append(out, r)
		}
	}
	return out
}

// sortedNSKeys returns m's keys ordered by namespace, then name, so that
// label lookups give the same answer on every run.
func sortedNSKeys[V any](m map[nsName]V) []nsName {
	keys := make([]nsName, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b nsName) int {
		return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.name, b.name))
	})
	return keys
}

func (s *MeshSnapshot) normNS(ns string) string {
	if ns == s.sysNS {
		return ""
	}
	return ns
}

// checkTop reports a top-level reference that cannot resolve.
func (b *builder) checkTop(p *policy) string {
	switch p.top.Kind {
	case resource.KindMeshGateway:
		if b.s.gateways[p.top.Name] == nil {
			return policyWarning(p, "spec.targetRef: MeshGateway %q not found: the policy selects nothing", p.top.Name)
		}
	case resource.KindMeshHTTPRoute:
		if len(b.s.lookupRoutes(p.top, p.ownNS)) == 0 {
			return policyWarning(p, "spec.targetRef: MeshHTTPRoute %q not found: the policy selects nothing", refName(p.top))
		}
	}
	return ""
}

func refName(ref *targetRef) string {
	if ref.Name != "" {
		return ref.Name
	}
	return "with labels " + formatTags(ref.Labels)
}

// toTarget is what a to-entry selects, resolved once per snapshot.
type toTarget struct {
	all      bool           // kind Mesh: every outbound
	services []svcMatch     // outbounds by service tag
	backends []backendMatch // outbounds by backendRef
	routes   []*policy      // kind MeshHTTPRoute: route-level confs
}

// backendMatch selects the outbounds whose backendRef names key
// ("Kind/name"), to port when it is not 0.
type backendMatch struct {
	key  string
	port int
}

// svcMatch selects outbounds by kuma.io/service, constrained by
// k8s.kuma.io/namespace and kuma.io/zone where both sides know them, and
// to one destination port when port is not 0 (a sectionName).
type svcMatch struct {
	service, ns, zone string
	port              int
}

func (m svcMatch) matches(o *outbound) bool {
	if m.port != 0 && o.destPort != m.port {
		return false
	}
	if m.ns != "" {
		if v, ok := o.tags[resource.LabelNamespace]; ok && v != m.ns {
			return false
		}
	}
	if m.zone != "" {
		if v, ok := o.tags[resource.LabelZone]; ok && v != m.zone {
			return false
		}
	}
	return o.service == m.service
}

// resolveTo resolves a to-entry's targetRef (docs/policy.md#selection).
func (b *builder) resolveTo(p *policy, e *entry) *toTarget {
	ref := e.ref
	switch ref.Kind {
	case resource.KindMesh:
		return b.everyOutbound()
	case resource.KindMeshService:
		return b.resolveService(p, e)
	case resource.KindMeshExternalService:
		return b.resolveResource(p, e, b.s.externals, b.s.extByName)
	case resource.KindMeshMultiZoneService:
		return b.resolveResource(p, e, b.s.multis, b.s.multiByName)
	case resource.KindMeshHTTPRoute:
		routes := b.s.lookupRoutes(ref, p.ownNS)
		if len(routes) == 0 {
			p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: MeshHTTPRoute %q not found", e.index, refName(ref)))
		}
		return &toTarget{routes: routes}
	}
	p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: kind %q cannot select outbounds", e.index, ref.Kind))
	return &toTarget{}
}

// resolveService resolves a MeshService reference through MeshService
// resources when one exists, so a renamed synced copy is found; otherwise it
// falls back to the kuma.io/service tag (and namespace) of outbounds. A
// sectionName narrows it to the outbounds of that port; a service without
// such a port gives nothing (docs/policy.md#selection). A Kubernetes-style
// service name (name_namespace_svc_port) names the MeshService of that
// name and namespace, on that port, as Kuma resolves it.
func (b *builder) resolveService(p *policy, e *entry) *toTarget {
	ref := e.ref
	if t := b.resolveKubeService(p, e); t != nil {
		return t
	}
	ns := b.normNS(ref.Namespace)
	if ref.Namespace == "" {
		ns = p.ownNS // empty namespace = the policy's own
	}
	services := b.findServices(ref, ns)
	t := &toTarget{}
	for _, ms := range services {
		port := 0
		if ref.SectionName != "" {
			var ok bool
			if port, ok = portNamed(ms.ports, ref.SectionName); !ok {
				p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: MeshService %q has no port %q: the entry applies to none of its outbounds",
					e.index, ms.display, ref.SectionName))
				continue
			}
		}
		t.addService(ms, port)
	}
	if len(services) > 0 {
		return t
	}
	port := 0
	if ref.SectionName != "" {
		// No resource says which ports the service has: a section names
		// a port by its number, or nothing.
		n, err := strconv.Atoi(ref.SectionName)
		if err != nil || n < 1 {
			return t
		}
		port = n
	}
	switch {
	case ref.Name != "":
		t.services = []svcMatch{{service: ref.Name, ns: ns, port: port}}
	case ref.Labels[resource.LabelDisplayName] != "":
		l := ref.Labels
		t.services = []svcMatch{{service: l[resource.LabelDisplayName], ns: b.normNS(l[resource.LabelNamespace]), zone: l[resource.LabelZone], port: port}}
	default:
		p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: no MeshService has labels %s", e.index, formatTags(ref.Labels)))
	}
	return t
}

// addService selects the outbounds of ms (to port, when not 0).
func (t *toTarget) addService(ms *meshService, port int) {
	t.services = append(t.services, svcMatch{service: ms.display, ns: ms.origNS, zone: ms.zone, port: port})
	t.backends = append(t.backends, backendMatch{key: resource.KindMeshService + "/" + ms.res.Name, port: port})
}

// resolveKubeService resolves a MeshService reference by a Kubernetes-style
// service name without sectionName to the MeshServices of that display
// name in that namespace, on that port (all ports for a headless name);
// nil when the name is not of that form or no such MeshService exists.
// Outbounds still carrying the name as their kuma.io/service tag are
// selected too.
func (b *builder) resolveKubeService(p *policy, e *entry) *toTarget {
	ref := e.ref
	if ref.SectionName != "" || ref.Name == "" {
		return nil
	}
	name, ns, port, ok := parseKubeService(ref.Name)
	if !ok {
		return nil
	}
	var found []*meshService
	for _, ms := range b.s.svcByName[name] {
		if ms.origNS == b.normNS(ns) {
			found = append(found, ms)
		}
	}
	if len(found) == 0 {
		return nil
	}
	t := &toTarget{services: []svcMatch{{service: ref.Name}}}
	for _, ms := range found {
		if port == 0 || hasPort(ms.ports, port) {
			t.addService(ms, port)
			continue
		}
		p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: MeshService %q of namespace %q has no port %d: the entry applies to none of its outbounds",
			e.index, name, ns, port))
	}
	return t
}

// findServices: by labels; else by name and namespace; else a synced copy
// by its display name and original namespace.
func (b *builder) findServices(ref *targetRef, ns string) []*meshService {
	var out []*meshService
	if ref.Name == "" {
		for _, key := range sortedNSKeys(b.s.services) {
			if ms := b.s.services[key]; hasLabels(ms.res.Labels, ref.Labels) {
				out = append(out, ms)
			}
		}
		return out
	}
	if ms := b.s.services[nsName{ns, ref.Name}]; ms != nil {
		return []*meshService{ms}
	}
	for _, ms := range b.s.svcByName[ref.Name] {
		if ms.origNS == ns || (ns == "" && ms.res.Labels.Get(resource.LabelDisplayName) != "") {
			out = append(out, ms)
		}
	}
	return out
}

// resolveResource resolves a to-entry naming a MeshExternalService or a
// MeshMultiZoneService (byKey, byName: that kind's resources): by labels, by
// stored name, else by display name (a synced copy). Outbounds match by
// backendRef, or by the service tag carrying the display name.
func (b *builder) resolveResource(p *policy, e *entry, byKey map[nsName]*resource.Resource, byName map[string][]*resource.Resource) *toTarget {
	ref := e.ref
	t := &toTarget{}
	var found []*resource.Resource
	if ref.Name == "" {
		for _, key := range sortedNSKeys(byKey) {
			if r := byKey[key]; hasLabels(r.Labels, ref.Labels) {
				found = append(found, r)
			}
		}
	} else if r := byKey[nsName{b.normNS(ref.Namespace), ref.Name}]; r != nil {
		found = []*resource.Resource{r}
	} else {
		found = byName[ref.Name]
	}
	for _, r := range found {
		port := 0
		if ref.SectionName != "" {
			var ok bool
			if port, ok = portNamed(portsOf(r), ref.SectionName); !ok {
				p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: %s %q has no port %q: the entry applies to none of its outbounds",
					e.index, ref.Kind, r.DisplayName(), ref.SectionName))
				continue
			}
		}
		t.services = append(t.services, svcMatch{service: r.DisplayName(), port: port})
		t.backends = append(t.backends, backendMatch{key: ref.Kind + "/" + r.Name, port: port})
	}
	if len(found) == 0 {
		p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: %s %q not found", e.index, ref.Kind, refName(ref)))
		if ref.Name != "" {
			t.services = []svcMatch{{service: ref.Name}}
		}
	}
	return t
}

// outbounds lists the indexes of dp's outbounds t selects, ascending and
// without duplicates.
func (t *toTarget) outbounds(dp *dataplane) []int {
	if t.all {
		all := make([]int, len(dp.outbounds))
		for i := range all {
			all[i] = i
		}
		return all
	}
	var out []int
	for _, m := range t.services {
		for _, i := range dp.byService[m.service] {
			if m.matches(dp.outbounds[i]) {
				out = append(out, i)
			}
		}
	}
	for _, m := range t.backends {
		for _, i := range dp.byBackend[m.key] {
			if m.port == 0 || dp.outbounds[i].destPort == m.port {
				out = append(out, i)
			}
		}
	}
	if len(t.services)+len(t.backends) > 1 {
		slices.Sort(out)
		out = slices.Compact(out)
	}
	return out
}

func formatTags(tags map[string]string) string {
	s := "{"
	for i, k := range sortedKeys(tags) {
		if i > 0 {
			s += ", "
		}
		s += k + ": " + tags[k]
	}
	return s + "}"
}
