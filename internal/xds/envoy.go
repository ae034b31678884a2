package xds

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbacnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Rendering a Dataplane for an Envoy sidecar (docs/dataplane.md#envoy),
// laid out as Kuma 2.14 lays out a Dataplane with explicit outbounds, so a
// Kuma user reading a config dump finds the names they know:
//
//   - per inbound, listener inbound:ADDR:PORT (mTLS with the mesh's
//     certificates, the MeshTrafficPermission network RBAC filter, then an
//     HTTP connection manager or a TCP proxy) to cluster localhost:PORT;
//   - per outbound, listener outbound:127.0.0.1:PORT (routes inline, as
//     outbound:SERVICE) to EDS cluster SERVICE, whose endpoints are the
//     same assignments gRPC clients get;
//   - certificates by SDS from the agent (identity_cert:secret:MESH,
//     mesh_ca:secret:MESH): the workload's key never leaves its machine.
//
// A service speaks kuma.io/protocol of its inbounds (tcp when unset, as in
// Kuma): http, http2 and grpc get HTTP routes, the others a TCP proxy.

// Kuma's defaults where a MeshTimeout does not say (its policies'
// defaults).
const (
	defaultConnectTimeout    = 5 * time.Second
	defaultIdleTimeout       = time.Hour
	defaultStreamIdleTimeout = 30 * time.Minute
	defaultRequestTimeout    = 15 * time.Second
	// AgentSDSCluster is the bootstrap's cluster of the agent's SDS server.
	AgentSDSCluster = "meridian_dp_sds"
	// httpRetryOnDefault is Kuma's MeshRetry http default.
	httpRetryOnDefault = "gateway-error,connect-failure,refused-stream"
)

// IdentitySecret and CASecret are the SDS names of a mesh's workload
// certificate and trust bundle, as Kuma names them.
func IdentitySecret(mesh string) string { return "identity_cert:secret:" + mesh }

// CASecret is the SDS name of a mesh's trust bundle.
func CASecret(mesh string) string { return "mesh_ca:secret:" + mesh }

// GenerateEnvoy renders in for an Envoy sidecar.
func GenerateEnvoy(in Input) (*Resources, error) {
	g := newGenerator(in)
	e := &envoyGen{generator: g, lbs: map[string]*envoyLB{}, collectors: map[string]*clusterv3.Cluster{},
		collectorShapers: map[string][][]policy.Origin{}}
	if _, patched := in.Config.Proxy["MeshProxyPatch"]; !patched {
		// Patches apply to finished resources: a patched proxy renders whole.
		g.startFragments(ProxyEnvoy)
	}
	for i, inb := range in.Dataplane.Inbounds {
		if err := e.inbound(i, inb); err != nil {
			return nil, err
		}
	}
	for _, o := range in.Config.Outbounds {
		if o.Port == 0 {
			// An implicit outbound (docs/policy.md#outbounds): reached
			// through transparent proxying, which an Envoy sidecar of
			// meridian-dp does not set up; only declared outbounds get
			// listeners.
			continue
		}
		var key []byte
		if pk, ok := e.policiesKey(o.Service); ok && o.Service != "" {
			key = strconv.AppendInt(append(e.keyBuf[:0], "o|"...), int64(o.Port), 10)
			key = appendKey(key, o.Service, e.protocol(o.Service), pk)
			e.keyBuf = key
		}
		if err := e.inFragment(fragmentID{kind: "outbound", port: o.Port}, key, func() error { return e.outbound(o) }); err != nil {
			return nil, err
		}
	}
	if err := e.metrics(); err != nil {
		return nil, err
	}
	if err := e.emitClusters(); err != nil {
		return nil, err
	}
	e.emitCollectors()
	e.reportNotRendered()
	if err := e.patch(); err != nil {
		return nil, err
	}
	return g.finish(), nil
}

type envoyGen struct {
	*generator
	lbs map[string]*envoyLB // by service, read once
	// timeouts are the MeshTimeout confs read (timeoutConf).
	timeouts map[*policy.OutboundPolicy]meshTimeoutConf
	// collectors are the clusters of observability backends (access
	// logs, tracing), by name, with the policies behind each.
	collectors       map[string]*clusterv3.Cluster
	collectorShapers map[string][][]policy.Origin
	// patched are the resources MeshProxyPatch changed (envoypatch.go).
	patched []patchedResource
	// traced says an HTTP connection manager was given MeshTrace.
	traced bool
	// optionsMemo are the clusters' upstream HTTP options by what they
	// hold (protocolOptions).
	optionsMemo map[protocolOptionsKey]map[string]*anypb.Any
}

// envoyLB is what a service's MeshLoadBalancingStrategy gives Envoy.
type envoyLB struct {
	policy   clusterv3.Cluster_LbPolicy
	config   func(*clusterv3.Cluster)
	hash     []*routev3.RouteAction_HashPolicy
	locality localityPlan
}

func (e *envoyGen) lbOf(svc string) *envoyLB {
	if lb, ok := e.lbs[svc]; ok {
		return lb
	}
	lb := &envoyLB{}
	lb.policy, lb.config, lb.hash, lb.locality = e.envoyLoadBalancing(svc, e.outboundPolicies(svc))
	e.lbs[svc] = lb
	return lb
}

// protocol is what a service speaks (protocolOf its endpoints).
func (e *envoyGen) protocol(svc string) string { return protocolOf(e.in.Endpoints[svc]) }

// protocolOf is what a service's instances say it speaks: the first
// kuma.io/protocol among them, else tcp.
func protocolOf(eps []Endpoint) string {
	for _, ep := range eps {
		if p := ep.Tags["kuma.io/protocol"]; p != "" {
			return p
		}
	}
	return "tcp"
}

func isHTTP(protocol string) bool {
	return protocol == "http" || protocol == "http2" || protocol == "grpc"
}

// sdsSource is the agent's SDS server (a cluster of the bootstrap).
// sdsSource is the rendering's config source of secrets: the agent.
func (g *generator) sdsSource() *corev3.ConfigSource {
	if g.parts.sds == nil {
		g.parts.sds = &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{
			ApiConfigSource: &corev3.ApiConfigSource{ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: AgentSDSCluster}}}}}}}
	}
	return g.parts.sds
}

