package xds

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// renderOutbound renders a client calling backend whose outbound has the
// given confs (policy type → conf JSON).
func renderOutbound(t *testing.T, confs map[string]string) (*routev3.RouteAction, *clusterv3.Cluster, *Resources) {
	t.Helper()
	policies := map[string]*policy.OutboundPolicy{}
	for typ, conf := range confs {
		policies[typ] = &policy.OutboundPolicy{Conf: json.RawMessage(conf), Origin: []policy.Origin{{Meta: policy.Meta{Type: typ, Name: "p"}}}}
	}
	in := Input{
		Dataplane: &Dataplane{Mesh: "default", Name: "web-1", Address: "10.0.0.1", Outbounds: []string{"backend"}},
		Zone:      "zone-1",
		Config:    &policy.ConfigResult{Outbounds: []policy.OutboundConfig{{Service: "backend", Policies: policies}}},
		Endpoints: map[string][]Endpoint{"backend": {{Address: "10.0.0.2", Port: 9090, Zone: "zone-1", Healthy: true}}},
	}
	res, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	validateAll(t, res)
	rc := res.Routes[0].(*routev3.RouteConfiguration)
	return rc.VirtualHosts[0].Routes[0].GetRoute(), res.Clusters[0].(*clusterv3.Cluster), res
}

func TestGRPCOutboundPolicies(t *testing.T) {
	tests := []struct {
		name    string
		confs   map[string]string
		check   func(*routev3.RouteAction, *clusterv3.Cluster) string
		dropped []string // substrings, one per dropped line
	}{
		{"the shorter of requestTimeout and maxStreamDuration", map[string]string{"MeshTimeout": `{"http":{"requestTimeout":"15s","maxStreamDuration":"3s"}}`},
			func(a *routev3.RouteAction, _ *clusterv3.Cluster) string {
				if a.GetMaxStreamDuration().GetMaxStreamDuration().AsDuration() != 3*time.Second {
					return "max_stream_duration " + a.GetMaxStreamDuration().String()
				}
				return ""
			}, nil},
		{"requestTimeout 0 turns the deadline off", map[string]string{"MeshTimeout": `{"http":{"requestTimeout":"0s"}}`},
			func(a *routev3.RouteAction, _ *clusterv3.Cluster) string {
				if a.GetMaxStreamDuration() != nil {
					return "max_stream_duration set"
				}
				return ""
			}, nil},
		{"numRetries 0: no retry policy (grpc-go refuses 0)", map[string]string{"MeshRetry": `{"grpc":{"numRetries":0,"retryOn":["Unavailable"]}}`},
			func(a *routev3.RouteAction, _ *clusterv3.Cluster) string {
				if a.GetRetryPolicy() != nil {
					return "retry policy " + a.GetRetryPolicy().String()
				}
				return ""
			}, nil},
		{"retryOn defaults to what Kuma retries and gRPC knows", map[string]string{"MeshRetry": `{"grpc":{"numRetries":4}}`},
			func(a *routev3.RouteAction, _ *clusterv3.Cluster) string {
				p := a.GetRetryPolicy()
				if p.GetRetryOn() != defaultGRPCRetryOn || p.GetNumRetries().GetValue() != 4 {
					return "retry policy " + p.String()
				}
				return ""
			}, nil},
		{"Random is not a gRPC policy: round robin, named", map[string]string{"MeshLoadBalancingStrategy": `{"loadBalancer":{"type":"Random"}}`},
			func(_ *routev3.RouteAction, c *clusterv3.Cluster) string {
				if c.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN {
					return "lb policy " + c.GetLbPolicy().String()
				}
				return ""
			}, []string{"loadBalancer.type Random"}},
		{"ring hash is always xxHash", map[string]string{"MeshLoadBalancingStrategy": `{"loadBalancer":{"type":"RingHash","ringHash":{"hashFunction":"MurmurHash2"}}}`},
			func(_ *routev3.RouteAction, c *clusterv3.Cluster) string {
				if c.GetRingHashLbConfig().GetHashFunction() != clusterv3.Cluster_RingHashLbConfig_XX_HASH {
					return "ring hash " + c.GetRingHashLbConfig().String()
				}
				return ""
			}, []string{"hashFunction MurmurHash2"}},
		{"least request with its choice count", map[string]string{"MeshLoadBalancingStrategy": `{"loadBalancer":{"type":"LeastRequest","leastRequest":{"choiceCount":3}}}`},
			func(_ *routev3.RouteAction, c *clusterv3.Cluster) string {
				if c.GetLbPolicy() != clusterv3.Cluster_LEAST_REQUEST || c.GetLeastRequestLbConfig().GetChoiceCount().GetValue() != 3 {
					return "cluster " + c.String()
				}
				return ""
			}, nil},
		{"outlier detection off: nothing sent", map[string]string{"MeshCircuitBreaker": `{"outlierDetection":{"disabled":true,"interval":"1s"}}`},
			func(_ *routev3.RouteAction, c *clusterv3.Cluster) string {
				if c.GetOutlierDetection() != nil {
					return "outlier detection " + c.GetOutlierDetection().String()
				}
				return ""
			}, nil},
		{"a detector not configured is not enforced", map[string]string{"MeshCircuitBreaker": `{"outlierDetection":{"interval":"1s"}}`},
			func(_ *routev3.RouteAction, c *clusterv3.Cluster) string {
				od := c.GetOutlierDetection()
				if od.GetEnforcingSuccessRate().GetValue() != 0 || od.GetEnforcingFailurePercentage().GetValue() != 0 {
					return "outlier detection " + od.String()
				}
				return ""
			}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, c, res := renderOutbound(t, tt.confs)
			if msg := tt.check(a, c); msg != "" {
				t.Error(msg)
			}
			if len(res.Dropped) != len(tt.dropped) {
				t.Fatalf("dropped %q, want %d lines", res.Dropped, len(tt.dropped))
			}
			for i, want := range tt.dropped {
				if !strings.Contains(res.Dropped[i], want) {
					t.Errorf("dropped[%d] = %q, want it to name %q", i, res.Dropped[i], want)
				}
			}
		})
	}
}

