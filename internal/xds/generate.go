package xds

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Rendering a proxy's configuration for proxyless gRPC (docs/dataplane.md#resources):
// a pure function of the proxy, its effective configuration (exactly what
// `_config` shows: nothing is computed twice) and the endpoints of the
// services it may call.

// CertProvider is the certificate provider instance the agent's bootstrap
// defines (file_watcher on the workload certificate), which TLS contexts
// name for both the identity and the trust bundle.
const CertProvider = "default"

// Endpoint is one instance of a service: where it listens, its zone, its
// health and its inbound's tags.
type Endpoint struct {
	Address string
	Port    int
	Zone    string
	Healthy bool
	Tags    map[string]string
}

// Input is what one proxy's resources are rendered from.
type Input struct {
	Dataplane *Dataplane
	// Zone is the proxy's zone: its endpoints' locality priority 0.
	Zone string
	// Config is the proxy's effective configuration (_config).
	Config *policy.ConfigResult
	// Endpoints are the endpoints of every service of the mesh, by service.
	Endpoints map[string][]Endpoint
	// MTLS says the mesh has mTLS: TLS with the workload certificate both
	// ways, and MeshTrafficPermission enforced by the servers.
	MTLS bool
	// Faults, when set, finds what a destination's inbound
	// MeshFaultInjection gives this proxy as a client; nil injects none.
	Faults *Faults
	// LoadAssignments, when set, are the shared assignments of Endpoints
	// seen from Zone (rendered once for many proxies); nil renders them
	// for this proxy alone.
	LoadAssignments *LoadAssignments
	// Previous, when set, is the proxy's previous rendering (of the same
	// kind), whose parts are reused where their inputs did not change
	// (fragment.go). Its digests must be complete (the server's Set does
	// that).
	Previous *Resources
	// AccessLogPipe is where an Envoy sidecar's agent reads access log
	// lines for tcp backends (node metadata meridian.io/access-log-pipe);
	// "" when it reads none.
	AccessLogPipe string
	// OTelBackends are the mesh's MeshOpenTelemetryBackends (otelBackends),
	// which OpenTelemetry backends reference by labels.
	OTelBackends []OTelBackend
}

// Resources are a proxy's resources by type, with the policies that shaped
// each (Shaped, by type URL and resource name) and what could not be
// carried (Dropped, docs/dataplane.md#not-enforceable).
type Resources struct {
	Listeners, Routes, Clusters, Endpoints []types.Resource
	Dropped                                []string
	// shaped are the policies behind each resource (Shaped), in the order
	// they were recorded, as the engine's origin lists: names and the map
	// by type and resource are made only when asked for (a status, a
	// config dump), not per rendering.
	shaped []fragmentShape
	// carried are the origin lists of the policies the resources carry,
	// for Touched.
	carried [][]policy.Origin
	// Touched are the policies that shaped the resources or were left out
	// of them, with what was left out: what the policies' Programmed
	// condition aggregates (docs/dataplane.md#programmed).
	Touched map[PolicyRef]*Touch
	// sums are the encodings' digests of the resources, by list (in
	// listTypes' order) and position in it; a zero sum is unknown until
	// digestAll computes it. Shared resources come with theirs, so that
	// versions do not encode them again.
	sums [4][][sha256.Size]byte
	// fragments let the next rendering of the proxy reuse this one's
	// parts (fragment.go); reused counts the previous one's it reused.
	fragments *fragmentState
	reused    int
	// parsed is the Dataplane the resources were rendered for, which
	// the next rendering takes when its resource is the same.
	parsed parsedDataplane
	// asked are the assignments behind Endpoints, one each, in order:
	// what withAssignments takes again from other endpoints.
	asked []fragmentAssignment
}

// parsedDataplane is a Dataplane resource (stored resources are never
// changed in place) parsed in a namespace.
type parsedDataplane struct {
	res       *resource.Resource
	namespace string
	dp        *Dataplane
}

// PolicyRef names a policy: its type, name and namespace ("" for the
// system namespace).
type PolicyRef struct{ Type, Name, Namespace string }

func (r PolicyRef) String() string {
	if r.Namespace != "" {
		return r.Type + " " + r.Namespace + "/" + r.Name
	}
	return r.Type + " " + r.Name
}

func refOf(o policy.Origin) PolicyRef {
	return PolicyRef{Type: o.Type, Name: o.Name, Namespace: o.Namespace}
}

// Touch is what one policy did to one proxy's resources.
type Touch struct {
	// Carried: some of it is in the resources.
	Carried bool `json:"carried"`
	// Dropped says what of it the proxy is not given.
	Dropped []string `json:"dropped,omitempty"`
}