func (e *envoyGen) sdsContext() *tlsv3.CommonTlsContext {
	mesh := e.in.Dataplane.Mesh
	return &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: IdentitySecret(mesh), SdsConfig: e.sdsSource()}},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig{
			ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: CASecret(mesh), SdsConfig: e.sdsSource()}},
	}
}

func typed(name string, m proto.Message) (*listenerv3.Filter, error) {
	a, err := anyOf(m)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Filter{Name: name, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}, nil
}

// inbound renders inbound i: its listener and its localhost cluster.
func (e *envoyGen) inbound(i int, inb Inbound) error {
	addr := net.JoinHostPort(inb.Address, strconv.Itoa(inb.Port))
	name := "inbound:" + addr
	local := "localhost:" + strconv.Itoa(inb.Port)
	svc := inb.Service()
	var filters []*listenerv3.Filter
	var cfg policy.InboundConfig
	if i < len(e.in.Config.Inbounds) {
		cfg = e.in.Config.Inbounds[i]
	}
	if e.in.MTLS {
		f, err := e.networkRBAC(addr, cfg)
		if err != nil {
			return err
		}
		filters = append(filters, f)
	}
	protocol := inb.Tags["kuma.io/protocol"]
	http := isHTTP(protocol)
	limit, err := e.inboundRateLimit(cfg, name, http)
	if err != nil {
		return err
	}
	logs, logsReadSAN, err := e.inboundAccessLogs(cfg, inb, name, http)
	if err != nil {
		return err
	}
	network := limit.network
	if len(limit.clients) > 0 || logsReadSAN {
		f, err := peerSANFilter()
		if err != nil {
			return err
		}
		network = append([]*listenerv3.Filter{f}, network...)
	}
	if network != nil {
		// As Kuma: the client identity's state and the connection limiter
		// are first in the chain.
		filters = append(network, filters...)
	}
	if http {
		httpFilters, err := e.inboundFaults(cfg)
		if err != nil {
			return err
		}
		routes := []*routev3.Route{{
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: local}, Timeout: durationpb.New(0)}},
		}}
		if limit.route != nil || len(limit.clients) > 0 {
			httpFilters = append(httpFilters, httpLocalRateLimitFilter())
		}
		if limit.route != nil {
			withRouteRateLimit(routes, limit.route)
		}
		routes = withClientRoutes(routes, limit.clients)
		f, err := typed("envoy.filters.network.http_connection_manager", &hcmv3.HttpConnectionManager{
			StatPrefix: "localhost_" + strconv.Itoa(inb.Port),
			RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
				Name: "inbound:" + svc, VirtualHosts: []*routev3.VirtualHost{{Name: svc, Domains: []string{"*"}, Routes: routes}},
			}},
			HttpFilters: append(httpFilters, e.routerFilter()),
			AccessLog:   logs,
			Tracing:     e.tracing(name, "INBOUND", ""),
		})
		if err != nil {
			return err
		}
		filters = append(filters, f)
	} else {
		f, err := typed("envoy.filters.network.tcp_proxy", &tcpproxyv3.TcpProxy{StatPrefix: "localhost_" + strconv.Itoa(inb.Port),
			ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: local}, AccessLog: logs})
		if err != nil {
			return err
		}
		filters = append(filters, f)
	}
	chain := &listenerv3.FilterChain{Filters: filters}
	if e.in.MTLS {
		ts, err := anyOf(&tlsv3.DownstreamTlsContext{CommonTlsContext: e.sdsContext(), RequireClientCertificate: wrapperspb.Bool(true)})
		if err != nil {
			return err
		}
		chain.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: ts}}
	}
	e.out.Listeners = append(e.out.Listeners, &listenerv3.Listener{
		Name: name, Address: socketAddress(inb.Address, inb.Port), TrafficDirection: corev3.TrafficDirection_INBOUND,
		FilterChains: []*listenerv3.FilterChain{chain},
	})
	e.out.Clusters = append(e.out.Clusters, &clusterv3.Cluster{
		Name: local, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout: durationpb.New(defaultConnectTimeout),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: local, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
				Endpoint: &endpointv3.Endpoint{Address: socketAddress("127.0.0.1", inb.Port)}}}},
		}}},
	})
	return nil
}

// statName is addr in a stat prefix: its ':' and '.' as '_'.
func statName(addr string) string {
	return strings.Map(func(r rune) rune {
		if r == ':' || r == '.' {
			return '_'
		}
		return r
	}, addr)
}

// networkRBAC is the inbound's MeshTrafficPermission as Kuma renders it:
// the network RBAC filter, first in the chain.
func (e *envoyGen) networkRBAC(addr string, cfg policy.InboundConfig) (*listenerv3.Filter, error) {
	rbac := &rbacnetv3.RBAC{StatPrefix: "inbound_" + statName(addr) + "."}
	var err error
	if cfg.RBAC.Rules != nil {
		if rbac.Rules, err = rbacProto(cfg.RBAC.Rules); err != nil {
			return nil, fmt.Errorf("rbac rules: %w", err)
		}
	}
	if cfg.RBAC.ShadowRules != nil {
		if rbac.ShadowRules, err = rbacProto(cfg.RBAC.ShadowRules); err != nil {
			return nil, fmt.Errorf("rbac shadow_rules: %w", err)
		}
	}
	if p, ok := cfg.Policies["MeshTrafficPermission"]; ok {
		var names [][]policy.Origin
		for _, r := range p.Rules {
			names = append(names, e.carry(r.Origin)...)
		}
		e.shape(resourcev3.ListenerType, "inbound:"+addr, names)
	}
	return typed("envoy.filters.network.rbac", rbac)
}

// inboundFaults are the inbound's MeshFaultInjection filters, rule by
// rule: a rule for some clients only applies to the clients whose
// certificate carries its identities (forClients).
func (e *envoyGen) inboundFaults(cfg policy.InboundConfig) ([]*hcmv3.HttpFilter, error) {
	p, ok := cfg.Policies["MeshFaultInjection"]
	if !ok {
		return nil, nil
	}
	var out []*hcmv3.HttpFilter
	for _, r := range p.Rules {
		e.about = r.Origin
		if len(r.Matchers) > 0 && !e.in.MTLS {
			e.drop("MeshFaultInjection for some clients of inbound %d: not rendered, the mesh has no mTLS to tell clients apart", cfg.Port)
			continue
		}
		filters, err := e.faultsFromConf(fmt.Sprintf("inbound %d", cfg.Port), r.Conf, r.Origin)
		if err != nil {
			return nil, err
		}
		for _, f := range filters {
			wrapped, err := e.forClients(f, r)
			if err != nil {
				return nil, err
			}
			out = append(out, wrapped)
		}
	}
	e.about = nil
	return out, nil
}

