package policy

import (
	"cmp"
	"slices"

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
		// Kuma: a Dataplane targetRef selects inbounds and listeners, never
		// a builtin gateway.
		return sec.kind != sectionGateway && s.selectsDataplane(p, dp) &&
			(ref.SectionName == "" || ref.SectionName == sec.name)
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
		return tagListMatch(p.topTags, tags)
	case resource.KindMeshService:
		return tags[resource.ServiceTag] == ref.Name
	case resource.KindMeshServiceSubset:
		return tags[resource.ServiceTag] == ref.Name && tagListMatch(p.topTags, tags)
	case resource.KindMeshGateway:
		return proxyType == "Gateway" && s.gatewaySelects(ref, tags)
	}
	return false
}

// selectsDataplane: a Dataplane targetRef names dp by labels (all of them
// on the Dataplane), by name in a namespace (the reference's, else the
// policy's own, as Kuma resolves it), or, with neither, every Dataplane.
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
		return dp.res.Name == ref.Name && dp.ns == ns
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
func (s *MeshSnapshot) matchedPolicies(t *typeIndex, dp *dataplane) []bool {
	matched := make([]bool, len(t.policies))
	for i, p := range t.policies {
		if t.quick[i].kind == quickNone {
			matched[i] = s.selectsDP(p, dp)
			continue
		}
		for j := range dp.sections {
			if s.selectsSectionAt(t, i, dp, &dp.sections[j]) {
				matched[i] = true
				break
			}
		}
	}
	return matched
}

// quickSel is what selecting needs of the most common top-level targetRefs
// (kind Mesh, or MeshService by name, without proxyTypes),
// kept in an array beside a type's policies. Matching 100,000 policies then
// reads one array in order instead of every policy's definition, a cache
// miss each: the largest part of a `_rules` query at that size once folds
// stopped walking saturated patches.
type quickSel struct {
	kind    quickKind
	scope   []tag  // the policy's scope (shared with its definition)
	service string // quickService: the kuma.io/service it selects
}

// inScope reports whether sec carries every tag of the scope.
func (q *quickSel) inScope(sec *section) bool {
	for _, t := range q.scope {
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
	ref := p.top
	if len(ref.ProxyTypes) > 0 {
		return quickSel{}
	}
	switch ref.Kind {
	case resource.KindMesh:
		return quickSel{kind: quickAll, scope: p.scope}
	case resource.KindMeshService:
		return quickSel{kind: quickService, scope: p.scope, service: ref.Name}
	}
	return quickSel{}
}

// selectsSectionAt is selectsSection for t.policies[i].
func (s *MeshSnapshot) selectsSectionAt(t *typeIndex, i int, dp *dataplane, sec *section) bool {
	switch q := &t.quick[i]; q.kind {
	case quickAll:
		return q.inScope(sec)
	case quickService:
		return q.inScope(sec) && sec.kind != sectionListener && sec.tags[resource.ServiceTag] == q.service
	}
	return s.selectsSection(t.policies[i], dp, sec, 0)
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
	all      bool       // kind Mesh: every outbound
	services []svcMatch // outbounds by service tag
	backends []string   // outbounds by backendRef "Kind/name"
	routes   []*policy  // kind MeshHTTPRoute: route-level confs
}

// svcMatch selects outbounds by kuma.io/service, constrained by
// k8s.kuma.io/namespace and kuma.io/zone where both sides know them.
type svcMatch struct{ service, ns, zone string }

func (m svcMatch) matches(o *outbound) bool {
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
// falls back to the kuma.io/service tag (and namespace) of outbounds.
func (b *builder) resolveService(p *policy, e *entry) *toTarget {
	ref := e.ref
	ns := b.normNS(ref.Namespace)
	if ref.Namespace == "" {
		ns = p.ownNS // empty namespace = the policy's own
	}
	services := b.findServices(ref, ns)
	t := &toTarget{}
	for _, ms := range services {
		t.services = append(t.services, svcMatch{service: ms.display, ns: ms.origNS, zone: ms.zone})
		t.backends = append(t.backends, resource.KindMeshService+"/"+ms.res.Name)
	}
	if len(services) > 0 {
		return t
	}
	switch {
	case ref.Name != "":
		t.services = []svcMatch{{service: ref.Name, ns: ns}}
	case ref.Labels[resource.LabelDisplayName] != "":
		l := ref.Labels
		t.services = []svcMatch{{service: l[resource.LabelDisplayName], ns: b.normNS(l[resource.LabelNamespace]), zone: l[resource.LabelZone]}}
	default:
		p.warnings = append(p.warnings, policyWarning(p, "spec.to[%d].targetRef: no MeshService has labels %s", e.index, formatTags(ref.Labels)))
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
		t.services = append(t.services, svcMatch{service: r.DisplayName()})
		t.backends = append(t.backends, ref.Kind+"/"+r.Name)
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
	for _, key := range t.backends {
		out = append(out, dp.byBackend[key]...)
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
