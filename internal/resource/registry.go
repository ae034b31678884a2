package resource

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/meridian-mesh/meridian/internal/condition"
)

// Scope says where a type lives.
type Scope int

const (
	// ScopeMesh types belong to a mesh (every policy, Dataplane, MeshService...).
	ScopeMesh Scope = iota
	// ScopeGlobal types have no mesh (Mesh, Zone, ZoneInsight).
	ScopeGlobal
)

// Shape says how a policy type's spec is laid out.
type Shape int

const (
	// ShapeNone: not a policy (infrastructure types).
	ShapeNone Shape = iota
	// ShapeTargetRef: a targetRef policy with some of to / from / proxy-wide default.
	ShapeTargetRef
	// ShapeLegacySourceDestination: the legacy sources/destinations/conf.
	ShapeLegacySourceDestination
	// ShapeLegacySelectors: the legacy dataplane policies (selectors/conf).
	ShapeLegacySelectors
)

// TargetRef kinds (docs/policy.md#selection).
const (
	KindMesh                = "Mesh"
	KindMeshSubset          = "MeshSubset"
	KindMeshGateway         = "MeshGateway"
	KindMeshService         = "MeshService"
	KindMeshServiceSubset   = "MeshServiceSubset"
	KindMeshHTTPRoute       = "MeshHTTPRoute"
	KindMeshExternalService = "MeshExternalService"
	// Kuma 2.10+ kinds: a Dataplane (by name or labels, optionally one
	// inbound or listener by sectionName), and a service spanning zones.
	KindDataplane            = "Dataplane"
	KindMeshMultiZoneService = "MeshMultiZoneService"
)

// Sync says which directions a type crosses between global and zones. The
// finer rules (origin, role, environment, labels) live in internal/kds.
type Sync struct {
	GlobalToZone bool
	ZoneToGlobal bool
	// Relay: the global passes one zone's resources of this type on to the
	// other zones (MeshServices, endpoint summaries).
	Relay bool
	// ForZone: a global resource of this type goes only to the zone its
	// LabelForZone names (a zone's intermediate certificate).
	ForZone bool
}

// LabelForZone names the one zone a ForZone resource is for.
const LabelForZone = "meridian.io/for-zone"

// TypeDescriptor is the one place that knows a resource type. Adding a policy
// type means adding one descriptor (and its conf schema), nothing else.
type TypeDescriptor struct {
	Name   string // e.g. MeshTimeout
	Plural string // API path segment, e.g. meshtimeouts
	Scope  Scope
	Shape  Shape
	// UniversalTopLevel: in Kuma's Universal format this type's spec fields sit
	// at the top level of the document (Dataplane's networking, legacy policies'
	// sources/destinations/conf) instead of under "spec".
	UniversalTopLevel bool

	// For ShapeTargetRef: which arrays the spec has and which targetRef kinds
	// each level accepts.
	TopLevelKinds []string
	To            bool
	ToKinds       []string
	From          bool
	FromKinds     []string
	ProxyWide     bool // a top-level "default" (MeshTrace, MeshMetric, MeshProxyPatch)
	Rules         bool // to[].rules (MeshHTTPRoute, MeshTCPRoute)
	// OneRule: to[].rules holds at most one rule and may be left out, when
	// the entry's target takes all the traffic (MeshTCPRoute: a TCP route
	// has no matches to tell rules apart).
	OneRule bool
	// InboundRules: a top-level spec.rules list (Kuma 2.10+ inbound
	// policies): each item's default applies to all inbound traffic of the
	// selected proxies. RuleConf, when set, validates a rule's default
	// instead of Conf (MeshTrafficPermission's allow/deny lists).
	InboundRules bool
	RuleConf     *Schema
	// ToOnlyForGateways: to[] is allowed only when the top-level targetRef
	// may select gateways (MeshRateLimit).
	ToOnlyForGateways bool

	// AppendFields are conf fields whose lists concatenate on merge instead of
	// being replaced (docs/policy.md#merging).
	AppendFields []string

	// Conf validates one conf block (a default/override, or a legacy conf).
	// Spec validates the whole spec of non-policy types. Either may be nil.
	Conf *Schema
	Spec *Schema

	Sync Sync
	// Secret: the type holds key material. Only admins read it, stores seal
	// it at rest, and its copies keep their names in zones so references
	// by name (`secret: NAME`) resolve there.
	Secret bool
	// KeyMaterial: the type's spec may hold inline private keys (a
	// provided CA's key, a client key); non-admin readers get them
	// redacted.
	KeyMaterial bool
	// SystemOnly: only the control plane writes resources of this type
	// (its controllers and sync); the API refuses writes and deletes.
	SystemOnly bool
	// Internal: the control plane's private state (a CA's key): never
	// served by the API or the console, never synced.
	Internal bool
}

