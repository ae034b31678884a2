package xds

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	commonfaultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/fault/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	jsonv2 "github.com/go-json-experiment/json"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// What an outbound's policies give a proxyless gRPC client
// (docs/dataplane.md#policies): grpc-go reads a route's max_stream_duration
// and retry_policy and hash policies on headers, and a cluster's LB policy
// (round robin, least request, ring hash), max_requests and outlier
// detection (success rate and failure percentage). Every other field is
// left out and named: a field grpc-go would NACK is never sent (num_retries
// 0, a hash function other than xxHash), one it would ignore is not sent
// as if it worked.

// outboundShape is what svc's outbound policies give its routes and
// clusters.
type outboundShape struct {
	// route: every route of the outbound.
	maxStreamDuration *durationpb.Duration
	retry             *routev3.RetryPolicy
	hashPolicies      []*routev3.RouteAction_HashPolicy
	routePolicies     [][]policy.Origin
	// cluster: the service's clusters.
	lbPolicy         clusterv3.Cluster_LbPolicy
	ringHash         *clusterv3.Cluster_RingHashLbConfig
	leastRequest     *clusterv3.Cluster_LeastRequestLbConfig
	circuitBreakers  *clusterv3.CircuitBreakers
	outlierDetection *clusterv3.OutlierDetection
	// locality spreads the clusters' endpoints over priorities and
	// localities.
	locality        localityPlan
	clusterPolicies [][]policy.Origin
}

// shapeOf reads svc's outbound policies once per rendering.
func (g *generator) shapeOf(svc string) *outboundShape {
	if s, ok := g.shapes[svc]; ok {
		return s
	}
	s := &outboundShape{lbPolicy: clusterv3.Cluster_ROUND_ROBIN}
	g.shapes[svc] = s
	policies := g.outboundPolicies(svc)
	for _, r := range []struct {
		typ    string
		render func(string, policy.OutboundPolicy, *outboundShape)
	}{
		{"MeshTimeout", g.timeout}, {"MeshRetry", g.retry},
		{"MeshCircuitBreaker", g.circuitBreaker}, {"MeshLoadBalancingStrategy", g.loadBalancing},
	} {
		if p, ok := policies[r.typ]; ok && p.Conf != nil {
			g.about = p.Origin
			r.render(svc, *p, s)
			g.about = nil
		}
	}
	return s
}

// apply shapes one route action of the outbound.
func (s *outboundShape) apply(a *routev3.RouteAction) {
	if s.maxStreamDuration != nil {
		a.MaxStreamDuration = &routev3.RouteAction_MaxStreamDuration{MaxStreamDuration: s.maxStreamDuration}
	}
	a.RetryPolicy = s.retry
	a.HashPolicy = s.hashPolicies
}

// shapeCluster shapes one of the service's clusters.
func (s *outboundShape) shapeCluster(c *clusterv3.Cluster) {
	c.LbPolicy = s.lbPolicy
	switch {
	case s.ringHash != nil:
		c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: s.ringHash}
	case s.leastRequest != nil:
		c.LbConfig = &clusterv3.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: s.leastRequest}
	}
	c.CircuitBreakers = s.circuitBreakers
	c.OutlierDetection = s.outlierDetection
}

type meshTimeoutConf struct {
	ConnectionTimeout *string `json:"connectionTimeout"`
	IdleTimeout       *string `json:"idleTimeout"`
	HTTP              *struct {
		RequestTimeout        *string `json:"requestTimeout"`
		StreamIdleTimeout     *string `json:"streamIdleTimeout"`
		MaxStreamDuration     *string `json:"maxStreamDuration"`
		MaxConnectionDuration *string `json:"maxConnectionDuration"`
		RequestHeadersTimeout *string `json:"requestHeadersTimeout"`
	} `json:"http"`
}

