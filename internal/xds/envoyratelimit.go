package xds

import (
	"encoding/json"
	"regexp"
	"slices"
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
// the network filters (nil: none; the connection limiter) and, for HTTP,
// the bucket of every client's route (nil: none) and those of the rules
// for some clients (clients, whose routes read the client identity's
// filter state: peerSANFilter).
type inboundRateLimit struct {
	network []*listenerv3.Filter
	route   *anypb.Any
	clients []clientBucket
}

// clientBucket is the HTTP bucket (nil: none) of the clients whose
// certificate carries every identity (URI SANs) of identities.
type clientBucket struct {
	identities []string
	bucket     *anypb.Any
}

// peerSANState is the filter state key the client certificate's URI SANs
// are kept under, for routes of rules for some clients to match.
const peerSANState = "meridian.client.uri_sans"

// inboundRateLimit reads the inbound's MeshRateLimit rules. A rule for
// every client limits the inbound; a rule for some clients gets a route of
// its own before the inbound's route, matched on the identities (URI SANs)
// its client certificate must carry, as Kuma 2.14 renders rules by client
// identity (clientRules says in which order, and which rules a route can
// tell apart). A rule it cannot place is named as not rendered.
func (e *envoyGen) inboundRateLimit(cfg policy.InboundConfig, listener string, http bool) (inboundRateLimit, error) {
	var out inboundRateLimit
	p, ok := cfg.Policies["MeshRateLimit"]
	if !ok {
		return out, nil
	}
	defer func() { e.about = nil }()
	placed, order, everyone := e.clientRules(p.Rules)
	for i, r := range p.Rules {
		e.about = r.Origin
		var c meshRateLimitConf
		if err := json.Unmarshal(r.Conf, &c); err != nil || c.Local == nil {
			e.drop("MeshRateLimit on inbound %d: conf cannot be read", cfg.Port)
			continue
		}
		forAll := i == everyone
		at, forSome := placed[i]
		switch {
		case !forAll && !forSome && !e.in.MTLS:
			e.drop("MeshRateLimit for some clients of inbound %d: not rendered, the mesh has no mTLS to tell clients apart", cfg.Port)
			continue
		case !forAll && !forSome:
			e.drop("MeshRateLimit for some clients of inbound %d: not rendered for Envoy, no order of routes tells the rule's clients apart from the others'", cfg.Port)
			continue
		}
		if t := c.Local.TCP; t != nil && (t.Disabled == nil || !*t.Disabled) && t.ConnectionRate != nil {
			if !forAll {
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
		if forAll {
			out.route = bucket
		} else {
			at.bucket = bucket
		}
		e.shape(resourcev3.ListenerType, listener, e.carry(r.Origin))
	}
	// The routes for some clients, when one limits them or when the
	// inbound's own limit must pass them by.
	limits := out.route != nil
	for _, cb := range order {
		limits = limits || cb.bucket != nil
	}
	if limits {
		for _, cb := range order {
			out.clients = append(out.clients, *cb)
		}
	}
	return out, nil
}

// clientRules orders the rules for some clients as routes matched on the
// identities a client certificate carries (a rule's matchers, as URI
// SANs: all must be there). A route can test for identities, not for their
// absence, so a rule whose clients lack some identity N (a negated
// matcher) is placed after a route that takes every client carrying the
// rule's identities and N: then, among the clients reaching it, carrying
// its identities is enough. A rule without negated matchers can go first.
// placed maps the index of each rule placed to its route (its bucket set
// later), order lists those routes in order; everyone is the rule left for
// every client the routes do not take (the inbound's own), -1 when none.
// Rules the order cannot place are neither. Without mTLS no rule for some
// clients is placed.
func (e *envoyGen) clientRules(rules []policy.Rule) (placed map[int]*clientBucket, order []*clientBucket, everyone int) {
	placed, everyone = map[int]*clientBucket{}, -1
	type need struct{ pos, neg []string }
	needs := make([]need, len(rules))
	for i, r := range rules {
		if len(r.Matchers) == 0 {
			everyone = i
			continue
		}
		for _, m := range r.Matchers {
			id := policy.IdentityOf(e.in.Dataplane.Mesh, m.Key, m.Value)
			if m.Not {
				needs[i].neg = append(needs[i].neg, id)
			} else {
				needs[i].pos = append(needs[i].pos, id)
			}
		}
	}
	if !e.in.MTLS {
		return placed, nil, everyone
	}
	// covered: some route already placed takes every client carrying ids.
	covered := func(ids []string) bool {
		for _, cb := range order {
			if subset(cb.identities, ids) {
				return true
			}
		}
		return false
	}
	for progress := true; progress; {
		progress = false
		for i, n := range needs {
			if _, done := placed[i]; done || i == everyone || (len(n.pos) == 0 && len(n.neg) == 0) {
				continue
			}
			ok := true
			for _, id := range n.neg {
				ok = ok && covered(append(slices.Clip(n.pos), id))
			}
			if !ok {
				continue
			}
			progress = true
			if len(n.pos) == 0 {
				// Every client but those taken before: the inbound's own.
				if everyone < 0 {
					everyone = i
				}
				continue
			}
			cb := &clientBucket{identities: n.pos}
			placed[i] = cb
			order = append(order, cb)
		}
	}
	return placed, order, everyone
}

// subset says every identity of a is in b.
func subset(a, b []string) bool {
	for _, id := range a {
		if !slices.Contains(b, id) {
			return false
		}
	}
	return true
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
// bucket, in order: matched on the client's URI SANs (Envoy joins them
// with commas; every identity must be there), with that bucket.
func withClientRoutes(routes []*routev3.Route, clients []clientBucket) []*routev3.Route {
	var out []*routev3.Route
	for _, c := range clients {
		for _, r := range routes {
			dup := proto.Clone(r).(*routev3.Route)
			for _, id := range c.identities {
				dup.Match.FilterState = append(dup.Match.FilterState, &matcherv3.FilterStateMatcher{Key: peerSANState,
					Matcher: &matcherv3.FilterStateMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{
						SafeRegex: &matcherv3.RegexMatcher{Regex: `(^|,)` + regexp.QuoteMeta(id) + `(,|$)`}}}}})
			}
			// A rule without a bucket still takes its clients: the
			// route has none, and they are not limited.
			dup.TypedPerFilterConfig = nil
			if c.bucket != nil {
				dup.TypedPerFilterConfig = map[string]*anypb.Any{httpLocalRateLimit: c.bucket}
			}
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