// outbound renders an outbound: its listener and routes; its clusters are
// recorded for emitClusters.
func (e *envoyGen) outbound(o policy.OutboundConfig) error {
	svc := o.Service
	if svc == "" {
		return nil
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Port))
	protocol := e.protocol(svc)
	listener := "outbound:" + addr
	var filter *listenerv3.Filter
	_, hasTCPRoute := o.Policies["MeshTCPRoute"]
	_, hasHTTPRoute := o.Policies["MeshHTTPRoute"]
	// As Kuma: a MeshTCPRoute routes an HTTP service's traffic when no
	// MeshHTTPRoute does, as TCP.
	http := isHTTP(protocol) && (!hasTCPRoute || hasHTTPRoute)
	logs, logShapers, err := e.outboundAccessLogs(svc, o.Policies, http)
	if err != nil {
		return err
	}
	e.shape(resourcev3.ListenerType, listener, logShapers)
	if http {
		routes, shaped := e.envoyRoutes(svc, o.Policies, protocol)
		e.shape(resourcev3.ListenerType, listener, shaped)
		manager := e.scratchManager()
		manager.StatPrefix = svc
		manager.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "outbound:" + svc, VirtualHosts: []*routev3.VirtualHost{{Name: svc, Domains: []string{"*"}, Routes: routes}},
		}}
		manager.HttpFilters = []*hcmv3.HttpFilter{e.routerFilter()}
		manager.AccessLog = logs
		manager.Tracing = e.tracing(listener, "OUTBOUND", svc)
		filter, err = typed("envoy.filters.network.http_connection_manager", manager)
	} else {
		tp := e.tcpProxy(svc, o.Policies, listener)
		tp.AccessLog = logs
		filter, err = typed("envoy.filters.network.tcp_proxy", tp)
	}
	if err != nil {
		return err
	}
	e.out.Listeners = append(e.out.Listeners, &listenerv3.Listener{
		Name: "outbound:" + addr, Address: socketAddress("127.0.0.1", o.Port), TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{filter}}},
	})
	return nil
}

// tcpProxy is a TCP outbound: its cluster, MeshTimeout's idleTimeout and
// MeshRetry's tcp.maxConnectAttempt.
func (e *envoyGen) tcpProxy(svc string, policies map[string]*policy.OutboundPolicy, listener string) *tcpproxyv3.TcpProxy {
	tp := &tcpproxyv3.TcpProxy{StatPrefix: svc, IdleTimeout: durationpb.New(defaultIdleTimeout)}
	if cluster, weighted := e.tcpRoute(svc, policies, listener); weighted != nil {
		tp.ClusterSpecifier = &tcpproxyv3.TcpProxy_WeightedClusters{WeightedClusters: weighted}
	} else {
		tp.ClusterSpecifier = &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster}
	}
	if p, ok := policies["MeshTimeout"]; ok && p.Conf != nil {
		var c meshTimeoutConf
		e.about = p.Origin
		if e.decode("MeshTimeout", svc, p.Conf, &c) {
			if d, ok := e.duration("MeshTimeout", svc, c.IdleTimeout); ok {
				tp.IdleTimeout = durationpb.New(d)
			}
			e.unsupported("MeshTimeout", svc, svc+" speaks tcp (kuma.io/protocol)", field{"http", c.HTTP != nil})
			e.carry(p.Origin)
		}
		e.about = nil
	}
	// What only HTTP traffic has.
	for _, typ := range []string{"MeshHTTPRoute", "MeshFaultInjection"} {
		if p, ok := policies[typ]; ok && p.Conf != nil && !isHTTP(e.protocol(svc)) {
			e.dropAbout(p.Origin, "%s on the outbound to %s: %s speaks tcp (kuma.io/protocol)", typ, svc, svc)
		}
	}
	if p, ok := policies["MeshRetry"]; ok && p.Conf != nil {
		var c struct {
			TCP *struct {
				MaxConnectAttempt *uint32 `json:"maxConnectAttempt"`
			} `json:"tcp"`
		}
		var sections struct {
			HTTP json.RawMessage `json:"http"`
			GRPC json.RawMessage `json:"grpc"`
		}
		_ = json.Unmarshal(p.Conf, &sections)
		e.about = p.Origin
		e.unsupported("MeshRetry", svc, svc+" speaks tcp (kuma.io/protocol)", field{"http", sections.HTTP != nil}, field{"grpc", sections.GRPC != nil})
		e.about = nil
		if err := json.Unmarshal(p.Conf, &c); err == nil && c.TCP != nil && c.TCP.MaxConnectAttempt != nil {
			tp.MaxConnectAttempts = wrapperspb.UInt32(*c.TCP.MaxConnectAttempt)
			e.carry(p.Origin)
		}
	}
	return tp
}

// envoyRoutes are an HTTP outbound's routes: its MeshHTTPRoute rules, then
// the default route, each with the outbound's timeout, retry and hash
// policies.
func (e *envoyGen) envoyRoutes(svc string, policies map[string]*policy.OutboundPolicy, protocol string) ([]*routev3.Route, [][]policy.Origin) {
	var out []*routev3.Route
	var shaped [][]policy.Origin
	if hr, ok := policies["MeshHTTPRoute"]; ok && hr.Conf != nil {
		var conf struct {
			Rules []httpRule `json:"rules"`
		}
		if err := json.Unmarshal(hr.Conf, &conf); err == nil {
			e.about = hr.Origin
			for i, rule := range conf.Rules {
				out = append(out, e.envoyRuleRoutes(svc, i, rule)...)
			}
			e.about = nil
			shaped = append(shaped, e.carry(hr.Origin)...)
		}
	}
	out = append(out, &routev3.Route{
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: e.cluster(svc, nil)}}},
	})
	timeout, idle, tShaped := e.routeTimeouts(svc, policies)
	retry, rShaped := e.routeRetry(svc, policies, protocol)
	hash := e.lbOf(svc).hash
	for _, r := range out {
		a := r.GetRoute()
		if a == nil {
			continue // a redirect
		}
		a.Timeout, a.IdleTimeout, a.RetryPolicy, a.HashPolicy = timeout, idle, retry, hash
	}
	shaped = append(shaped, tShaped...)
	shaped = append(shaped, rShaped...)
	return out, shaped
}