// timeout: a call's deadline is http.requestTimeout, or maxStreamDuration
// when shorter (0 turns either off, as in Kuma); the connection-level
// timeouts have no gRPC counterpart.
func (g *generator) timeout(svc string, p policy.OutboundPolicy, s *outboundShape) {
	var c meshTimeoutConf
	if !g.decode("MeshTimeout", svc, p.Conf, &c) {
		return
	}
	g.unsupported("MeshTimeout", svc, "gRPC clients have no such timeout",
		field{"connectionTimeout", c.ConnectionTimeout != nil}, field{"idleTimeout", c.IdleTimeout != nil})
	if c.HTTP == nil {
		return
	}
	h := c.HTTP
	g.unsupported("MeshTimeout", svc, "gRPC clients have no such timeout",
		field{"http.streamIdleTimeout", h.StreamIdleTimeout != nil}, field{"http.maxConnectionDuration", h.MaxConnectionDuration != nil},
		field{"http.requestHeadersTimeout", h.RequestHeadersTimeout != nil})
	var d time.Duration
	for _, v := range []*string{h.RequestTimeout, h.MaxStreamDuration} {
		if x, ok := g.duration("MeshTimeout", svc, v); ok && x > 0 && (d == 0 || x < d) {
			d = x
		}
	}
	if d > 0 {
		s.maxStreamDuration = durationpb.New(d)
		s.routePolicies = append(s.routePolicies, g.carry(p.Origin)...)
	}
}

type meshRetryConf struct {
	TCP  json.RawMessage `json:"tcp"`
	HTTP json.RawMessage `json:"http"`
	GRPC *struct {
		NumRetries    *uint32  `json:"numRetries"`
		PerTryTimeout *string  `json:"perTryTimeout"`
		RetryOn       []string `json:"retryOn"`
		BackOff       *struct {
			BaseInterval *string `json:"baseInterval"`
			MaxInterval  *string `json:"maxInterval"`
		} `json:"backOff"`
		RateLimitedBackOff json.RawMessage `json:"rateLimitedBackOff"`
	} `json:"grpc"`
}

// grpcRetryOn are MeshRetry's gRPC conditions in the names grpc-go reads.
var grpcRetryOn = map[string]string{
	"Canceled": "cancelled", "DeadlineExceeded": "deadline-exceeded", "Internal": "internal",
	"ResourceExhausted": "resource-exhausted", "Unavailable": "unavailable",
}

// defaultGRPCRetryOn is Kuma's default for the grpc section, as far as a
// gRPC client understands it (Kuma adds connection conditions Envoy has).
const defaultGRPCRetryOn = "cancelled,resource-exhausted,unavailable"

// retry: the grpc section becomes the routes' retry policy; numRetries 0
// means no retries (grpc-go refuses num_retries 0, so none is sent).
func (g *generator) retry(svc string, p policy.OutboundPolicy, s *outboundShape) {
	var c meshRetryConf
	if !g.decode("MeshRetry", svc, p.Conf, &c) {
		return
	}
	g.unsupported("MeshRetry", svc, "gRPC clients retry by the grpc section",
		field{"tcp", c.TCP != nil}, field{"http", c.HTTP != nil})
	if c.GRPC == nil {
		return
	}
	r := c.GRPC
	g.unsupported("MeshRetry", svc, "gRPC clients have no such setting",
		field{"grpc.perTryTimeout", r.PerTryTimeout != nil}, field{"grpc.rateLimitedBackOff", r.RateLimitedBackOff != nil})
	if r.NumRetries != nil && *r.NumRetries == 0 {
		s.routePolicies = append(s.routePolicies, g.carry(p.Origin)...)
		return
	}
	policy := &routev3.RetryPolicy{RetryOn: defaultGRPCRetryOn}
	if len(r.RetryOn) > 0 {
		var on []string
		for _, c := range r.RetryOn {
			if n, ok := grpcRetryOn[c]; ok {
				on = append(on, n)
			}
		}
		policy.RetryOn = strings.Join(on, ",")
	}
	if r.NumRetries != nil {
		policy.NumRetries = wrapperspb.UInt32(*r.NumRetries)
	}
	if b := r.BackOff; b != nil {
		base, okBase := g.duration("MeshRetry", svc, b.BaseInterval)
		maxI, okMax := g.duration("MeshRetry", svc, b.MaxInterval)
		if okBase || okMax {
			if !okBase || base <= 0 {
				base = 25 * time.Millisecond // Envoy's and grpc-go's default
			}
			policy.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(base)}
			if okMax && maxI > 0 {
				policy.RetryBackOff.MaxInterval = durationpb.New(max(maxI, base))
			}
		}
	}
	s.retry = policy
	s.routePolicies = append(s.routePolicies, g.carry(p.Origin)...)
}

