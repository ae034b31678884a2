package xds

import (
	"encoding/json"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	localrlhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	localrlnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/local_ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// MeshRateLimit for Envoy (docs/dataplane.md#envoy), as Kuma renders it on
// an inbound: the HTTP local rate limiter (a filter before the router and
// the bucket on every route of the inbound), and the network one, first
// in the chain, for connections. Only the rule every client matches is
// rendered: a limit for some clients needs Envoy's matchers on the
// client's identity, which this rendering does not build (named).

const (
	httpLocalRateLimit = "envoy.filters.http.local_ratelimit"
	tcpLocalRateLimit  = "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit"
)

type meshRateLimitConf struct {
	Local *struct {
		HTTP *struct {
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
		} `json:"http"`
		TCP *struct {
			Disabled       *bool `json:"disabled"`
			ConnectionRate *struct {
				Num      uint32 `json:"num"`
				Interval string `json:"interval"`
			} `json:"connectionRate"`
		} `json:"tcp"`
	} `json:"local"`
}

// inboundRateLimit is what the inbound's MeshRateLimit gives its chain:
// the network filter (nil: none) and, for HTTP, the route's bucket (nil:
// none).
type inboundRateLimit struct {
	network *listenerv3.Filter
	route   *anypb.Any
}

func (e *envoyGen) inboundRateLimit(cfg policy.InboundConfig, listener string, http bool) (inboundRateLimit, error) {
	var out inboundRateLimit
	p, ok := cfg.Policies["MeshRateLimit"]
	if !ok {
		return out, nil
	}
	defer func() { e.about = nil }()
	for _, r := range p.Rules {
		e.about = r.Origin
		if len(r.Matchers) > 0 {
			e.drop("MeshRateLimit for some clients of inbound %d: per-client limits are not rendered for Envoy", cfg.Port)
			continue
		}
		var c meshRateLimitConf
		if err := json.Unmarshal(r.Conf, &c); err != nil || c.Local == nil {
			e.drop("MeshRateLimit on inbound %d: conf cannot be read", cfg.Port)
			continue
		}
		if t := c.Local.TCP; t != nil && (t.Disabled == nil || !*t.Disabled) && t.ConnectionRate != nil {
			d, ok := e.duration("MeshRateLimit", "inbound", &t.ConnectionRate.Interval)
			if ok {
				f, err := typed(tcpLocalRateLimit, &localrlnetv3.LocalRateLimit{StatPrefix: "tcp_rate_limit", TokenBucket: &typev3.TokenBucket{
					MaxTokens: t.ConnectionRate.Num, TokensPerFill: wrapperspb.UInt32(t.ConnectionRate.Num), FillInterval: durationpb.New(d)}})
				if err != nil {
					return out, err
				}
				out.network = f
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
		d, ok := e.duration("MeshRateLimit", "inbound", &h.RequestRate.Interval)
		if !ok {
			continue
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
		a, err := anyOf(rl)
		if err != nil {
			return out, err
		}
		out.route = a
		e.shape(resourcev3.ListenerType, listener, e.carry(r.Origin))
	}
	return out, nil
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
