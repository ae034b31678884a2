package xds

import (
	"encoding/json"
	"regexp"
	"strings"

	setstatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/set_filter_state/v3"
	setstatenetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/set_filter_state/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	localrlhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	localrlnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/local_ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// MeshRateLimit for Envoy (docs/dataplane.md#envoy), as Kuma renders it on
// an inbound: the HTTP local rate limiter (a filter before the router and
// the bucket on every route of the inbound), and the network one, first
// in the chain, for connections; a rule for the clients of one identity
// has routes of its own (inboundRateLimit).

const (
	httpLocalRateLimit = "envoy.filters.http.local_ratelimit"
	tcpLocalRateLimit  = "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit"
)

type meshRateLimitConf struct {
	Local *struct {
		HTTP *meshRateLimitHTTP `json:"http"`
		TCP  *struct {
			Disabled       *bool `json:"disabled"`
			ConnectionRate *struct {
				Num      uint32 `json:"num"`
				Interval string `json:"interval"`
			} `json:"connectionRate"`
		} `json:"tcp"`
	} `json:"local"`
}

type meshRateLimitHTTP struct {
	Disabled    *bool `json:"disabled"`
	RequestRate *struct {
		Num      uint32 `json:"num"`
		Interval string `json:"interval"`
	} `json:"requestRate"`
	OnRateLimit *struct {
		Status  *uint32 `json:"status"`
		Headers *struct {
			Set []struct{ Name, Value string } `json:"set"`
			Add []struct{ Name, Value string } `json:"add"`
		} `json:"headers"`
	} `json:"onRateLimit"`
}

// inboundRateLimit is what the inbound's MeshRateLimit gives its chain:
// the network filters (nil: none; the client identity's filter state, the
// connection limiter) and, for HTTP, the bucket of every client's route
// (nil: none) and those of the rules for some clients (clients).
type inboundRateLimit struct {
	network []*listenerv3.Filter
	route   *anypb.Any
	clients []clientBucket
}

// clientBucket is the HTTP bucket of the clients whose certificate
// carries identity (a URI SAN).
type clientBucket struct {
	identity string
	bucket   *anypb.Any
}

// peerSANState is the filter state key the client certificate's URI SANs
// are kept under, for routes of rules for some clients to match.
const peerSANState = "meridian.mesh_rate_limit.match.peer_uri_san"

// inboundRateLimit reads the inbound's MeshRateLimit rules. A rule for
// every client limits the inbound; a rule for the clients of one identity
// (a service or a tag) gets a route of its own, matched on the client
// certificate's URI SANs, before the inbound's route, as Kuma 2.14 renders
// rules by client identity; a rule for everyone but such clients is the
// inbound's own. Any other rule (clients named by several identities) is
// named as not rendered.
func (e *envoyGen) inboundRateLimit(cfg policy.InboundConfig, listener string, http bool) (inboundRateLimit, error) {
	var out inboundRateLimit
	p, ok := cfg.Policies["MeshRateLimit"]
	if !ok {
		return out, nil
	}
	defer func() { e.about = nil }()
	// The rules for one identity first: a rule for everyone but them is
	// then the inbound's own.
	single := map[string]bool{}
	for _, r := range p.Rules {
		if id, ok := e.singleIdentity(r); ok {
			single[id] = true
		}
	}
	for _, r := range p.Rules {
		e.about = r.Origin
		var c meshRateLimitConf
		if err := json.Unmarshal(r.Conf, &c); err != nil || c.Local == nil {
			e.drop("MeshRateLimit on inbound %d: conf cannot be read", cfg.Port)
			continue
		}
		id, forOne := e.singleIdentity(r)
		everyone := len(r.Matchers) == 0 || e.allButSingles(r, single)
		switch {
		case !everyone && !e.in.MTLS:
			e.drop("MeshRateLimit for some clients of inbound %d: not rendered, the mesh has no mTLS to tell clients apart", cfg.Port)
			continue
		case !everyone && !forOne:
			e.drop("MeshRateLimit for some clients of inbound %d: not rendered for Envoy, the rule names clients by several identities", cfg.Port)
			continue
		}
		if t := c.Local.TCP; t != nil && (t.Disabled == nil || !*t.Disabled) && t.ConnectionRate != nil {
			if !everyone {
				e.drop("MeshRateLimit local.tcp for some clients of inbound %d: connection limits apply to every client only", cfg.Port)
			} else if d, ok := e.duration("MeshRateLimit", "inbound", &t.ConnectionRate.Interval); ok {
				f, err := typed(tcpLocalRateLimit, &localrlnetv3.LocalRateLimit{StatPrefix: "tcp_rate_limit", TokenBucket: &typev3.TokenBucket{
					MaxTokens: t.ConnectionRate.Num, TokensPerFill: wrapperspb.UInt32(t.ConnectionRate.Num), FillInterval: durationpb.New(d)}})
				if err != nil {
					return out, err
				}
				out.network = append(out.network, f)
				e.shape(resourcev3.ListenerType, listener, e.carry(r.Origin))
			}
		}
		h := c.Local.HTTP
		if h == nil || (h.Disabled != nil && *h.Disabled) || h.RequestRate == nil {
			continue
		}
		if !http {
			e.drop("MeshRateLimit local.http on inbound %d: the inbound speaks tcp (kuma.io/protocol)", cfg.Port)
			continue
		}
		bucket, err := e.httpBucket(h)
		if err != nil || bucket == nil {
			if err != nil {
				return out, err
			}
			continue
		}
		if everyone {
			out.route = bucket
		} else {
			out.clients = append(out.clients, clientBucket{identity: id, bucket: bucket})
		}
		e.shape(resourcev3.ListenerType, listener, e.carry(r.Origin))
	}
	if len(out.clients) > 0 {
		f, err := peerSANFilter()
		if err != nil {
			return out, err
		}
		// First: the routes read the state it sets.
		out.network = append([]*listenerv3.Filter{f}, out.network...)
	}
	return out, nil
}

// singleIdentity is the identity of a rule for the clients of one
// identity (one matcher, not negated).
func (e *envoyGen) singleIdentity(r policy.Rule) (string, bool) {
	if len(r.Matchers) != 1 || r.Matchers[0].Not {
		return "", false
	}
	m := r.Matchers[0]
	return policy.IdentityOf(e.in.Dataplane.Mesh, m.Key, m.Value), true
}

// allButSingles says a rule is for everyone but clients of single
// identities (each negated, each with a rule of its own), whose routes
// come first.
func (e *envoyGen) allButSingles(r policy.Rule, single map[string]bool) bool {
	for _, m := range r.Matchers {
		if !m.Not || !single[policy.IdentityOf(e.in.Dataplane.Mesh, m.Key, m.Value)] {
			return false
		}
	}
	return len(r.Matchers) > 0
}

// httpBucket is a route's local rate limit: the bucket, the status and
// headers of a limited request; nil when the interval does not read.
func (e *envoyGen) httpBucket(h *meshRateLimitHTTP) (*anypb.Any, error) {
	d, ok := e.duration("MeshRateLimit", "inbound", &h.RequestRate.Interval)
	if !ok {
		return nil, nil
	}
	rl := &localrlhttpv3.LocalRateLimit{
		StatPrefix:  "rate_limit",
		TokenBucket: &typev3.TokenBucket{MaxTokens: h.RequestRate.Num, TokensPerFill: wrapperspb.UInt32(h.RequestRate.Num), FillInterval: durationpb.New(d)},
		FilterEnabled: &corev3.RuntimeFractionalPercent{RuntimeKey: "local_rate_limit_enabled",
			DefaultValue: &typev3.FractionalPercent{Numerator: 100, Denominator: typev3.FractionalPercent_HUNDRED}},
		FilterEnforced: &corev3.RuntimeFractionalPercent{RuntimeKey: "local_rate_limit_enforced",
			DefaultValue: &typev3.FractionalPercent{Numerator: 100, Denominator: typev3.FractionalPercent_HUNDRED}},
	}
	if on := h.OnRateLimit; on != nil {
		if on.Status != nil {
			rl.Status = &typev3.HttpStatus{Code: typev3.StatusCode(*on.Status)}
		}
		if hs := on.Headers; hs != nil {
			for _, a := range hs.Add {
				rl.ResponseHeadersToAdd = append(rl.ResponseHeadersToAdd, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: a.Name, Value: a.Value}})
			}
			// As Kuma: a set header's comma-separated values each
			// overwrite.
			for _, s := range hs.Set {
				for _, v := range strings.Split(s.Value, ",") {
					rl.ResponseHeadersToAdd = append(rl.ResponseHeadersToAdd, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: s.Name, Value: v},
						AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
				}
			}
		}
	}
	return anyOf(rl)
}