type meshCircuitBreakerConf struct {
	ConnectionLimits *struct {
		MaxConnections     *uint32 `json:"maxConnections"`
		MaxConnectionPools *uint32 `json:"maxConnectionPools"`
		MaxPendingRequests *uint32 `json:"maxPendingRequests"`
		MaxRetries         *uint32 `json:"maxRetries"`
		MaxRequests        *uint32 `json:"maxRequests"`
	} `json:"connectionLimits"`
	OutlierDetection *struct {
		Disabled                    *bool   `json:"disabled"`
		Interval                    *string `json:"interval"`
		BaseEjectionTime            *string `json:"baseEjectionTime"`
		MaxEjectionPercent          *uint32 `json:"maxEjectionPercent"`
		SplitExternalAndLocalErrors *bool   `json:"splitExternalAndLocalErrors"`
		HealthyPanicThreshold       any     `json:"healthyPanicThreshold"`
		Detectors                   *struct {
			TotalFailures       json.RawMessage `json:"totalFailures"`
			GatewayFailures     json.RawMessage `json:"gatewayFailures"`
			LocalOriginFailures json.RawMessage `json:"localOriginFailures"`
			SuccessRate         *struct {
				MinimumHosts            *uint32 `json:"minimumHosts"`
				RequestVolume           *uint32 `json:"requestVolume"`
				StandardDeviationFactor any     `json:"standardDeviationFactor"`
			} `json:"successRate"`
			FailurePercentage *struct {
				MinimumHosts  *uint32 `json:"minimumHosts"`
				RequestVolume *uint32 `json:"requestVolume"`
				Threshold     *uint32 `json:"threshold"`
			} `json:"failurePercentage"`
		} `json:"detectors"`
	} `json:"outlierDetection"`
}

// circuitBreaker: maxRequests and outlier detection by success rate or
// failure percentage, as Kuma lays them out for Envoy (a detector not
// configured is not enforced).
func (g *generator) circuitBreaker(svc string, p policy.OutboundPolicy, s *outboundShape) {
	var c meshCircuitBreakerConf
	if !g.decode("MeshCircuitBreaker", svc, p.Conf, &c) {
		return
	}
	shaped := false
	if l := c.ConnectionLimits; l != nil {
		g.unsupported("MeshCircuitBreaker", svc, "gRPC clients limit requests only",
			field{"connectionLimits.maxConnections", l.MaxConnections != nil}, field{"connectionLimits.maxConnectionPools", l.MaxConnectionPools != nil},
			field{"connectionLimits.maxPendingRequests", l.MaxPendingRequests != nil}, field{"connectionLimits.maxRetries", l.MaxRetries != nil})
		if l.MaxRequests != nil {
			s.circuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
				Priority: corev3.RoutingPriority_DEFAULT, MaxRequests: wrapperspb.UInt32(*l.MaxRequests),
			}}}
			shaped = true
		}
	}
	if od := c.OutlierDetection; od != nil && (od.Disabled == nil || !*od.Disabled) {
		g.unsupported("MeshCircuitBreaker", svc, "gRPC clients eject by success rate and failure percentage only",
			field{"outlierDetection.splitExternalAndLocalErrors", od.SplitExternalAndLocalErrors != nil},
			field{"outlierDetection.healthyPanicThreshold", od.HealthyPanicThreshold != nil})
		out := &clusterv3.OutlierDetection{
			EnforcingSuccessRate:       wrapperspb.UInt32(0),
			EnforcingFailurePercentage: wrapperspb.UInt32(0),
		}
		if d, ok := g.duration("MeshCircuitBreaker", svc, od.Interval); ok {
			out.Interval = durationpb.New(d)
		}
		if d, ok := g.duration("MeshCircuitBreaker", svc, od.BaseEjectionTime); ok {
			out.BaseEjectionTime = durationpb.New(d)
		}
		if od.MaxEjectionPercent != nil {
			out.MaxEjectionPercent = wrapperspb.UInt32(*od.MaxEjectionPercent)
		}
		if det := od.Detectors; det != nil {
			g.unsupported("MeshCircuitBreaker", svc, "gRPC clients eject by success rate and failure percentage only",
				field{"outlierDetection.detectors.totalFailures", det.TotalFailures != nil},
				field{"outlierDetection.detectors.gatewayFailures", det.GatewayFailures != nil},
				field{"outlierDetection.detectors.localOriginFailures", det.LocalOriginFailures != nil})
			if sr := det.SuccessRate; sr != nil {
				out.EnforcingSuccessRate = wrapperspb.UInt32(100)
				if sr.MinimumHosts != nil {
					out.SuccessRateMinimumHosts = wrapperspb.UInt32(*sr.MinimumHosts)
				}
				if sr.RequestVolume != nil {
					out.SuccessRateRequestVolume = wrapperspb.UInt32(*sr.RequestVolume)
				}
				if f, ok := number(sr.StandardDeviationFactor); ok {
					// Envoy's and gRPC's factor is in thousandths.
					out.SuccessRateStdevFactor = wrapperspb.UInt32(uint32(math.Round(f * 1000)))
				}
			}
			if fp := det.FailurePercentage; fp != nil {
				out.EnforcingFailurePercentage = wrapperspb.UInt32(100)
				if fp.MinimumHosts != nil {
					out.FailurePercentageMinimumHosts = wrapperspb.UInt32(*fp.MinimumHosts)
				}
				if fp.RequestVolume != nil {
					out.FailurePercentageRequestVolume = wrapperspb.UInt32(*fp.RequestVolume)
				}
				if fp.Threshold != nil {
					out.FailurePercentageThreshold = wrapperspb.UInt32(*fp.Threshold)
				}
			}
		}
		s.outlierDetection = out
		shaped = true
	}
	if shaped {
		s.clusterPolicies = append(s.clusterPolicies, g.carry(p.Origin)...)
	}
}