// envoyRuleRoutes renders one MeshHTTPRoute rule as a route per match:
// path, method, headers and query parameters; header modifier filters.
func (e *envoyGen) envoyRuleRoutes(svc string, i int, rule httpRule) []*routev3.Route {
	action, ok := e.weightedAction(svc, i, rule)
	if !ok {
		return nil
	}
	rf := e.routeFilters(svc, i, rule)
	var out []*routev3.Route
	for _, m := range rule.Matches {
		match := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
		if p := m.Path; p != nil {
			switch p.Type {
			case "Exact":
				match.PathSpecifier = &routev3.RouteMatch_Path{Path: p.Value}
			case "PathPrefix":
				match.PathSpecifier = &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: strings.TrimSuffix(p.Value, "/")}
				if p.Value == "/" {
					match.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: "/"}
				}
			case "RegularExpression":
				match.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: p.Value}}
			}
		}
		if m.Method != "" {
			match.Headers = append(match.Headers, &routev3.HeaderMatcher{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
				StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: m.Method}}}})
		}
		match.Headers = append(match.Headers, headerMatchers(m.Headers)...)
		for _, q := range m.QueryParams {
			var qp struct{ Type, Name, Value string }
			b, _ := json.Marshal(q)
			if json.Unmarshal(b, &qp) != nil || qp.Name == "" {
				continue
			}
			sm := &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: qp.Value}}
			if qp.Type == "RegularExpression" {
				sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: qp.Value}}}
			}
			match.QueryParameters = append(match.QueryParameters, &routev3.QueryParameterMatcher{Name: qp.Name,
				QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: sm}})
		}
		r := &routev3.Route{Match: match, Action: &routev3.Route_Route{Route: proto.Clone(action).(*routev3.RouteAction)}}
		rf.apply(r, m.Path)
		out = append(out, r)
	}
	return out
}

// routeTimeouts are MeshTimeout's route timeouts, Kuma's defaults where
// it is silent (requestTimeout 15 s, streamIdleTimeout 30 m).
func (e *envoyGen) routeTimeouts(svc string, policies map[string]*policy.OutboundPolicy) (timeout, idle *durationpb.Duration, shaped [][]policy.Origin) {
	timeout, idle = durationpb.New(defaultRequestTimeout), durationpb.New(defaultStreamIdleTimeout)
	p, ok := policies["MeshTimeout"]
	if !ok || p.Conf == nil {
		return timeout, idle, nil
	}
	e.about = p.Origin
	defer func() { e.about = nil }()
	c, ok := e.timeoutConf(svc, p)
	if !ok || c.HTTP == nil {
		return timeout, idle, nil
	}
	if d, ok := e.duration("MeshTimeout", svc, c.HTTP.RequestTimeout); ok {
		timeout = durationpb.New(d)
	}
	if d, ok := e.duration("MeshTimeout", svc, c.HTTP.StreamIdleTimeout); ok {
		idle = durationpb.New(d)
	}
	return timeout, idle, e.carry(p.Origin)
}

// routeRetry is MeshRetry's retry policy: the grpc section for a gRPC
// service, else the http section (Kuma's defaults for retryOn).
func (e *envoyGen) routeRetry(svc string, policies map[string]*policy.OutboundPolicy, protocol string) (*routev3.RetryPolicy, [][]policy.Origin) {
	p, ok := policies["MeshRetry"]
	if !ok || p.Conf == nil {
		return nil, nil
	}
	e.about = p.Origin
	defer func() { e.about = nil }()
	var c struct {
		HTTP *retrySection `json:"http"`
		GRPC *retrySection `json:"grpc"`
	}
	if !e.decode("MeshRetry", svc, p.Conf, &c) {
		return nil, nil
	}
	policy := &routev3.RetryPolicy{}
	var num *uint32
	var perTry *string
	var backOff *retryBackOffConf
	switch {
	case protocol == "grpc" && c.GRPC != nil:
		num, perTry, backOff = c.GRPC.NumRetries, c.GRPC.PerTryTimeout, c.GRPC.BackOff
		policy.RetryOn = "cancelled,connect-failure,gateway-error,refused-stream,reset,resource-exhausted,unavailable"
		if len(c.GRPC.RetryOn) > 0 {
			var on []string
			for _, r := range c.GRPC.RetryOn {
				on = append(on, grpcRetryOn[r])
			}
			policy.RetryOn = strings.Join(on, ",")
		}
	case protocol != "grpc" && c.HTTP != nil:
		num, perTry, backOff = c.HTTP.NumRetries, c.HTTP.PerTryTimeout, c.HTTP.BackOff
		policy.RetryOn = httpRetryOnDefault
		if len(c.HTTP.RetryOn) > 0 {
			policy.RetryOn, policy.RetriableStatusCodes = httpRetryOn(c.HTTP.RetryOn)
		}
	default:
		return nil, nil
	}
	if num != nil {
		if *num == 0 {
			return nil, e.carry(p.Origin) // no retries, as Kuma
		}
		policy.NumRetries = wrapperspb.UInt32(*num)
	}
	if d, ok := e.duration("MeshRetry", svc, perTry); ok {
		policy.PerTryTimeout = durationpb.New(d)
	}
	if backOff != nil {
		policy.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(25 * time.Millisecond)}
		if d, ok := e.duration("MeshRetry", svc, backOff.BaseInterval); ok && d > 0 {
			policy.RetryBackOff.BaseInterval = durationpb.New(d)
		}
		if d, ok := e.duration("MeshRetry", svc, backOff.MaxInterval); ok && d > 0 {
			policy.RetryBackOff.MaxInterval = durationpb.New(d)
		}
	}
	return policy, e.carry(p.Origin)
}

// retrySection is MeshRetry's http or grpc section, as Envoy reads it.
type retrySection struct {
	NumRetries    *uint32           `json:"numRetries"`
	PerTryTimeout *string           `json:"perTryTimeout"`
	RetryOn       []string          `json:"retryOn"`
	BackOff       *retryBackOffConf `json:"backOff"`
}