// SecretTypes are the names of the types marked Secret in reg.
func (reg *Registry) SecretTypes() []string {
	var out []string
	for _, n := range reg.Names() {
		if d, _ := reg.Lookup(n); d.Secret {
			out = append(out, n)
		}
	}
	return out
}

// IsPolicy reports whether the type is a policy (targetRef or legacy).
func (d *TypeDescriptor) IsPolicy() bool { return d.Shape != ShapeNone }

// Registry maps type names and plurals to descriptors. It is built once by
// NewRegistry and read-only afterwards, so it is safe for concurrent use.
type Registry struct {
	byName   map[string]*TypeDescriptor
	byPlural map[string]*TypeDescriptor
	names    []string
	// cond compiles `when` expressions, for validation and for the
	// policy engine (Conditions), so both use one CEL environment.
	cond *condition.Env
	// vocab: the strings every spec repeats, decoded without allocating
	// (internTable).
	vocab internTable
	// scratch lends the trees that validation and normalization parse and
	// drop their maps and arrays (scratch).
	scratch scratchPool
}

// Conditions returns the CEL environment `when` expressions are compiled
// with.
func (reg *Registry) Conditions() *condition.Env { return reg.cond }

// NewRegistry builds a registry from descriptors; duplicate names or plurals
// are a programming error and reported.
func NewRegistry(descs ...*TypeDescriptor) (*Registry, error) {
	cond, err := condition.New()
	if err != nil {
		return nil, err
	}
	reg := &Registry{byName: map[string]*TypeDescriptor{}, byPlural: map[string]*TypeDescriptor{}, cond: cond}
	for _, d := range descs {
		if d.Name == "" || d.Plural == "" {
			return nil, fmt.Errorf("type descriptor %q: name and plural are required", d.Name)
		}
		if _, dup := reg.byName[d.Name]; dup {
			return nil, fmt.Errorf("type %q registered twice", d.Name)
		}
		if _, dup := reg.byPlural[d.Plural]; dup {
			return nil, fmt.Errorf("plural %q registered twice", d.Plural)
		}
		reg.byName[d.Name] = d
		reg.byPlural[d.Plural] = d
		reg.names = append(reg.names, d.Name)
		for _, s := range []*Schema{d.Spec, d.Conf, d.RuleConf} {
			s.markDefaults()
		}
	}
	sort.Strings(reg.names)
	reg.vocab = vocabulary(descs)
	return reg, nil
}

// vocabulary is the intern table of the registry's specs: the envelope's and
// targetRef's field names, the target kinds and type names, and every field
// name and enum value of the types' schemas.
func vocabulary(descs []*TypeDescriptor) internTable {
	t := internTable{}
	for _, s := range []string{"type", "mesh", "name", "namespace", "labels", "spec", "status", "targetRef", "kind",
		"sectionName", "proxyTypes", "tags", "to", "from", "rules", "default", "matches", "spiffeID", "value"} {
		t.add(s)
	}
	for _, k := range slices.Concat(topLevelAll(), toKindsAll()) {
		t.add(k)
	}
	for _, d := range descs {
		t.add(d.Name)
		for _, s := range []*Schema{d.Spec, d.Conf, d.RuleConf} {
			t.addSchema(s)
		}
	}
	return t
}

// Lookup finds a type by name (exact, e.g. "MeshTimeout").
func (reg *Registry) Lookup(name string) (*TypeDescriptor, bool) {
	d, ok := reg.byName[name]
	return d, ok
}

// LookupPlural finds a type by its API plural ("meshtimeouts").
func (reg *Registry) LookupPlural(plural string) (*TypeDescriptor, bool) {
	d, ok := reg.byPlural[plural]
	return d, ok
}