// meshLoadBalancingConf is a MeshLoadBalancingStrategy conf, as both
// renderings read it.
type meshLoadBalancingConf struct {
	LocalityAwareness *struct {
		Disabled  *bool `json:"disabled"`
		LocalZone *struct {
			AffinityTags []struct {
				Key    string  `json:"key"`
				Weight *uint32 `json:"weight"`
			} `json:"affinityTags"`
		} `json:"localZone"`
		CrossZone *struct {
			Failover []struct {
				From *struct {
					Zones []string `json:"zones"`
				} `json:"from"`
				To struct {
					Type  string   `json:"type"`
					Zones []string `json:"zones"`
				} `json:"to"`
			} `json:"failover"`
			FailoverThreshold *struct {
				Percentage any `json:"percentage"`
			} `json:"failoverThreshold"`
		} `json:"crossZone"`
	} `json:"localityAwareness"`
	LoadBalancer *struct {
		Type         string `json:"type"`
		LeastRequest *struct {
			ChoiceCount *uint32 `json:"choiceCount"`
		} `json:"leastRequest"`
		RingHash *struct {
			HashFunction *string      `json:"hashFunction"`
			MinRingSize  *uint64      `json:"minRingSize"`
			MaxRingSize  *uint64      `json:"maxRingSize"`
			HashPolicies []hashPolicy `json:"hashPolicies"`
		} `json:"ringHash"`
		Maglev *struct {
			TableSize    *uint64      `json:"tableSize"`
			HashPolicies []hashPolicy `json:"hashPolicies"`
		} `json:"maglev"`
	} `json:"loadBalancer"`
}

// defaultOverprovisioning is Envoy's overprovisioning factor of an
// assignment spread by localZone or crossZone without failoverThreshold
// (Kuma's: a priority takes all traffic until half its endpoints fail).
const defaultOverprovisioning = 200