// touch is the record of ref, made on first use.
func (r *Resources) touch(ref PolicyRef) *Touch {
	if r.Touched == nil {
		r.Touched = map[PolicyRef]*Touch{}
	}
	t := r.Touched[ref]
	if t == nil {
		t = &Touch{}
		r.Touched[ref] = t
	}
	return t
}

// ByType are the resources by type URL.
func (r *Resources) ByType() map[string][]types.Resource {
	out := make(map[string][]types.Resource, len(listTypes))
	for i, list := range r.lists() {
		out[listTypes[i]] = *list
	}
	return out
}

// shape records that the policies of lists shaped the resource
// typeURL/name, in the fragment being rendered too.
func (g *generator) shape(typeURL, name string, lists [][]policy.Origin) {
	if g.rec != nil && len(lists) > 0 {
		g.rec.shapes = append(g.rec.shapes, fragmentShape{typeURL, name, lists})
	}
	g.out.shape(typeURL, name, lists)
}

// shape records that the policies of lists shaped the resource
// typeURL/name.
func (r *Resources) shape(typeURL, name string, lists [][]policy.Origin) {
	if len(lists) > 0 {
		r.shaped = append(r.shaped, fragmentShape{typeURL, name, lists})
	}
}

// unshape forgets the policies behind a resource a patch removed.
func (r *Resources) unshape(typeURL, name string) {
	r.shaped = slices.DeleteFunc(r.shaped, func(s fragmentShape) bool { return s.typeURL == typeURL && s.name == name })
}

// Shaped names the policies behind each resource, by type URL and
// resource name, sorted.
func (r *Resources) Shaped() map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, s := range r.shaped {
		byName := out[s.typeURL]
		if byName == nil {
			byName = map[string][]string{}
			out[s.typeURL] = byName
		}
		for _, l := range s.lists {
			byName[s.name] = append(byName[s.name], originNames(l)...)
		}
	}
	for _, byName := range out {
		for name, names := range byName {
			slices.Sort(names)
			byName[name] = slices.Compact(names)
		}
	}
	return out
}

// Generate renders in for a proxyless gRPC workload.
func Generate(in Input) (*Resources, error) {
	g := newGenerator(in)
	g.startFragments(ProxyGRPC)
	for _, svc := range g.callable() {
		if err := g.inFragment(fragmentID{kind: "client", name: svc}, g.clientKey(svc), func() error { return g.client(svc) }); err != nil {
			return nil, err
		}
	}
	for i, inb := range in.Dataplane.Inbounds {
		if err := g.server(i, inb); err != nil {
			return nil, err
		}
	}
	if err := g.emitClusters(); err != nil {
		return nil, err
	}
	g.reportNotCarried()
	return g.finish(), nil
}

// newGenerator starts a rendering of in.
func newGenerator(in Input) *generator {
	// The previous rendering's clusters and shaped resources: this
	// one's, mostly; else a cluster and about two shaped resources per
	// outbound.
	sized, shaped := len(in.Config.Outbounds), 2*len(in.Config.Outbounds)
	if in.Previous != nil {
		sized, shaped = len(in.Previous.Clusters), len(in.Previous.shaped)
	}
	g := &generator{in: in, out: &Resources{shaped: make([]fragmentShape, 0, shaped)},
		clusters: make(map[string]clusterSpec, sized), clusterNames: make([]string, 0, sized),
		assignments: in.LoadAssignments, shapes: map[string]*outboundShape{}}
	if g.assignments == nil {
		g.assignments = NewLoadAssignments(in.Endpoints, in.Zone)
	}
	return g
}

// finish completes what the rendering recorded and hands it out.
func (g *generator) finish() *Resources {
	g.out.finishTouched()
	slices.Sort(g.out.Dropped)
	g.out.Dropped = slices.Compact(g.out.Dropped)
	return g.out
}

type generator struct {
	in       Input
	out      *Resources
	clusters map[string]clusterSpec
	// clusterNames are the clusters' names in the order first named.
	clusterNames []string
	assignments  *LoadAssignments
	// shapes are what each service's outbound policies give its routes
	// and clusters (grpcpolicy.go), read once per rendering.
	shapes map[string]*outboundShape
	// about are the policies the drops being recorded are about.
	about []policy.Origin
	// prev is the previous rendering whose fragments may be reused
	// (fragment.go); rec is the fragment being rendered.
	prev *Resources
	// prevCursor is where prevFragment looks first in prev's fragments;
	// prevIndex indexes them by id once the rendering asks out of order.
	prevCursor int
	prevIndex  map[fragmentID]int
	rec        *fragment
	parts      sharedParts
	// pending are the assignments asked for by the cluster just rendered
	// or replayed, added after it (emitPending).
	pending []fragmentAssignment
	// outbounds are the Config's outbound policies by service, with
	// their policiesKey, made once per rendering.
	outbounds map[string]outboundPolicies
	// callableSvcs are the services the proxy may call (callable).
	callableSvcs []string
	// tags are the proxy's client tags (clientTags).
	tags ClientTags
	// scratch is a buffer keys are written in before they are made
	// strings; keyBuf holds the fragment key being made (inFragment).
	scratch, keyBuf []byte
}