// Resolve finds a type by name, plural or case-insensitive name, as a CLI user
// would type it ("meshtimeout", "meshtimeouts", "MeshTimeout").
func (reg *Registry) Resolve(s string) (*TypeDescriptor, bool) {
	if d, ok := reg.byName[s]; ok {
		return d, true
	}
	low := strings.ToLower(s)
	if d, ok := reg.byPlural[low]; ok {
		return d, true
	}
	for _, n := range reg.names {
		if strings.ToLower(n) == low {
			return reg.byName[n], true
		}
	}
	return nil, false
}

// Names lists every registered type name, sorted.
func (reg *Registry) Names() []string { return append([]string(nil), reg.names...) }

// Kind lists per level, as functions so every descriptor owns fresh slices
// (DefaultTypes promises fresh descriptors; a shared slice would let one
// caller's change leak into every registry).
func topLevelAll() []string {
	return []string{KindMesh, KindDataplane, KindMeshSubset, KindMeshService, KindMeshServiceSubset, KindMeshGateway, KindMeshHTTPRoute}
}

func topLevelNoRt() []string {
	return []string{KindMesh, KindDataplane, KindMeshSubset, KindMeshService, KindMeshServiceSubset, KindMeshGateway}
}

func toKindsAll() []string {
	return []string{KindMesh, KindMeshService, KindMeshExternalService, KindMeshMultiZoneService, KindMeshHTTPRoute}
}

func toKindsNoRt() []string {
	return []string{KindMesh, KindMeshService, KindMeshExternalService, KindMeshMultiZoneService}
}

// routeToKinds: routes attach to a service, or to all traffic of a
// MeshGateway (kind Mesh, allowed only with a top-level MeshGateway).
func routeToKinds() []string {
	return []string{KindMesh, KindMeshService, KindMeshExternalService, KindMeshMultiZoneService}
}

func fromKinds() []string {
	return []string{KindMesh, KindMeshSubset, KindMeshService, KindMeshServiceSubset}
}