// localityPlan is how the conf spreads a cluster's endpoints for a caller
// in callerZone whose inbounds carry callerTags (docs/dataplane.md#locality).
// withThreshold sets the overprovisioning factor (Envoy's; a gRPC client
// has none).
func (c *meshLoadBalancingConf) localityPlan(callerZone string, callerTags func(key string) (string, bool), withThreshold bool) localityPlan {
	la := c.LocalityAwareness
	if la == nil {
		return localityPlan{}
	}
	plan := localityPlan{disabled: la.Disabled != nil && *la.Disabled}
	if la.LocalZone == nil && la.CrossZone == nil {
		return plan
	}
	plan.grouped = true
	if lz := la.LocalZone; lz != nil {
		for i, t := range lz.AffinityTags {
			// Unweighted, the first tag takes 90 % of the traffic, the
			// next 90 % of the rest, and so on (weights sum to a power
			// of ten), as Kuma weighs them.
			w := uint32(9 * math.Pow10(len(lz.AffinityTags)-i-1))
			if t.Weight != nil {
				w = *t.Weight
			}
			if v, ok := callerTags(t.Key); ok {
				plan.affinity = append(plan.affinity, affinityGroup{key: t.Key, value: v, weight: w})
			}
		}
	}
	if cz := la.CrossZone; cz != nil {
		for i, f := range cz.Failover {
			if f.From != nil && !slices.Contains(f.From.Zones, callerZone) {
				continue
			}
			zones := slices.Sorted(slices.Values(f.To.Zones))
			plan.failover = append(plan.failover, failoverRule{kind: f.To.Type, zones: zones, priority: uint32(i + 1)})
		}
	}
	if withThreshold {
		plan.overprovisioning = defaultOverprovisioning
		if t := la.CrossZone; t != nil && t.FailoverThreshold != nil {
			if pct, ok := number(t.FailoverThreshold.Percentage); ok && pct > 0 {
				plan.overprovisioning = uint32(100/pct) * 100
			}
		}
	}
	return plan
}

// tagsOf reads a Dataplane's inbound tags for affinity: the first of a
// key's values in value order (a proxy's inbounds should agree on them).
func tagsOf(d *Dataplane) func(string) (string, bool) {
	return func(key string) (string, bool) {
		var values []string
		for _, in := range d.Inbounds {
			if v, ok := in.Tags[key]; ok {
				values = append(values, v)
			}
		}
		if len(values) == 0 {
			return "", false
		}
		return slices.Min(values), true
	}
}

// hashPolicy is one of a load balancer's hash policies.
type hashPolicy struct {
	Type     string `json:"type"`
	Terminal *bool  `json:"terminal"`
	Header   *struct {
		Name string `json:"name"`
	} `json:"header"`
	Cookie *struct {
		Name string  `json:"name"`
		TTL  *string `json:"ttl"`
		Path string  `json:"path"`
	} `json:"cookie"`
	QueryParameter *struct {
		Name string `json:"name"`
	} `json:"queryParameter"`
	FilterState *struct {
		Key string `json:"key"`
	} `json:"filterState"`
}