// outboundPolicies are an outbound's policies and their policiesKey.
type outboundPolicies struct {
	policies map[string]*policy.OutboundPolicy
	key      string
	keyed    bool // key is a key (makePoliciesKey)
}

// clusterSpec is one upstream cluster: a service's endpoints, or the
// subset of them carrying tags.
type clusterSpec struct {
	service string
	tags    map[string]string
}

// callable are the services the proxy may call, sorted: those it
// declares as outbounds, else every service of the mesh but its own.
// Made once per rendering (the clients and the report of what is not
// carried both read them).
func (g *generator) callable() []string {
	if g.callableSvcs == nil {
		g.callableSvcs = g.listCallable()
	}
	return g.callableSvcs
}

func (g *generator) listCallable() []string {
	if outs := g.in.Dataplane.Outbounds; len(outs) > 0 {
		if slices.IsSorted(outs) { // as ParseDataplane leaves them
			return outs
		}
		return slices.Sorted(slices.Values(outs))
	}
	own := map[string]bool{}
	for _, in := range g.in.Dataplane.Inbounds {
		own[in.Service()] = true
	}
	var out []string
	for svc := range g.in.Endpoints {
		if !own[svc] {
			out = append(out, svc)
		}
	}
	slices.Sort(out)
	if out == nil {
		out = []string{} // listed: none
	}
	return out
}

// outboundPolicies are the confs the engine gives the proxy's outbound to
// svc (nil when it declares none).
func (g *generator) outboundPolicies(svc string) map[string]*policy.OutboundPolicy {
	return g.outbound(svc).policies
}

// outbound is svc's entry of outbounds, which it makes on first use, with
// every outbound's key: a rendering asks for them all.
func (g *generator) outbound(svc string) outboundPolicies {
	if g.outbounds == nil {
		g.outbounds = make(map[string]outboundPolicies, len(g.in.Config.Outbounds))
		for _, o := range g.in.Config.Outbounds {
			if _, dup := g.outbounds[o.Service]; !dup { // the first, as a scan in order finds
				key, ok := g.makePoliciesKey(o.Policies)
				g.outbounds[o.Service] = outboundPolicies{policies: o.Policies, key: key, keyed: ok}
			}
		}
	}
	if o, ok := g.outbounds[svc]; ok {
		return o
	}
	return outboundPolicies{keyed: true} // no outbound: no policies, the empty key
}

// client renders the API listener a client dials as xds:///svc, its route
// configuration and the clusters the routes name.
func (g *generator) client(svc string) error {
	faults, err := g.faultFilters(svc)
	if err != nil {
		return err
	}
	manager := g.scratchManager()
	manager.StatPrefix = svc
	manager.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
		ConfigSource:    g.adsSource(),
		RouteConfigName: svc,
	}}
	manager.HttpFilters = append(faults, g.routerFilter())
	api, err := anyOf(manager)
	if err != nil {
		return err
	}
	g.out.Listeners = append(g.out.Listeners, &listenerv3.Listener{
		Name:        svc,
		ApiListener: &listenerv3.ApiListener{ApiListener: api},
	})
	policies := g.outboundPolicies(svc)
	routes, shaped := g.routes(svc, policies)
	shape := g.shapeOf(svc)
	for _, r := range routes {
		if a := r.GetRoute(); a != nil {
			shape.apply(a)
		}
	}
	shaped = append(shaped, shape.routePolicies...)
	g.out.Routes = append(g.out.Routes, &routev3.RouteConfiguration{
		Name:         svc,
		VirtualHosts: []*routev3.VirtualHost{{Name: svc, Domains: []string{"*"}, Routes: routes}},
	})
	g.shape(resourcev3.RouteType, svc, shaped)
	return nil
}