type retryBackOffConf struct {
	BaseInterval *string `json:"baseInterval"`
	MaxInterval  *string `json:"maxInterval"`
}

// httpRetryOn maps MeshRetry's http conditions to Envoy's: status codes
// become retriable_status_codes.
func httpRetryOn(conds []string) (string, []uint32) {
	names := map[string]string{"5xx": "5xx", "5XX": "5xx", "GatewayError": "gateway-error", "Reset": "reset",
		"Retriable4xx": "retriable-4xx", "ConnectFailure": "connect-failure", "EnvoyRatelimited": "envoy-ratelimited",
		"RefusedStream": "refused-stream", "Http3PostConnectFailure": "http3-post-connect-failure"}
	var on []string
	var codes []uint32
	for _, c := range conds {
		if n, ok := names[c]; ok {
			on = append(on, n)
		} else if code, err := strconv.Atoi(c); err == nil {
			codes = append(codes, uint32(code))
		}
	}
	if len(codes) > 0 {
		on = append(on, "retriable-status-codes")
	}
	return strings.Join(on, ","), codes
}

// emitClusters renders the outbound clusters: EDS, mTLS to the called
// service, Kuma's connect and idle timeouts, and the service's circuit
// breaker, load balancing and health check.
func (e *envoyGen) emitClusters() error {
	for _, name := range e.sortedClusters() {
		spec := e.clusters[name]
		key := e.clusterKey(name, spec)
		if key != nil {
			key = appendKey(key, e.protocol(spec.service))
			e.keyBuf = key
		}
		if err := e.inFragment(fragmentID{kind: "cluster", name: name}, key, func() error { return e.emitCluster(name, spec) }); err != nil {
			return err
		}
		if err := e.emitPending(); err != nil {
			return err
		}
	}
	return nil
}

// emitCluster renders cluster name and its endpoints.
func (e *envoyGen) emitCluster(name string, spec clusterSpec) error {
	policies := e.outboundPolicies(spec.service)
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: e.adsSource(), ServiceName: name},
		ConnectTimeout:       durationpb.New(defaultConnectTimeout),
	}
	if err := e.clusterTimeouts(c, spec.service, policies); err != nil {
		return err
	}
	e.envoyCircuitBreaker(c, spec.service, policies)
	lb := e.lbOf(spec.service)
	c.LbPolicy = lb.policy
	if lb.config != nil {
		lb.config(c)
	}
	e.healthCheck(c, spec.service, policies)
	if e.in.MTLS {
		ts, err := e.assignments.tlsSocket(socketKey{kind: ProxyEnvoy, mesh: e.in.Dataplane.Mesh, service: spec.service}, func() (*corev3.TransportSocket, error) {
			typed, err := anyOf(e.upstreamTLS(spec.service))
			if err != nil {
				return nil, err
			}
			return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: typed}}, nil
		})
		if err != nil {
			return err
		}
		c.TransportSocket = ts
	}
	e.shape(resourcev3.ClusterType, name, clusterShapers(policies))
	e.out.Clusters = append(e.out.Clusters, c)
	e.askAssignment(name, spec, lb.locality)
	return nil
}

// clusterShapers are the policies behind an outbound's clusters.
func clusterShapers(policies map[string]*policy.OutboundPolicy) [][]policy.Origin {
	var out [][]policy.Origin
	for _, typ := range []string{"MeshTimeout", "MeshCircuitBreaker", "MeshLoadBalancingStrategy", "MeshHealthCheck"} {
		if p, ok := policies[typ]; ok && p.Conf != nil {
			out = append(out, p.Origin)
		}
	}
	return out
}

// upstreamTLS presents the workload certificate and accepts only the
// called service's identity, with Kuma's SNI.
func (e *envoyGen) upstreamTLS(svc string) *tlsv3.UpstreamTlsContext {
	mesh := e.in.Dataplane.Mesh
	common := e.sdsContext()
	common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
		DefaultValidationContext: &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
			SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "spiffe://" + mesh + "/" + svc}},
		}}},
		ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: CASecret(mesh), SdsConfig: e.sdsSource()},
	}}
	return &tlsv3.UpstreamTlsContext{CommonTlsContext: common, Sni: svc + "{mesh=" + mesh + "}"}
}

// timeoutConf is the MeshTimeout conf p gives the outbound to svc, read
// once per rendering: an HTTP service's routes and its cluster both read
// it. A conf that cannot be read is read (and reported, in the fragment
// that reads it) each time.
func (e *envoyGen) timeoutConf(svc string, p *policy.OutboundPolicy) (meshTimeoutConf, bool) {
	if c, ok := e.timeouts[p]; ok {
		return c, true
	}
	var c meshTimeoutConf
	if !e.decode("MeshTimeout", svc, p.Conf, &c) {
		return c, false
	}
	if e.timeouts == nil {
		e.timeouts = map[*policy.OutboundPolicy]meshTimeoutConf{}
	}
	e.timeouts[p] = c
	return c, true
}

// clusterTimeouts: connectionTimeout, and for HTTP services the upstream
// HTTP options (idleTimeout, maxStreamDuration, maxConnectionDuration),
// Kuma's defaults where MeshTimeout is silent.
func (e *envoyGen) clusterTimeouts(c *clusterv3.Cluster, svc string, policies map[string]*policy.OutboundPolicy) error {
	var conf meshTimeoutConf
	if p, ok := policies["MeshTimeout"]; ok && p.Conf != nil {
		e.about = p.Origin
		if conf, ok = e.timeoutConf(svc, p); ok {
			e.carry(p.Origin)
		}
		e.about = nil
	}
	if d, ok := e.duration("MeshTimeout", svc, conf.ConnectionTimeout); ok {
		c.ConnectTimeout = durationpb.New(d)
	}
	protocol := e.protocol(svc)
	if !isHTTP(protocol) {
		return nil
	}
	common := &corev3.HttpProtocolOptions{IdleTimeout: durationpb.New(defaultIdleTimeout)}
	if d, ok := e.duration("MeshTimeout", svc, conf.IdleTimeout); ok {
		common.IdleTimeout = durationpb.New(d)
	}
	if conf.HTTP != nil {
		if d, ok := e.duration("MeshTimeout", svc, conf.HTTP.MaxStreamDuration); ok && d > 0 {
			common.MaxStreamDuration = durationpb.New(d)
		}
		if d, ok := e.duration("MeshTimeout", svc, conf.HTTP.MaxConnectionDuration); ok && d > 0 {
			common.MaxConnectionDuration = durationpb.New(d)
		}
	}
	opts, err := e.protocolOptions(protocol == "http", common)
	if err != nil {
		return err
	}
	c.TypedExtensionProtocolOptions = opts
	return nil
}