// loadBalancing: round robin, least request or ring hash (xxHash, with
// header hash policies on the routes); without locality awareness every
// zone is priority 0.
func (g *generator) loadBalancing(svc string, p policy.OutboundPolicy, s *outboundShape) {
	var c meshLoadBalancingConf
	if !g.decode("MeshLoadBalancingStrategy", svc, p.Conf, &c) {
		return
	}
	if la := c.LocalityAwareness; la != nil {
		g.unsupported("MeshLoadBalancingStrategy", svc, "gRPC clients fail over to the next priority when one has no ready endpoint",
			field{"localityAwareness.crossZone.failoverThreshold", la.CrossZone != nil && la.CrossZone.FailoverThreshold != nil})
		s.locality = c.localityPlan(g.in.Zone, tagsOf(g.in.Dataplane), false)
	}
	shaped := c.LocalityAwareness != nil
	if lb := c.LoadBalancer; lb != nil {
		shaped = true
		switch lb.Type {
		case "RoundRobin":
		case "LeastRequest":
			s.lbPolicy = clusterv3.Cluster_LEAST_REQUEST
			if lb.LeastRequest != nil && lb.LeastRequest.ChoiceCount != nil {
				s.leastRequest = &clusterv3.Cluster_LeastRequestLbConfig{ChoiceCount: wrapperspb.UInt32(*lb.LeastRequest.ChoiceCount)}
			}
		case "RingHash":
			s.lbPolicy = clusterv3.Cluster_RING_HASH
			s.ringHash = &clusterv3.Cluster_RingHashLbConfig{HashFunction: clusterv3.Cluster_RingHashLbConfig_XX_HASH}
			if rh := lb.RingHash; rh != nil {
				if rh.HashFunction != nil && *rh.HashFunction != "XXHash" {
					g.drop("MeshLoadBalancingStrategy loadBalancer.ringHash.hashFunction %s on the outbound to %s: gRPC clients hash with xxHash", *rh.HashFunction, svc)
				}
				if rh.MinRingSize != nil {
					s.ringHash.MinimumRingSize = wrapperspb.UInt64(*rh.MinRingSize)
				}
				if rh.MaxRingSize != nil {
					s.ringHash.MaximumRingSize = wrapperspb.UInt64(*rh.MaxRingSize)
				}
				for i, h := range rh.HashPolicies {
					if h.Type != "Header" || h.Header == nil {
						g.drop("MeshLoadBalancingStrategy loadBalancer.ringHash.hashPolicies[%d] (%s) on the outbound to %s: gRPC clients hash on headers only", i, h.Type, svc)
						continue
					}
					hp := &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{
						Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: strings.ToLower(h.Header.Name)}}}
					if h.Terminal != nil {
						hp.Terminal = *h.Terminal
					}
					s.hashPolicies = append(s.hashPolicies, hp)
				}
			}
		default:
			g.drop("MeshLoadBalancingStrategy loadBalancer.type %s on the outbound to %s: gRPC clients balance by round robin, least request or ring hash; round robin is used", lb.Type, svc)
		}
	}
	if shaped {
		s.clusterPolicies = append(s.clusterPolicies, g.carry(p.Origin)...)
		if len(s.hashPolicies) > 0 {
			s.routePolicies = append(s.routePolicies, g.carry(p.Origin)...)
		}
	}
}

// field is a conf field and whether it is set.
type field struct {
	path string
	set  bool
}

// unsupported names the set fields of typ's conf on svc's outbound that a
// gRPC client cannot carry.
func (g *generator) unsupported(typ, svc, why string, fields ...field) {
	for _, f := range fields {
		if f.set {
			g.drop("%s %s on the outbound to %s: %s", typ, f.path, svc, why)
		}
	}
}

// strictConf are the v2 decoder's options for decodeConf's fast read.
var strictConf = jsonv2.RejectUnknownMembers(true)

// decode reads a merged conf into v, a pointer to a zero conf; one that
// does not read is named, not sent.
func (g *generator) decode(typ, svc string, conf json.RawMessage, v any) bool {
	if err := decodeConf(conf, v); err != nil {
		g.drop("%s on the outbound to %s: conf cannot be read: %v", typ, svc, err)
		return false
	}
	return true
}

// decodeConf is json.Unmarshal(conf, v) for v a pointer to a zero value.
// It reads with the v2 decoder in its strict form first (members matched
// by exact name, none v's type does not model, no duplicates, valid
// UTF-8): on such input it reads what encoding/json reads, in one pass
// instead of two and without matching names case-insensitively (2.2 times
// as fast on a MeshTimeout conf; a rendering reads one per outbound and
// policy type). Anything else is read again by encoding/json, whose result
// and error stand. FuzzDecodeConfMatchesUnmarshal holds the two together.
func decodeConf(conf json.RawMessage, v any) error {
	if jsonv2.Unmarshal(conf, v, strictConf) == nil {
		return nil
	}
	reflect.ValueOf(v).Elem().SetZero()
	return json.Unmarshal(conf, v)
}

// duration reads a conf duration ("5s", "1m30s"); nil is unset.
func (g *generator) duration(typ, svc string, v *string) (time.Duration, bool) {
	if v == nil {
		return 0, false
	}
	d, err := time.ParseDuration(*v)
	if err != nil || d < 0 {
		g.drop("%s on the outbound to %s: duration %q cannot be read", typ, svc, *v)
		return 0, false
	}
	return d, true
}

// number reads a decimal Kuma writes as a number or a string.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case string:
		var f float64
		if err := json.Unmarshal([]byte(x), &f); err == nil {
			return f, true
		}
	}
	return 0, false
}