// routes renders the MeshHTTPRoute rules of the outbound to svc, then the
// default route to svc's cluster.
func (g *generator) routes(svc string, policies map[string]*policy.OutboundPolicy) ([]*routev3.Route, [][]policy.Origin) {
	var out []*routev3.Route
	var shaped [][]policy.Origin
	if hr, ok := policies["MeshHTTPRoute"]; ok && hr.Conf != nil {
		var conf struct {
			Rules []httpRule `json:"rules"`
		}
		if err := json.Unmarshal(hr.Conf, &conf); err == nil {
			g.about = hr.Origin
			for i, rule := range conf.Rules {
				rs, ok := g.ruleRoutes(svc, i, rule)
				if ok {
					out = append(out, rs...)
				}
			}
			g.about = nil
			shaped = append(shaped, g.carry(hr.Origin)...)
		}
	}
	out = append(out, &routev3.Route{
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: g.cluster(svc, nil)}}},
	})
	return out, shaped
}

// httpRule is one MeshHTTPRoute rule as the engine merges it.
type httpRule struct {
	Matches []struct {
		Path *struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"path"`
		Method      string `json:"method"`
		QueryParams []any  `json:"queryParams"`
		Headers     []struct {
			Type  string `json:"type"`
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"headers"`
	} `json:"matches"`
	Default struct {
		BackendRefs []struct {
			Kind   string            `json:"kind"`
			Name   string            `json:"name"`
			Tags   map[string]string `json:"tags"`
			Weight *uint32           `json:"weight"`
		} `json:"backendRefs"`
		Filters []any `json:"filters"`
	} `json:"default"`
}

// ruleRoutes renders one rule as a route per match. A match a gRPC
// request can never satisfy (a method other than POST, query parameters)
// is left out and reported; filters are not carried by gRPC clients.
func (g *generator) ruleRoutes(svc string, i int, rule httpRule) ([]*routev3.Route, bool) {
	action, ok := g.weightedAction(svc, i, rule)
	if !ok {
		return nil, false
	}
	if len(rule.Default.Filters) > 0 {
		g.drop("MeshHTTPRoute rules[%d].default.filters of %s: gRPC clients apply no route filters", i, svc)
	}
	var out []*routev3.Route
	for j, m := range rule.Matches {
		match := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}}
		if m.Method != "" && m.Method != "POST" {
			g.drop("MeshHTTPRoute rules[%d].matches[%d] of %s: gRPC requests are POST, method %s never matches", i, j, svc, m.Method)
			continue
		}
		if len(m.QueryParams) > 0 {
			g.drop("MeshHTTPRoute rules[%d].matches[%d] of %s: gRPC requests have no query parameters", i, j, svc)
			continue
		}
		if p := m.Path; p != nil {
			switch p.Type {
			case "Exact":
				match.PathSpecifier = &routev3.RouteMatch_Path{Path: p.Value}
			case "PathPrefix":
				match.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: p.Value}
			case "RegularExpression":
				match.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: p.Value}}
			}
		}
		match.Headers = append(match.Headers, headerMatchers(m.Headers)...)
		out = append(out, &routev3.Route{Match: match, Action: &routev3.Route_Route{Route: action}})
	}
	return out, len(out) > 0
}

// weightedAction sends a rule's traffic to its backends by weight, or to
// svc when it names none.
func (g *generator) weightedAction(svc string, i int, rule httpRule) (*routev3.RouteAction, bool) {
	refs := rule.Default.BackendRefs
	if len(refs) == 0 {
		return &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: g.cluster(svc, nil)}}, true
	}
	var weighted []*routev3.WeightedCluster_ClusterWeight
	for j, ref := range refs {
		switch ref.Kind {
		case resource.KindMeshService, resource.KindMeshServiceSubset:
		default:
			g.drop("MeshHTTPRoute rules[%d].default.backendRefs[%d] of %s: kind %s has no endpoints the zone serves", i, j, svc, ref.Kind)
			continue
		}
		w := uint32(1)
		if ref.Weight != nil {
			w = *ref.Weight
		}
		if w == 0 {
			continue
		}
		weighted = append(weighted, &routev3.WeightedCluster_ClusterWeight{Name: g.cluster(ref.Name, ref.Tags), Weight: wrapperspb.UInt32(w)})
	}
	if len(weighted) == 0 {
		return nil, false
	}
	if len(weighted) == 1 {
		return &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: weighted[0].Name}}, true
	}
	return &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: weighted}}}, true
}

// cluster names (and records) the cluster of svc's endpoints carrying tags.
func (g *generator) cluster(svc string, tags map[string]string) string {
	name := svc
	if len(tags) > 0 {
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range tags {
				if !yield(k) {
					return
				}
			}
		})
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, k+"="+tags[k])
		}
		name = svc + "|" + strings.Join(parts, ",")
	}
	g.addCluster(name, clusterSpec{service: svc, tags: tags})
	if g.rec != nil {
		g.rec.clusters = append(g.rec.clusters, fragmentCluster{name, clusterSpec{service: svc, tags: tags}})
	}
	return name
}