// protocolOptions is a cluster's upstream HTTP options: HTTP/1.1 or
// HTTP/2, with common. Clusters mostly have equal options (Kuma's defaults,
// a mesh-wide MeshTimeout): equal ones are encoded once per rendering and
// share one map (resources are never changed in place).
func (e *envoyGen) protocolOptions(http1 bool, common *corev3.HttpProtocolOptions) (map[string]*anypb.Any, error) {
	key := protocolOptionsKey{http1, common.GetIdleTimeout().AsDuration(), common.GetMaxStreamDuration() != nil,
		common.GetMaxStreamDuration().AsDuration(), common.GetMaxConnectionDuration() != nil, common.GetMaxConnectionDuration().AsDuration()}
	if opts, ok := e.optionsMemo[key]; ok {
		return opts, nil
	}
	o := &httpv3.HttpProtocolOptions{CommonHttpProtocolOptions: common}
	if http1 {
		o.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &corev3.Http1ProtocolOptions{}}}}
	} else {
		o.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}
	}
	a, err := anyOf(o)
	if err != nil {
		return nil, err
	}
	opts := map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": a}
	if e.optionsMemo == nil {
		e.optionsMemo = map[protocolOptionsKey]map[string]*anypb.Any{}
	}
	e.optionsMemo[key] = opts
	return opts, nil
}

// protocolOptionsKey is what protocolOptions encodes: the protocol and
// the common options' durations (set or not).
type protocolOptionsKey struct {
	http1         bool
	idle          time.Duration
	hasStream     bool
	stream        time.Duration
	hasConnection bool
	connection    time.Duration
}

// meshHealthCheckConf is what Envoy renders of a MeshHealthCheck conf.
type meshHealthCheckConf struct {
	Interval           *string `json:"interval"`
	Timeout            *string `json:"timeout"`
	UnhealthyThreshold *uint32 `json:"unhealthyThreshold"`
	HealthyThreshold   *uint32 `json:"healthyThreshold"`
	HTTP               *struct {
		Disabled *bool   `json:"disabled"`
		Path     *string `json:"path"`
	} `json:"http"`
}

// healthCheck is MeshHealthCheck's active health check: TCP, or HTTP on
// "/" for HTTP services.
func (e *envoyGen) healthCheck(c *clusterv3.Cluster, svc string, policies map[string]*policy.OutboundPolicy) {
	p, ok := policies["MeshHealthCheck"]
	if !ok || p.Conf == nil {
		return
	}
	var conf meshHealthCheckConf
	e.about = p.Origin
	defer func() { e.about = nil }()
	if !e.decode("MeshHealthCheck", svc, p.Conf, &conf) {
		return
	}
	hc := &corev3.HealthCheck{Timeout: durationpb.New(15 * time.Second), Interval: durationpb.New(time.Minute),
		UnhealthyThreshold: wrapperspb.UInt32(5), HealthyThreshold: wrapperspb.UInt32(1)}
	if d, ok := e.duration("MeshHealthCheck", svc, conf.Interval); ok && d > 0 {
		hc.Interval = durationpb.New(d)
	}
	if d, ok := e.duration("MeshHealthCheck", svc, conf.Timeout); ok && d > 0 {
		hc.Timeout = durationpb.New(d)
	}
	if conf.UnhealthyThreshold != nil {
		hc.UnhealthyThreshold = wrapperspb.UInt32(*conf.UnhealthyThreshold)
	}
	if conf.HealthyThreshold != nil {
		hc.HealthyThreshold = wrapperspb.UInt32(*conf.HealthyThreshold)
	}
	if isHTTP(e.protocol(svc)) && (conf.HTTP == nil || conf.HTTP.Disabled == nil || !*conf.HTTP.Disabled) {
		path := "/"
		if conf.HTTP != nil && conf.HTTP.Path != nil {
			path = *conf.HTTP.Path
		}
		hc.HealthChecker = &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{Path: path}}
	} else {
		hc.HealthChecker = &corev3.HealthCheck_TcpHealthCheck_{TcpHealthCheck: &corev3.HealthCheck_TcpHealthCheck{}}
	}
	c.HealthChecks = []*corev3.HealthCheck{hc}
	e.carry(p.Origin)
}

// envoyRendered are the policy types an Envoy sidecar is given.
var envoyRendered = map[string]bool{
	"MeshTrafficPermission": true, "MeshHTTPRoute": true, "MeshTimeout": true, "MeshRetry": true,
	"MeshCircuitBreaker": true, "MeshLoadBalancingStrategy": true, "MeshFaultInjection": true, "MeshHealthCheck": true,
	"MeshTCPRoute": true, "MeshAccessLog": true, "MeshRateLimit": true,
	// Proxy-wide: given where they apply (envoyobserve.go, envoymetric.go,
	// envoypatch.go); what they cannot carry is named there.
	"MeshTrace": true, "MeshMetric": true, "MeshProxyPatch": true,
}

// reportNotRendered names the policy types the Envoy rendering does not
// carry.
func (e *envoyGen) reportNotRendered() {
	e.reportNotGiven(envoyRendered, func(string) bool { return true }, notGiven{
		outbound: "not rendered for Envoy", inbound: "not rendered for Envoy", proxy: "not rendered for Envoy"})
	if ap, ok := e.in.Config.Proxy["MeshTrace"]; ok && !e.traced {
		e.dropAbout(ap.Origin, "MeshTrace (whole proxy): nothing traced: no backend, or no HTTP listener")
	}
}

