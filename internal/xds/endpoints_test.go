package xds

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestLocalityPlan: MeshLoadBalancingStrategy's localityAwareness spreads
// a service's endpoints over priorities and localities as Kuma 2.14 does,
// seen from a caller in zone-1 on node n1 (docs/dataplane.md#locality).
func TestLocalityPlan(t *testing.T) {
	eps := []Endpoint{
		{Address: "10.0.0.1", Port: 1, Zone: "zone-1", Healthy: true, Tags: map[string]string{"node": "n1"}},
		{Address: "10.0.0.2", Port: 1, Zone: "zone-1", Healthy: true, Tags: map[string]string{"node": "n2"}},
		{Address: "10.2.0.1", Port: 1, Zone: "zone-2", Healthy: true},
		{Address: "10.3.0.1", Port: 1, Zone: "zone-3", Healthy: true},
	}
	caller := func(key string) (string, bool) {
		v, ok := map[string]string{"node": "n1"}[key]
		return v, ok
	}
	cases := []struct {
		name, conf string
		eps        []Endpoint
		want       string // locality/weight/priority: addresses, in order
		factor     uint32
	}{
		{name: "default", conf: `{}`,
			want: "zone-1/1/0:10.0.0.1,10.0.0.2 zone-2/1/1:10.2.0.1 zone-3/1/1:10.3.0.1"},
		{name: "disabled", conf: `{"localityAwareness":{"disabled":true}}`,
			want: "zone-1/1/0:10.0.0.1,10.0.0.2 zone-2/1/0:10.2.0.1 zone-3/1/0:10.3.0.1"},
		{name: "affinity, unweighted: 9 for the only tag; other zones left out",
			conf:   `{"localityAwareness":{"localZone":{"affinityTags":[{"key":"node"}]}}}`,
			want:   "zone-1/1/0:10.0.0.2 zone-1.node=n1/9/0:10.0.0.1",
			factor: 200},
		{name: "unweighted tags: the second weighs 9, the caller has no rack",
			conf:   `{"localityAwareness":{"localZone":{"affinityTags":[{"key":"rack"},{"key":"node"}]}}}`,
			want:   "zone-1/1/0:10.0.0.2 zone-1.node=n1/9/0:10.0.0.1",
			factor: 200},
		{name: "failover in rule order; a rule from another zone does not apply",
			conf: `{"localityAwareness":{"crossZone":{"failover":[
				{"from":{"zones":["zone-2"]},"to":{"type":"Any"}},
				{"to":{"type":"Only","zones":["zone-3"]}},
				{"to":{"type":"AnyExcept","zones":["zone-3"]}}]}}}`,
			want:   "zone-1/1/0:10.0.0.1,10.0.0.2 zone-2/1/2:10.2.0.1 zone-3/1/1:10.3.0.1",
			factor: 200},
		{name: "None admits nothing", conf: `{"localityAwareness":{"crossZone":{"failover":[{"to":{"type":"None"}}]}}}`,
			want: "zone-1/1/0:10.0.0.1,10.0.0.2", factor: 200},
		{name: "no local endpoint: the first failover is priority 0",
			conf: `{"localityAwareness":{"crossZone":{"failover":[{"to":{"type":"Only","zones":["zone-3"]}},{"to":{"type":"Any"}}],
				"failoverThreshold":{"percentage":"70"}}}}`,
			eps:    eps[2:],
			want:   "zone-2/1/1:10.2.0.1 zone-3/1/0:10.3.0.1",
			factor: 100},
		{name: "threshold 25 %", conf: `{"localityAwareness":{"crossZone":{"failover":[{"to":{"type":"Any"}}],"failoverThreshold":{"percentage":25}}}}`,
			want: "zone-1/1/0:10.0.0.1,10.0.0.2 zone-2/1/1:10.2.0.1 zone-3/1/1:10.3.0.1", factor: 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c meshLoadBalancingConf
			if err := json.Unmarshal([]byte(tc.conf), &c); err != nil {
				t.Fatal(err)
			}
			in := tc.eps
			if in == nil {
				in = eps
			}
			cla := loadAssignment(in, "zone-1", "svc", nil, c.localityPlan("zone-1", caller, true))
			var got []string
			for _, l := range cla.Endpoints {
				loc := l.Locality.Zone
				if l.Locality.SubZone != "" {
					loc += "." + l.Locality.SubZone
				}
				var addrs []string
				for _, e := range l.LbEndpoints {
					addrs = append(addrs, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
				}
				got = append(got, fmt.Sprintf("%s/%d/%d:%s", loc, l.LoadBalancingWeight.GetValue(), l.Priority, strings.Join(addrs, ",")))
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("localities\n got %s\nwant %s", g, tc.want)
			}
			if f := cla.GetPolicy().GetOverprovisioningFactor().GetValue(); f != tc.factor {
				t.Errorf("overprovisioning factor %d, want %d", f, tc.factor)
			}
			if err := cla.ValidateAll(); err != nil {
				t.Error(err)
			}
			// gRPC clients get no factor.
			if grpc := loadAssignment(in, "zone-1", "svc", nil, c.localityPlan("zone-1", caller, false)); grpc.GetPolicy() != nil {
				t.Errorf("a gRPC assignment has a policy: %v", grpc.GetPolicy())
			}
		})
	}
}