// emitClusters renders every cluster named and its endpoints: the
// proxy's zone first (priority 0), the other zones as failover (1).
func (g *generator) emitClusters() error {
	for _, name := range g.sortedClusters() {
		spec := g.clusters[name]
		if err := g.inFragment(fragmentID{kind: "cluster", name: name}, g.clusterKey(name, spec), func() error { return g.emitCluster(name, spec) }); err != nil {
			return err
		}
		if err := g.emitPending(); err != nil {
			return err
		}
	}
	return nil
}

// addCluster names cluster name, once.
func (g *generator) addCluster(name string, spec clusterSpec) {
	if _, ok := g.clusters[name]; !ok {
		g.clusterNames = append(g.clusterNames, name)
	}
	g.clusters[name] = spec
}

// sortedClusters are the names of the clusters named, sorted: the order
// they are rendered in. They were named in the order of the services
// that name them, mostly sorted already.
func (g *generator) sortedClusters() []string {
	slices.Sort(g.clusterNames)
	return g.clusterNames
}

// emitCluster renders cluster name and its endpoints.
func (g *generator) emitCluster(name string, spec clusterSpec) error {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: g.adsSource(), ServiceName: name},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
	if g.in.MTLS {
		mesh := g.in.Dataplane.Mesh
		ts, err := g.assignments.tlsSocket(socketKey{kind: ProxyGRPC, mesh: mesh, service: spec.service}, func() (*corev3.TransportSocket, error) {
			return upstreamTLS(mesh, spec.service), nil
		})
		if err != nil {
			return err
		}
		c.TransportSocket = ts
	}
	shape := g.shapeOf(spec.service)
	shape.shapeCluster(c)
	g.shape(resourcev3.ClusterType, name, shape.clusterPolicies)
	g.out.Clusters = append(g.out.Clusters, c)
	g.askAssignment(name, spec, shape.locality)
	return nil
}

// askAssignment asks for cluster name's endpoints, spread by plan: added
// by emitPending after the cluster's fragment, which records the ask.
func (g *generator) askAssignment(name string, spec clusterSpec, plan localityPlan) {
	a := fragmentAssignment{name, spec, plan}
	if g.rec != nil {
		g.rec.assignments = append(g.rec.assignments, a)
	}
	g.pending = append(g.pending, a)
}

// emitPending adds the shared endpoints asked for, with their digests.
func (g *generator) emitPending() error {
	for _, p := range g.pending {
		if err := g.out.addAssignment(g.assignments, p); err != nil {
			return err
		}
		g.out.asked = append(g.out.asked, p)
	}
	g.pending = g.pending[:0]
	return nil
}

// withAssignments are r with every cluster's endpoints taken from a
// instead: what a rendering from other endpoints (of the same services,
// with the same protocols, sameServices) gives when nothing else changed.
// r is not changed; the result shares its other lists (Server.Set keeps
// such lists as they are). ok is false when r's endpoints cannot be told
// apart (a rendering that did not record them).
func (r *Resources) withAssignments(a *LoadAssignments) (out *Resources, ok bool, err error) {
	if len(r.asked) != len(r.Endpoints) {
		return nil, false, nil
	}
	// Copied from the first cluster whose assignment changed: a proxy
	// none of whose services changed gets r itself.
	var c *Resources
	for i, p := range r.asked {
		sa, err := a.get(p.name, p.spec, p.plan)
		if err != nil {
			return nil, false, err
		}
		if c == nil {
			if sa.cla == r.Endpoints[i] {
				continue
			}
			copied := *r
			c = &copied
			c.Endpoints = append(make([]types.Resource, 0, len(r.asked)), r.Endpoints[:i]...)
			c.sums[listEndpoints] = append(make([][sha256.Size]byte, 0, len(r.asked)), r.sums[listEndpoints][:min(i, len(r.sums[listEndpoints]))]...)
		}
		c.Endpoints = append(c.Endpoints, sa.cla)
		c.setSum(listEndpoints, len(c.Endpoints)-1, sa.digest)
	}
	if c == nil {
		return r, true, nil
	}
	return c, true, nil
}

// addAssignment appends the shared endpoints of the cluster p asks for,
// from a, with their digest.
func (r *Resources) addAssignment(a *LoadAssignments, p fragmentAssignment) error {
	sa, err := a.get(p.name, p.spec, p.plan)
	if err != nil {
		return err
	}
	r.Endpoints = append(r.Endpoints, sa.cla)
	r.setSum(listEndpoints, len(r.Endpoints)-1, sa.digest)
	return nil
}