type meshFaultConf struct {
	HTTP []struct {
		Abort *struct {
			HTTPStatus uint32 `json:"httpStatus"`
			Percentage any    `json:"percentage"`
		} `json:"abort"`
		Delay *struct {
			Value      string `json:"value"`
			Percentage any    `json:"percentage"`
		} `json:"delay"`
		ResponseBandwidth json.RawMessage `json:"responseBandwidth"`
	} `json:"http"`
}

// faultFilters are the fault filters of the client's listener for svc:
// what svc's inbound MeshFaultInjection gives this client, one filter per
// fault as Kuma lays them out on the destination's inbound, before the
// router. A gRPC client aborts with the gRPC status of the HTTP status.
func (g *generator) faultFilters(svc string) ([]*hcmv3.HttpFilter, error) {
	if g.in.Faults == nil {
		return nil, nil
	}
	conf, origin, differ := g.in.Faults.For(svc, g.clientTags())
	g.about = origin
	defer func() { g.about = nil }()
	if differ {
		g.drop("MeshFaultInjection of %s: its instances give this client different faults; the first instance's are injected", svc)
	}
	if conf == nil {
		return nil, nil
	}
	out, err := g.faultsFromConf(svc, conf, origin)
	if len(out) > 0 {
		g.shape(resourcev3.ListenerType, svc, g.carry(origin))
	}
	return out, err
}

// faultsFromConf renders a MeshFaultInjection conf as fault filters, one
// per http item, as Kuma lays them out; of names the traffic in what is
// dropped.
func (g *generator) faultsFromConf(of string, conf json.RawMessage, origin []policy.Origin) ([]*hcmv3.HttpFilter, error) {
	var c meshFaultConf
	if err := json.Unmarshal(conf, &c); err != nil {
		g.drop("MeshFaultInjection of %s: conf cannot be read: %v", of, err)
		return nil, nil
	}
	var out []*hcmv3.HttpFilter
	for i, f := range c.HTTP {
		if f.ResponseBandwidth != nil {
			g.drop("MeshFaultInjection http[%d].responseBandwidth of %s: gRPC clients do not limit bandwidth", i, of)
		}
		fault := &faultv3.HTTPFault{}
		if a := f.Abort; a != nil {
			fault.Abort = &faultv3.FaultAbort{ErrorType: &faultv3.FaultAbort_HttpStatus{HttpStatus: a.HTTPStatus}, Percentage: fraction(a.Percentage)}
		}
		if d := f.Delay; d != nil {
			v, err := time.ParseDuration(d.Value)
			if err != nil {
				g.drop("MeshFaultInjection http[%d].delay.value %q of %s cannot be read", i, d.Value, of)
			} else {
				fault.Delay = &commonfaultv3.FaultDelay{FaultDelaySecifier: &commonfaultv3.FaultDelay_FixedDelay{FixedDelay: durationpb.New(v)},
					Percentage: fraction(d.Percentage)}
			}
		}
		if fault.Abort == nil && fault.Delay == nil {
			continue
		}
		typed, err := anyOf(fault)
		if err != nil {
			return nil, err
		}
		out = append(out, &hcmv3.HttpFilter{Name: fmt.Sprintf("envoy.filters.http.fault.%d", i), ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: typed}})
	}
	if len(out) > 0 {
		g.carry(origin)
	}
	return out, nil
}

// clientTags are what a destination's from-rules match this proxy by: its
// first inbound's tags and its zone; made once per rendering.
func (g *generator) clientTags() ClientTags {
	if g.tags.Tags != nil {
		return g.tags
	}
	tags := map[string]string{}
	if ins := g.in.Dataplane.Inbounds; len(ins) > 0 {
		maps.Copy(tags, ins[0].Tags)
	}
	if g.in.Zone != "" {
		tags["kuma.io/zone"] = g.in.Zone
	}
	g.tags = ClientTags{Tags: tags, key: tagKey(tags)}
	return g.tags
}

// fraction is a Kuma percentage (an integer or a decimal string, 0-100) in
// millionths.
func fraction(v any) *typev3.FractionalPercent {
	f, _ := number(v)
	return &typev3.FractionalPercent{Numerator: uint32(math.Round(min(max(f, 0), 100) * 10000)), Denominator: typev3.FractionalPercent_MILLION}
}