// envoyCircuitBreaker is MeshCircuitBreaker as Kuma renders it: every
// connection limit on the default-priority thresholds (remaining counts
// tracked), and outlier detection with every detector, a detector not
// configured not enforced.
func (e *envoyGen) envoyCircuitBreaker(c *clusterv3.Cluster, svc string, policies map[string]*policy.OutboundPolicy) {
	th := &clusterv3.CircuitBreakers_Thresholds{Priority: corev3.RoutingPriority_DEFAULT, TrackRemaining: true}
	c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{th}}
	p, ok := policies["MeshCircuitBreaker"]
	if !ok || p.Conf == nil {
		return
	}
	var conf meshCircuitBreakerConf
	e.about = p.Origin
	defer func() { e.about = nil }()
	if !e.decode("MeshCircuitBreaker", svc, p.Conf, &conf) {
		return
	}
	u32 := func(v *uint32) *wrapperspb.UInt32Value {
		if v == nil {
			return nil
		}
		return wrapperspb.UInt32(*v)
	}
	if l := conf.ConnectionLimits; l != nil {
		th.MaxConnections, th.MaxConnectionPools, th.MaxPendingRequests = u32(l.MaxConnections), u32(l.MaxConnectionPools), u32(l.MaxPendingRequests)
		th.MaxRetries, th.MaxRequests = u32(l.MaxRetries), u32(l.MaxRequests)
	}
	if od := conf.OutlierDetection; od != nil && (od.Disabled == nil || !*od.Disabled) {
		out := &clusterv3.OutlierDetection{MaxEjectionPercent: u32(od.MaxEjectionPercent)}
		if d, ok := e.duration("MeshCircuitBreaker", svc, od.Interval); ok {
			out.Interval = durationpb.New(d)
		}
		if d, ok := e.duration("MeshCircuitBreaker", svc, od.BaseEjectionTime); ok {
			out.BaseEjectionTime = durationpb.New(d)
		}
		if od.SplitExternalAndLocalErrors != nil {
			out.SplitExternalLocalOriginErrors = *od.SplitExternalAndLocalErrors
		}
		consecutive := func(raw json.RawMessage) *uint32 {
			var v struct {
				Consecutive *uint32 `json:"consecutive"`
			}
			if raw == nil || json.Unmarshal(raw, &v) != nil {
				return nil
			}
			return v.Consecutive
		}
		enforce := func(on bool) *wrapperspb.UInt32Value {
			if on {
				return wrapperspb.UInt32(100)
			}
			return wrapperspb.UInt32(0)
		}
		var total, gateway, local *uint32
		det := od.Detectors
		if det != nil {
			total, gateway, local = consecutive(det.TotalFailures), consecutive(det.GatewayFailures), consecutive(det.LocalOriginFailures)
		}
		out.Consecutive_5Xx, out.EnforcingConsecutive_5Xx = u32(total), enforce(total != nil)
		out.ConsecutiveGatewayFailure, out.EnforcingConsecutiveGatewayFailure = u32(gateway), enforce(gateway != nil)
		out.ConsecutiveLocalOriginFailure, out.EnforcingConsecutiveLocalOriginFailure = u32(local), enforce(local != nil)
		out.EnforcingSuccessRate, out.EnforcingLocalOriginSuccessRate = enforce(false), enforce(false)
		out.EnforcingFailurePercentage, out.EnforcingFailurePercentageLocalOrigin = enforce(false), enforce(false)
		if det != nil && det.SuccessRate != nil {
			sr := det.SuccessRate
			out.EnforcingSuccessRate, out.EnforcingLocalOriginSuccessRate = enforce(true), enforce(true)
			out.SuccessRateMinimumHosts, out.SuccessRateRequestVolume = u32(sr.MinimumHosts), u32(sr.RequestVolume)
			if f, ok := number(sr.StandardDeviationFactor); ok {
				out.SuccessRateStdevFactor = wrapperspb.UInt32(uint32(f * 1000))
			}
		}
		if det != nil && det.FailurePercentage != nil {
			fp := det.FailurePercentage
			out.EnforcingFailurePercentage, out.EnforcingFailurePercentageLocalOrigin = enforce(true), enforce(true)
			out.FailurePercentageMinimumHosts, out.FailurePercentageRequestVolume = u32(fp.MinimumHosts), u32(fp.RequestVolume)
			out.FailurePercentageThreshold = u32(fp.Threshold)
		}
		c.OutlierDetection = out
		if f, ok := number(od.HealthyPanicThreshold); ok {
			c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: f}}
		}
	}
	e.carry(p.Origin)
}

// envoyLoadBalancing is MeshLoadBalancingStrategy for Envoy: every
// balancer, ring hash and Maglev with every hash policy on the routes;
// localityAwareness spreads the endpoints (localityPlan), with locality
// weighted balancing when affinity tags weigh the caller's zone.
func (e *envoyGen) envoyLoadBalancing(svc string, policies map[string]*policy.OutboundPolicy) (lb clusterv3.Cluster_LbPolicy, cfg func(*clusterv3.Cluster), hash []*routev3.RouteAction_HashPolicy, locality localityPlan) {
	lb = clusterv3.Cluster_ROUND_ROBIN
	p, ok := policies["MeshLoadBalancingStrategy"]
	if !ok || p.Conf == nil {
		return lb, nil, nil, locality
	}
	var conf meshLoadBalancingConf
	e.about = p.Origin
	defer func() { e.about = nil }()
	if !e.decode("MeshLoadBalancingStrategy", svc, p.Conf, &conf) {
		return lb, nil, nil, locality
	}
	locality = conf.localityPlan(e.in.Zone, tagsOf(e.in.Dataplane), true)
	if l := conf.LoadBalancer; l != nil {
		switch l.Type {
		case "LeastRequest":
			lb = clusterv3.Cluster_LEAST_REQUEST
			if l.LeastRequest != nil && l.LeastRequest.ChoiceCount != nil {
				n := *l.LeastRequest.ChoiceCount
				cfg = func(c *clusterv3.Cluster) {
					c.LbConfig = &clusterv3.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &clusterv3.Cluster_LeastRequestLbConfig{ChoiceCount: wrapperspb.UInt32(n)}}
				}
			}
		case "RingHash":
			lb = clusterv3.Cluster_RING_HASH
			rh := &clusterv3.Cluster_RingHashLbConfig{HashFunction: clusterv3.Cluster_RingHashLbConfig_XX_HASH}
			if r := l.RingHash; r != nil {
				if r.HashFunction != nil && *r.HashFunction == "MurmurHash2" {
					rh.HashFunction = clusterv3.Cluster_RingHashLbConfig_MURMUR_HASH_2
				}
				if r.MinRingSize != nil {
					rh.MinimumRingSize = wrapperspb.UInt64(*r.MinRingSize)
				}
				if r.MaxRingSize != nil {
					rh.MaximumRingSize = wrapperspb.UInt64(*r.MaxRingSize)
				}
				hash = e.envoyHashPolicies(svc, r.HashPolicies)
			}
			cfg = func(c *clusterv3.Cluster) { c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: rh} }
		case "Maglev":
			lb = clusterv3.Cluster_MAGLEV
			if m := l.Maglev; m != nil {
				if m.TableSize != nil {
					size := *m.TableSize
					cfg = func(c *clusterv3.Cluster) {
						c.LbConfig = &clusterv3.Cluster_MaglevLbConfig_{MaglevLbConfig: &clusterv3.Cluster_MaglevLbConfig{TableSize: wrapperspb.UInt64(size)}}
					}
				}
				hash = e.envoyHashPolicies(svc, m.HashPolicies)
			}
		case "Random":
			lb = clusterv3.Cluster_RANDOM
		}
	}
	if la := conf.LocalityAwareness; la != nil && la.LocalZone != nil && len(la.LocalZone.AffinityTags) > 0 {
		cfg = withLocalityWeights(cfg)
	}
	e.carry(p.Origin)
	return lb, cfg, hash, locality
}