// clientKey sums up what a gRPC client's listener and routes for svc are
// rendered from, in keyBuf; nil when it cannot be told.
func (g *generator) clientKey(svc string) []byte {
	pk, ok := g.policiesKey(svc)
	if !ok {
		return nil
	}
	b := appendKey(g.keyBuf[:0], "c", svc, pk)
	if g.in.Faults != nil {
		conf, origin, differ := g.in.Faults.For(svc, g.clientTags())
		b = appendKey(b, string(conf), strconv.FormatBool(differ))
		for _, o := range origin {
			b = appendKey(b, refOf(o).String())
		}
	}
	g.keyBuf = b
	return b
}

// clusterKey sums up what cluster name (spec) is rendered from, in
// keyBuf; nil when it cannot be told.
func (g *generator) clusterKey(name string, spec clusterSpec) []byte {
	pk, ok := g.policiesKey(spec.service)
	if !ok {
		return nil
	}
	g.keyBuf = appendKey(g.keyBuf[:0], "k", name, spec.service, tagKey(spec.tags), pk)
	return g.keyBuf
}

// appendKey appends parts to a fragment key, each after a '|' but the
// key's first.
func appendKey(b []byte, parts ...string) []byte {
	for _, p := range parts {
		if len(b) > 0 {
			b = append(b, '|')
		}
		b = append(b, p...)
	}
	return b
}

// listTypes are the type URLs of Resources' four lists, in order.
var listTypes = [4]string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType}

// Lists of Resources, by their position in listTypes and sums.
const (
	listListeners = iota
	listRoutes
	listClusters
	listEndpoints
)

// lists are r's four lists, in listTypes' order.
func (r *Resources) lists() [4]*[]types.Resource {
	return [4]*[]types.Resource{&r.Listeners, &r.Routes, &r.Clusters, &r.Endpoints}
}

// setSum records the digest of the resource at pos in list.
func (r *Resources) setSum(list, pos int, d [sha256.Size]byte) {
	sums := r.sums[list]
	for len(sums) <= pos {
		sums = append(sums, [sha256.Size]byte{})
	}
	sums[pos] = d
	r.sums[list] = sums
}

// sum is the digest of the resource at pos in list, if known.
func (r *Resources) sum(list, pos int) ([sha256.Size]byte, bool) {
	if pos >= len(r.sums[list]) {
		return [sha256.Size]byte{}, false
	}
	d := r.sums[list][pos]
	return d, d != [sha256.Size]byte{}
}

// forgetSums drops the digests of a list whose resources were replaced,
// removed or reordered (a patch).
func (r *Resources) forgetSums(list int) { r.sums[list] = nil }

// carried are the policy types a proxyless gRPC client or server is given
// (docs/dataplane.md#not-enforceable): the RBAC of its inbounds, and the
// routes, timeouts, retries, circuit breakers and load balancing of its
// outbounds.
var carried = map[string]bool{
	"MeshHTTPRoute": true, "MeshTrafficPermission": true,
	// Field by field: what a gRPC client cannot carry is named where the
	// conf is read (grpcpolicy.go).
	"MeshTimeout": true, "MeshRetry": true, "MeshCircuitBreaker": true, "MeshLoadBalancingStrategy": true,
	// On the clients that call the inbound (faultFilters).
	"MeshFaultInjection": true,
}

// reportNotCarried names every other policy type the proxy's effective
// configuration holds: the zone computes it (`_config` shows it) but does
// not send it to a proxyless gRPC workload, and says so rather than drop it
// silently. Without mTLS the mesh's MeshTrafficPermission is not enforced.
func (g *generator) reportNotCarried() {
	callable := g.callable() // sorted
	if len(g.in.Config.Outbounds) == 0 && len(callable) > 0 {
		g.drop("outbound policies: none are computed, the Dataplane declares no outbounds (declare the services it calls)")
	}
	isCallable := func(svc string) bool {
		_, ok := slices.BinarySearch(callable, svc)
		return ok
	}
	g.reportNotGiven(carried, isCallable, notGiven{outbound: "not given to proxyless gRPC clients",
		inbound: "not given to proxyless gRPC servers", proxy: "not given to proxyless gRPC workloads"})
}

// notGiven says why a kind of proxy is not given a policy type, on an
// outbound, an inbound or the whole proxy.
type notGiven struct{ outbound, inbound, proxy string }