// DefaultTypes returns fresh descriptors of every type docs/resources.md lists.
func DefaultTypes() []*TypeDescriptor {
	globalToZone := Sync{GlobalToZone: true}
	bothWays := Sync{GlobalToZone: true, ZoneToGlobal: true}
	return []*TypeDescriptor{
		// Infrastructure.
		{Name: "Mesh", Plural: "meshes", Scope: ScopeGlobal, UniversalTopLevel: true, Spec: meshSpec(), Sync: globalToZone, KeyMaterial: true},
		{Name: "Zone", Plural: "zones", Scope: ScopeGlobal, UniversalTopLevel: true, Spec: zoneSpec()},
		{Name: "ZoneInsight", Plural: "zoneinsights", Scope: ScopeGlobal, Spec: openSpec()},
		{Name: "Dataplane", Plural: "dataplanes", UniversalTopLevel: true, Spec: dataplaneSpec(), Sync: Sync{ZoneToGlobal: true}},
		{Name: "MeshService", Plural: "meshservices", Spec: meshServiceSpec(), Sync: Sync{GlobalToZone: true, ZoneToGlobal: true, Relay: true}},
		{Name: "MeshExternalService", Plural: "meshexternalservices", Spec: meshExternalServiceSpec(), Sync: globalToZone, KeyMaterial: true},
		{Name: "MeshGateway", Plural: "meshgateways", UniversalTopLevel: true, Spec: meshGatewaySpec(), Sync: globalToZone},
		{Name: "MeshMultiZoneService", Plural: "meshmultizoneservices", Spec: meshMultiZoneServiceSpec(), Sync: globalToZone},
		{Name: "ExternalService", Plural: "externalservices", UniversalTopLevel: true, Spec: externalServiceSpec(), Sync: globalToZone, KeyMaterial: true},
		{Name: "MeshIdentity", Plural: "meshidentities", Spec: meshIdentitySpec(), Sync: globalToZone, KeyMaterial: true},
		{Name: "MeshTrust", Plural: "meshtrusts", Spec: meshTrustSpec(), Sync: bothWays},
		{Name: "MeshOpenTelemetryBackend", Plural: "meshopentelemetrybackends", Spec: meshOpenTelemetryBackendSpec(), Sync: bothWays},
		{Name: "Secret", Plural: "secrets", UniversalTopLevel: true, Spec: secretSpec(), Sync: globalToZone, Secret: true},
		{Name: "GlobalSecret", Plural: "globalsecrets", Scope: ScopeGlobal, UniversalTopLevel: true, Spec: secretSpec(),
			Sync: globalToZone, Secret: true},
		// The data plane's system resources (docs/dataplane.md): a zone's
		// request for its intermediate of a mesh's CA and the global's
		// answer, and a zone's endpoints of a service for the other zones.
		{Name: "ZoneCertificateRequest", Plural: "zonecertificaterequests", Spec: zoneCertificateRequestSpec(),
			Sync: Sync{ZoneToGlobal: true}, SystemOnly: true},
		{Name: "ZoneCertificate", Plural: "zonecertificates", Spec: zoneCertificateSpec(),
			Sync: Sync{GlobalToZone: true, ForZone: true}, SystemOnly: true},
		{Name: "ZoneEndpoints", Plural: "zoneendpoints", Spec: zoneEndpointsSpec(),
			Sync: Sync{GlobalToZone: true, ZoneToGlobal: true, Relay: true}, SystemOnly: true},
		// A mesh CA backend's root (on the global, or a standalone zone)
		// and a zone's intermediate key: sealed at rest, never served.
		{Name: "MeshCA", Plural: "meshcas", Spec: meshCASpec(), Secret: true, SystemOnly: true, Internal: true},
		{Name: "ZoneCA", Plural: "zonecas", Spec: zoneCASpec(), Secret: true, SystemOnly: true, Internal: true},

		// targetRef policies.
		{Name: "MeshTrafficPermission", Plural: "meshtrafficpermissions", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), From: true, FromKinds: fromKinds(), Conf: meshTrafficPermissionConf(),
			InboundRules: true, RuleConf: meshTrafficPermissionRuleConf(), AppendFields: mtpRuleLists(), Sync: bothWays},
		{Name: "MeshTimeout", Plural: "meshtimeouts", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelAll(), To: true, ToKinds: toKindsAll(), From: true, FromKinds: fromKinds(), InboundRules: true,
			Conf: meshTimeoutConf(), Sync: bothWays},
		{Name: "MeshRetry", Plural: "meshretries", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelAll(), To: true, ToKinds: toKindsAll(), Conf: meshRetryConf(), Sync: bothWays},
		{Name: "MeshCircuitBreaker", Plural: "meshcircuitbreakers", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), To: true, ToKinds: toKindsNoRt(), From: true, FromKinds: fromKinds(), InboundRules: true,
			Conf: meshCircuitBreakerConf(), Sync: bothWays},
		{Name: "MeshHealthCheck", Plural: "meshhealthchecks", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), To: true, ToKinds: toKindsNoRt(), Conf: meshHealthCheckConf(), Sync: bothWays},
		{Name: "MeshRateLimit", Plural: "meshratelimits", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelAll(), From: true, FromKinds: fromKinds(), InboundRules: true,
			To: true, ToKinds: []string{KindMesh}, ToOnlyForGateways: true, Conf: meshRateLimitConf(), Sync: bothWays},
		{Name: "MeshFaultInjection", Plural: "meshfaultinjections", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), From: true, FromKinds: fromKinds(), InboundRules: true,
			Conf: meshFaultInjectionConf(), Sync: bothWays},
		{Name: "MeshAccessLog", Plural: "meshaccesslogs", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelAll(), To: true, ToKinds: toKindsAll(), From: true, FromKinds: fromKinds(), InboundRules: true,
			Conf: meshAccessLogConf(), Sync: bothWays},
		{Name: "MeshLoadBalancingStrategy", Plural: "meshloadbalancingstrategies", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), To: true, ToKinds: toKindsNoRt(), Conf: meshLoadBalancingStrategyConf(), Sync: bothWays},
		{Name: "MeshTrace", Plural: "meshtraces", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), ProxyWide: true, Conf: meshTraceConf(), Sync: bothWays},
		{Name: "MeshMetric", Plural: "meshmetrics", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), ProxyWide: true, Conf: meshMetricConf(), Sync: bothWays},
		{Name: "MeshProxyPatch", Plural: "meshproxypatches", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), ProxyWide: true, AppendFields: []string{"appendModifications"}, Conf: meshProxyPatchConf(), Sync: bothWays},
		{Name: "MeshPassthrough", Plural: "meshpassthroughs", Shape: ShapeTargetRef,
			TopLevelKinds: []string{KindMesh, KindDataplane, KindMeshSubset}, ProxyWide: true, AppendFields: []string{"appendMatch"},
			Conf: meshPassthroughConf(), Sync: bothWays},
		{Name: "MeshTLS", Plural: "meshtlses", Shape: ShapeTargetRef,
			TopLevelKinds: []string{KindMesh, KindDataplane, KindMeshSubset, KindMeshService, KindMeshServiceSubset},
			From:          true, FromKinds: []string{KindMesh}, InboundRules: true, Conf: meshTLSConf(), Sync: bothWays},
		{Name: "MeshHTTPRoute", Plural: "meshhttproutes", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), To: true, ToKinds: routeToKinds(), Rules: true, Conf: meshHTTPRouteRule(), Sync: bothWays},
		{Name: "MeshTCPRoute", Plural: "meshtcproutes", Shape: ShapeTargetRef,
			TopLevelKinds: topLevelNoRt(), To: true, ToKinds: routeToKinds(), Rules: true, OneRule: true, Conf: meshTCPRouteRule(), Sync: bothWays},

		// Legacy source/destination policies.
		legacy("TrafficPermission", "trafficpermissions", ShapeLegacySourceDestination, trafficPermissionConf()),
		legacy("TrafficRoute", "trafficroutes", ShapeLegacySourceDestination, trafficRouteConf()),
		legacy("TrafficLog", "trafficlogs", ShapeLegacySourceDestination, trafficLogConf()),
		legacy("TrafficTrace", "traffictraces", ShapeLegacySelectors, trafficTraceConf()),
		legacy("HealthCheck", "healthchecks", ShapeLegacySourceDestination, healthCheckConf()),
		legacy("CircuitBreaker", "circuitbreakers", ShapeLegacySourceDestination, circuitBreakerConf()),
		legacy("FaultInjection", "faultinjections", ShapeLegacySourceDestination, faultInjectionConf()),
		legacy("Retry", "retries", ShapeLegacySourceDestination, retryConf()),
		legacy("Timeout", "timeouts", ShapeLegacySourceDestination, timeoutConf()),
		legacy("RateLimit", "ratelimits", ShapeLegacySourceDestination, rateLimitConf()),
		legacy("ProxyTemplate", "proxytemplates", ShapeLegacySelectors, proxyTemplateConf()),
	}
}