// withLocalityWeights adds locality weighted balancing to a cluster's
// configuration: affinity tags weigh the localities of the caller's zone.
func withLocalityWeights(cfg func(*clusterv3.Cluster)) func(*clusterv3.Cluster) {
	return func(c *clusterv3.Cluster) {
		if cfg != nil {
			cfg(c)
		}
		if c.CommonLbConfig == nil {
			c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{}
		}
		c.CommonLbConfig.LocalityConfigSpecifier = &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
			LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
		}
	}
}

// envoyHashPolicies are Kuma's hash policies as Envoy's.
func (e *envoyGen) envoyHashPolicies(svc string, in []hashPolicy) []*routev3.RouteAction_HashPolicy {
	var out []*routev3.RouteAction_HashPolicy
	for i, v := range in {
		hp := &routev3.RouteAction_HashPolicy{Terminal: v.Terminal != nil && *v.Terminal}
		switch {
		case v.Type == "Header" && v.Header != nil:
			hp.PolicySpecifier = &routev3.RouteAction_HashPolicy_Header_{Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: v.Header.Name}}
		case v.Type == "Cookie" && v.Cookie != nil:
			ck := &routev3.RouteAction_HashPolicy_Cookie{Name: v.Cookie.Name, Path: v.Cookie.Path}
			if d, ok := e.duration("MeshLoadBalancingStrategy", svc, v.Cookie.TTL); ok {
				ck.Ttl = durationpb.New(d)
			}
			hp.PolicySpecifier = &routev3.RouteAction_HashPolicy_Cookie_{Cookie: ck}
		case v.Type == "Connection" || v.Type == "SourceIP":
			hp.PolicySpecifier = &routev3.RouteAction_HashPolicy_ConnectionProperties_{ConnectionProperties: &routev3.RouteAction_HashPolicy_ConnectionProperties{SourceIp: true}}
		case v.Type == "QueryParameter" && v.QueryParameter != nil:
			hp.PolicySpecifier = &routev3.RouteAction_HashPolicy_QueryParameter_{QueryParameter: &routev3.RouteAction_HashPolicy_QueryParameter{Name: v.QueryParameter.Name}}
		case v.Type == "FilterState" && v.FilterState != nil:
			hp.PolicySpecifier = &routev3.RouteAction_HashPolicy_FilterState_{FilterState: &routev3.RouteAction_HashPolicy_FilterState{Key: v.FilterState.Key}}
		default:
			e.drop("MeshLoadBalancingStrategy hashPolicies[%d] (%s) on the outbound to %s: cannot be read", i, v.Type, svc)
			continue
		}
		out = append(out, hp)
	}
	return out
}

// headerMatchers are MeshHTTPRoute header matches.
func headerMatchers(in []struct {
	Type  string `json:"type"`
	Name  string `json:"name"`
	Value string `json:"value"`
}) []*routev3.HeaderMatcher {
	var out []*routev3.HeaderMatcher
	for _, h := range in {
		hm := &routev3.HeaderMatcher{Name: strings.ToLower(h.Name)}
		switch h.Type {
		case "", "Exact":
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: h.Value}}}
		case "Prefix":
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: h.Value}}}
		case "RegularExpression":
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: h.Value}}}}
		case "Present":
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
		case "Absent":
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
			hm.InvertMatch = true
		}
		out = append(out, hm)
	}
	return out
}

// meshTCPRouteConf is a MeshTCPRoute conf: its rules (Kuma's one rule
// shape, which HTTP rules share).
type meshTCPRouteConf struct {
	Rules []httpRule `json:"rules"`
}

// tcpRoute is where a TCP outbound sends its connections: the
// MeshTCPRoute's backends by weight (its one rule), else the service.
func (e *envoyGen) tcpRoute(svc string, policies map[string]*policy.OutboundPolicy, listener string) (string, *tcpproxyv3.TcpProxy_WeightedCluster) {
	p, ok := policies["MeshTCPRoute"]
	if !ok || p.Conf == nil {
		return e.cluster(svc, nil), nil
	}
	var conf meshTCPRouteConf
	e.about = p.Origin
	defer func() { e.about = nil }()
	if !e.decode("MeshTCPRoute", svc, p.Conf, &conf) || len(conf.Rules) == 0 {
		return e.cluster(svc, nil), nil
	}
	var weighted []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight
	for j, ref := range conf.Rules[0].Default.BackendRefs {
		if ref.Kind != resource.KindMeshService && ref.Kind != resource.KindMeshServiceSubset {
			e.drop("MeshTCPRoute rules[0].default.backendRefs[%d] of %s: kind %s has no endpoints the zone serves", j, svc, ref.Kind)
			continue
		}
		w := uint32(1)
		if ref.Weight != nil {
			w = *ref.Weight
		}
		if w > 0 {
			weighted = append(weighted, &tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight{Name: e.cluster(ref.Name, ref.Tags), Weight: w})
		}
	}
	e.shape(resourcev3.ListenerType, listener, e.carry(p.Origin))
	switch len(weighted) {
	case 0:
		return e.cluster(svc, nil), nil
	case 1:
		return weighted[0].Name, nil
	}
	return "", &tcpproxyv3.TcpProxy_WeightedCluster{Clusters: weighted}
}