// reportNotGiven names the policy types of the proxy's configuration that
// given does not hold: on the outbounds to the services outbound accepts,
// on the inbounds and for the whole proxy. Without mTLS the inbounds'
// MeshTrafficPermission is not enforced.
func (g *generator) reportNotGiven(given map[string]bool, outbound func(svc string) bool, why notGiven) {
	for _, o := range g.in.Config.Outbounds {
		for typ, p := range o.Policies {
			// Whether the proxy calls the service is asked only of a
			// type it is not given: mostly never.
			if !given[typ] && outbound(o.Service) {
				g.dropAbout(p.Origin, "%s on the outbound to %s: %s", typ, o.Service, why.outbound)
			}
		}
	}
	for _, in := range g.in.Config.Inbounds {
		for typ, p := range in.Policies {
			var origins []policy.Origin
			for _, r := range p.Rules {
				origins = append(origins, r.Origin...)
			}
			switch {
			case typ == "MeshTrafficPermission" && !g.in.MTLS:
				g.dropAbout(origins, "MeshTrafficPermission on inbound %d: not enforced, the mesh has no mTLS", in.Port)
			case !given[typ]:
				g.dropAbout(origins, "%s on inbound %d: %s", typ, in.Port, why.inbound)
			}
		}
	}
	for typ, ap := range g.in.Config.Proxy {
		if !given[typ] {
			g.dropAbout(ap.Origin, "%s (whole proxy): %s", typ, why.proxy)
		}
	}
}

// server renders the listener a proxyless gRPC server asks for when it
// listens on inbound i: TLS requiring a mesh certificate and the inbound's
// MeshTrafficPermission RBAC when the mesh has mTLS.
func (g *generator) server(i int, inb Inbound) error {
	filters := []*hcmv3.HttpFilter{}
	name := ServerListenerName(inb.Address, inb.Port)
	if g.in.MTLS && i < len(g.in.Config.Inbounds) {
		rbac, err := rbacFilter(g.in.Config.Inbounds[i].RBAC)
		if err != nil {
			return fmt.Errorf("inbound %d: %w", inb.Port, err)
		}
		filters = append(filters, rbac)
		if p, ok := g.in.Config.Inbounds[i].Policies["MeshTrafficPermission"]; ok {
			var names [][]policy.Origin
			for _, r := range p.Rules {
				names = append(names, g.carry(r.Origin)...)
			}
			g.shape(resourcev3.ListenerType, name, names)
		}
	}
	filters = append(filters, g.routerFilter())
	manager := g.scratchManager()
	manager.StatPrefix = fmt.Sprintf("inbound_%d", inb.Port)
	manager.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
		Name: fmt.Sprintf("inbound:%d", inb.Port),
		VirtualHosts: []*routev3.VirtualHost{{
			Name: "inbound", Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
				Action: &routev3.Route_NonForwardingAction{NonForwardingAction: &routev3.NonForwardingAction{}},
			}},
		}},
	}}
	manager.HttpFilters = filters
	typed, err := anyOf(manager)
	if err != nil {
		return err
	}
	chain := &listenerv3.FilterChain{
		Name:    fmt.Sprintf("inbound:%d", inb.Port),
		Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: typed}}},
	}
	if g.in.MTLS {
		ts, err := g.assignments.tlsSocket(socketKey{kind: ProxyGRPC, inbound: true}, func() (*corev3.TransportSocket, error) {
			return downstreamTLS(), nil
		})
		if err != nil {
			return err
		}
		chain.TransportSocket = ts
	}
	g.out.Listeners = append(g.out.Listeners, &listenerv3.Listener{
		Name:         name,
		Address:      socketAddress(inb.Address, inb.Port),
		FilterChains: []*listenerv3.FilterChain{chain},
	})
	return nil
}

// rbacFilter turns the engine's RBAC of an inbound (Envoy's JSON) into the
// RBAC HTTP filter. gRPC servers enforce rules; shadow_rules ride along.
func rbacFilter(f policy.RBACFilter) (*hcmv3.HttpFilter, error) {
	cfg := &rbacfilterv3.RBAC{}
	var err error
	if f.Rules != nil {
		if cfg.Rules, err = rbacProto(f.Rules); err != nil {
			return nil, fmt.Errorf("rbac rules: %w", err)
		}
	}
	if f.ShadowRules != nil {
		if cfg.ShadowRules, err = rbacProto(f.ShadowRules); err != nil {
			return nil, fmt.Errorf("rbac shadow_rules: %w", err)
		}
	}
	typed, err := anyOf(cfg)
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: typed}}, nil
}

// sharedParts are the sub-messages every resource of a rendering may
// share: each listener's router filter, each cluster's EDS and SDS
// sources. Built resources are never changed in place (a patch works on
// a copy and merges it into a reset resource), so one copy of each part
// serves a whole rendering; built each time, they were a sixth of what an
// Envoy rendering of 100 outbounds allocated.
type sharedParts struct {
	router   *hcmv3.HttpFilter
	ads, sds *corev3.ConfigSource
	// manager is scratch (scratchManager), never part of a resource.
	manager *hcmv3.HttpConnectionManager
}