func legacy(name, plural string, shape Shape, conf *Schema) *TypeDescriptor {
	return &TypeDescriptor{Name: name, Plural: plural, Shape: shape, UniversalTopLevel: true,
		Conf: conf, Spec: legacySpec(shape, conf), Sync: Sync{GlobalToZone: true}}
}

// NewDefaultRegistry returns a registry of DefaultTypes.
func NewDefaultRegistry() *Registry {
	r, err := NewRegistry(DefaultTypes()...)
	if err != nil {
		panic(err) // DefaultTypes is static; a duplicate is a bug caught by every test.
	}
	return r
}

// RedactKeyMaterial replaces, in spec, the inline value of every data
// source named like a private key (a member whose name ends in "key",
// whatever the case, holding {"inline": ...} or {"inlineString": ...}) with
// "REDACTED". It reports whether it redacted anything (a spec that does
// not parse is left alone: stored specs are valid JSON).
func RedactKeyMaterial(spec json.RawMessage) (json.RawMessage, bool) {
	var v any
	if json.Unmarshal(spec, &v) != nil || !redactKeys(v) {
		return spec, false
	}
	out, err := json.Marshal(v)
	if err != nil {
		return spec, false
	}
	return out, true
}

func redactKeys(v any) bool {
	changed := false
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if src, ok := val.(map[string]any); ok && strings.HasSuffix(strings.ToLower(k), "key") {
				for _, f := range []string{"inline", "inlineString"} {
					if _, ok := src[f]; ok {
						src[f] = "REDACTED"
						changed = true
					}
				}
			}
			changed = redactKeys(val) || changed
		}
	case []any:
		for _, val := range x {
			changed = redactKeys(val) || changed
		}
	}
	return changed
}