// TestGRPCPoliciesNameTheirResources: the policies behind a route and a
// cluster are listed for them.
func TestGRPCPoliciesNameTheirResources(t *testing.T) {
	_, _, res := renderOutbound(t, map[string]string{
		"MeshTimeout":        `{"http":{"requestTimeout":"1s"}}`,
		"MeshCircuitBreaker": `{"connectionLimits":{"maxRequests":3}}`,
	})
	if got := res.Shaped()["type.googleapis.com/envoy.config.route.v3.RouteConfiguration"]["backend"]; !slices.Equal(got, []string{"MeshTimeout p"}) {
		t.Errorf("route shaped by %v", got)
	}
	if got := res.Shaped()["type.googleapis.com/envoy.config.cluster.v3.Cluster"]["backend"]; !slices.Equal(got, []string{"MeshCircuitBreaker p"}) {
		t.Errorf("cluster shaped by %v", got)
	}
}

// FuzzDecodeConfMatchesUnmarshal: decodeConf reads every conf type the
// generators decode as encoding/json reads it: the same value, or the same
// error.
func FuzzDecodeConfMatchesUnmarshal(f *testing.F) {
	confTypes := []func() any{
		func() any { return new(meshTimeoutConf) },
		func() any { return new(meshRetryConf) },
		func() any { return new(meshCircuitBreakerConf) },
		func() any { return new(meshLoadBalancingConf) },
		func() any { return new(meshHealthCheckConf) },
		func() any { return new(meshTCPRouteConf) },
	}
	for _, seed := range []string{
		`{"connectionTimeout":"5s","idleTimeout":"1h","http":{"requestTimeout":"15s","streamIdleTimeout":"30m","maxStreamDuration":"0s"}}`,
		`{"http":{"requestTimeout":"15s","RequestTimeout":"1s"}}`,
		`{"grpc":{"numRetries":4,"perTryTimeout":"1s","backOff":{"baseInterval":"1s","maxInterval":"2s"},"retryOn":["Unavailable"]},"http":{"numRetries":1}}`,
		`{"connectionLimits":{"maxRequests":3,"maxConnections":1.5},"outlierDetection":{"disabled":true,"interval":"1s","detectors":{"totalFailures":{"consecutive":2}}}}`,
		`{"loadBalancer":{"type":"RingHash","ringHash":{"hashFunction":"MurmurHash2","hashPolicies":[{"type":"Header","header":{"name":"x"}}]}},"localityAwareness":{"disabled":false,"localZone":{"affinityTags":[{"key":"k8s.io/node","weight":9}]}}}`,
		`{"interval":"10s","timeout":"2s","unhealthyThreshold":3,"healthyThreshold":1,"http":{"path":"/h","expectedStatuses":[200]},"tcp":{}}`,
		`{"rules":[{"default":{"backendRefs":[{"kind":"MeshService","name":"b","weight":90},{"kind":"MeshService","name":"c","port":80,"weight":10}]}}]}`,
		`{"http":null,"idleTimeout":null}`, `{"idleTimeout":"1s","idleTimeout":"2s"}`, `{"idleTimeout":"\xff"}`,
		`{"idleTimeout":"\ud800"}`, `{"rules":{}}`, `[]`, `null`, `"x"`, `{"connectionLimits":{"maxRequests":"3"}}`,
	} {
		for which := range confTypes {
			f.Add(uint8(which), []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, raw []byte) {
		newConf := confTypes[int(which)%len(confTypes)]
		got, want := newConf(), newConf()
		gotErr, wantErr := decodeConf(raw, got), json.Unmarshal(raw, want)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%T from %q: error %v, Unmarshal's %v", got, raw, gotErr, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%T from %q:\n%#v\nUnmarshal:\n%#v", got, raw, got, want)
		}
	})
}