// scratchManager is the rendering's HTTP connection manager for one
// listener, reset: one that is encoded into a typed config at once (and
// not kept) is built in it rather than allocated, a tenth of what a gRPC
// rendering allocates. It is valid until the next call.
func (g *generator) scratchManager() *hcmv3.HttpConnectionManager {
	if g.parts.manager == nil {
		g.parts.manager = &hcmv3.HttpConnectionManager{}
	}
	proto.Reset(g.parts.manager)
	return g.parts.manager
}

// routerFilter is the rendering's router filter.
func (g *generator) routerFilter() *hcmv3.HttpFilter {
	if g.parts.router == nil {
		typed, _ := anyOf(&routerv3.Router{})
		g.parts.router = &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: typed}}
	}
	return g.parts.router
}

// adsSource is the rendering's ADS config source.
func (g *generator) adsSource() *corev3.ConfigSource {
	if g.parts.ads == nil {
		g.parts.ads = &corev3.ConfigSource{
			ResourceApiVersion:    corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}
	}
	return g.parts.ads
}

func socketAddress(addr string, port int) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}
}

// certificateContext names the agent's certificate provider for the
// identity and the trust bundle.
func certificateContext() *tlsv3.CommonTlsContext {
	return &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: CertProvider},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: CertProvider},
		}},
	}
}

// upstreamTLS: the client presents its workload certificate and accepts
// only a server whose certificate names the service it called.
func upstreamTLS(mesh, svc string) *corev3.TransportSocket {
	ctx := certificateContext()
	//lint:ignore SA1019 grpc-go reads match_subject_alt_names only, not the typed field that replaces it.
	ctx.GetValidationContext().MatchSubjectAltNames = []*matcherv3.StringMatcher{{
		MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "spiffe://" + mesh + "/" + svc},
	}}
	typed, _ := anyOf(&tlsv3.UpstreamTlsContext{CommonTlsContext: ctx})
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: typed}}
}

// downstreamTLS: the server requires a client certificate of the mesh.
func downstreamTLS() *corev3.TransportSocket {
	typed, _ := anyOf(&tlsv3.DownstreamTlsContext{
		CommonTlsContext:         certificateContext(),
		RequireClientCertificate: wrapperspb.Bool(true),
	})
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: typed}}
}

// drop records what the proxy is not given, about the policies g.about
// (none for a note about the proxy itself).
func (g *generator) drop(format string, args ...any) {
	g.dropText(fmt.Sprintf(format, args...))
}

// dropText records a drop's text (drop).
func (g *generator) dropText(text string) {
	if g.rec != nil {
		g.rec.drops = append(g.rec.drops, fragmentDrop{text: text, about: g.about})
	}
	g.out.Dropped = append(g.out.Dropped, text)
	for _, o := range g.about {
		t := g.out.touch(refOf(o))
		if !slices.Contains(t.Dropped, text) {
			t.Dropped = append(t.Dropped, text)
		}
	}
}

// carry records that the policies of origins shaped the proxy's
// resources, for shape.
func (g *generator) carry(origins []policy.Origin) [][]policy.Origin {
	if g.rec != nil {
		g.rec.carried = append(g.rec.carried, origins)
	}
	g.out.carried = append(g.out.carried, origins)
	return [][]policy.Origin{origins}
}

// finishTouched marks the policies left out in part that the resources
// also carry: the per-policy work is done only for those.
func (r *Resources) finishTouched() {
	if len(r.Touched) == 0 {
		return
	}
	for _, l := range r.carried {
		for _, o := range l {
			if t := r.Touched[refOf(o)]; t != nil {
				t.Carried = true
			}
		}
	}
}

// CarriedPolicies calls fn with each policy the resources carry (once or
// more).
func (r *Resources) CarriedPolicies(fn func(PolicyRef)) {
	for _, l := range r.carried {
		for _, o := range l {
			fn(refOf(o))
		}
	}
}

// dropAbout records a drop about the policies of origins.
func (g *generator) dropAbout(origins []policy.Origin, format string, args ...any) {
	about := g.about
	g.about = origins
	g.drop(format, args...)
	g.about = about
}

func originNames(os []policy.Origin) []string {
	out := make([]string, 0, len(os))
	seen := make(map[string]bool, len(os))
	for _, o := range os {
		n := o.Type + " " + o.Name
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// anyOf packs m deterministically: equal resources encode (and version)
// equally, even with maps inside (a JSON log format's fields).
func anyOf(m proto.Message) (*anypb.Any, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, err
	}
	return a, nil
}