// peerSANFilter keeps the client certificate's URI SANs in the filter
// state (peerSANState), as Kuma keeps the client's SPIFFE ID.
func peerSANFilter() (*listenerv3.Filter, error) {
	return typed("envoy.filters.network.set_filter_state", &setstatenetv3.Config{OnDownstreamTlsHandshake: []*setstatev3.FilterStateValue{{
		Key:        &setstatev3.FilterStateValue_ObjectKey{ObjectKey: peerSANState},
		FactoryKey: "envoy.string",
		Value: &setstatev3.FilterStateValue_FormatString{FormatString: &corev3.SubstitutionFormatString{
			Format: &corev3.SubstitutionFormatString_TextFormatSource{TextFormatSource: &corev3.DataSource{
				Specifier: &corev3.DataSource_InlineString{InlineString: "%DOWNSTREAM_PEER_URI_SAN%"}}}}},
		ReadOnly:    true,
		SkipIfEmpty: true,
	}}})
}

// withClientRoutes puts before routes a copy of each for every client
// bucket: matched on the client's URI SANs (Envoy joins them with commas),
// with that bucket.
func withClientRoutes(routes []*routev3.Route, clients []clientBucket) []*routev3.Route {
	var out []*routev3.Route
	for _, c := range clients {
		for _, r := range routes {
			dup := proto.Clone(r).(*routev3.Route)
			dup.Match.FilterState = append(dup.Match.FilterState, &matcherv3.FilterStateMatcher{Key: peerSANState,
				Matcher: &matcherv3.FilterStateMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{
					SafeRegex: &matcherv3.RegexMatcher{Regex: `(^|,)` + regexp.QuoteMeta(c.identity) + `(,|$)`}}}}})
			dup.TypedPerFilterConfig = map[string]*anypb.Any{httpLocalRateLimit: c.bucket}
			out = append(out, dup)
		}
	}
	return append(out, routes...)
}

// httpLocalRateLimitFilter is the HTTP filter the routes' buckets
// configure.
func httpLocalRateLimitFilter() *hcmv3.HttpFilter {
	a, _ := anyOf(&localrlhttpv3.LocalRateLimit{StatPrefix: "rate_limit"})
	return &hcmv3.HttpFilter{Name: httpLocalRateLimit, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}}
}

// withRouteRateLimit sets the bucket on every route.
func withRouteRateLimit(routes []*routev3.Route, bucket *anypb.Any) {
	for _, r := range routes {
		if r.TypedPerFilterConfig == nil {
			r.TypedPerFilterConfig = map[string]*anypb.Any{}
		}
		r.TypedPerFilterConfig[httpLocalRateLimit] = bucket
	}
}
