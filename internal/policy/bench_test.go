package policy

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Benchmarks for BENCHMARKS.md:
//
//	go test -run '^$' -bench . -benchmem ./internal/policy/

func res(typ, name, spec string) *resource.Resource {
	return &resource.Resource{Type: typ, Mesh: "default", Name: name, Spec: json.RawMessage(spec)}
}

// benchDataplane has one inbound (service backend, with version and zone
// tags) and n outbounds to svc-0 ... svc-(n-1).
func benchDataplane(name string, n int, svcOffset int) *resource.Resource {
	outs := make([]string, n)
	for i := range outs {
		outs[i] = fmt.Sprintf(`{"port":%d,"tags":{"kuma.io/service":"svc-%d"}}`, 10000+i, (svcOffset+i)%1000)
	}
	return res("Dataplane", name, fmt.Sprintf(
		`{"networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"backend","version":"v1"}}],"outbound":[%s]}}`,
		strings.Join(outs, ",")))
}

// hundredPolicies: 100 policies of five to-types matching the proxy, each
// with a Mesh entry and a MeshService entry.
func hundredPolicies() []*resource.Resource {
	types := []string{"MeshTimeout", "MeshRetry", "MeshCircuitBreaker", "MeshHealthCheck", "MeshLoadBalancingStrategy"}
	confs := []string{
		`{"connectionTimeout":"%ds","http":{"requestTimeout":"%ds"}}`,
		`{"http":{"numRetries":%d,"perTryTimeout":"%ds"}}`,
		`{"connectionLimits":{"maxConnections":%d,"maxRequests":%d}}`,
		`{"interval":"%ds","timeout":"%ds"}`,
		`{"loadBalancer":{"type":"RoundRobin"},"x":%d,"y":%d}`,
	}
	var rs []*resource.Resource
	for i := 0; i < 100; i++ {
		t := i % len(types)
		top := `{"kind":"Mesh"}`
		if i%3 == 0 {
			top = `{"kind":"MeshService","name":"backend"}`
		}
		conf := func(a, b int) string { return fmt.Sprintf(confs[t], a, b) }
		spec := fmt.Sprintf(`{"targetRef":%s,"to":[{"targetRef":{"kind":"Mesh"},"default":%s},{"targetRef":{"kind":"MeshService","name":"svc-%d"},"default":%s}]}`,
			top, conf(i+1, i+2), (i*37)%1000, conf(i+3, i+4))
		rs = append(rs, res(types[t], fmt.Sprintf("policy-%03d", i), spec))
	}
	return rs
}

func benchSnapshot(b *testing.B, rs []*resource.Resource) *MeshSnapshot {
	b.Helper()
	s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: resource.NewDefaultRegistry(), Mesh: "default", Zone: "zone-1", Resources: rs})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// forgetMemos drops the snapshot's shared memos so that a benchmark
// measures a cold computation, as for the first Dataplane after a change.
func forgetMemos(s *MeshSnapshot) {
	s.fromMemo.Clear()
	s.toMemo.Clear()
}

// benchQuery measures q cold (memos dropped before every call, as for the
// first proxy computed after a change), warm (memos filled by a proxy
// selected by the same entries), and cold with JSON encoding (what the
// inspect API serves).
func benchQuery(b *testing.B, s *MeshSnapshot, q func() (any, error)) {
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			forgetMemos(s)
			if _, err := q(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("warm", func(b *testing.B) {
		for b.Loop() {
			if _, err := q(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cold+json", func(b *testing.B) {
		for b.Loop() {
			forgetMemos(s)
			r, err := q()
			if err != nil {
				b.Fatal(err)
			}
			// Encode as the zone API does: streamed.
			if a, ok := r.(interface{ WriteJSON(io.Writer) error }); ok {
				if err := a.WriteJSON(io.Discard); err != nil {
					b.Fatal(err)
				}
			} else if err := jsonv2.MarshalWrite(io.Discard, r, jsonv1.DefaultOptionsV1()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func rulesQuery(s *MeshSnapshot, dp string) func() (any, error) {
	return func() (any, error) { return s.Rules(dp, "") }
}

// BenchmarkRules100Policies1000Outbounds: BENCHMARKS.md, ≤ 20 ms.
func BenchmarkRules100Policies1000Outbounds(b *testing.B) {
	s := benchSnapshot(b, append(hundredPolicies(), benchDataplane("dp", 1000, 0)))
	benchQuery(b, s, rulesQuery(s, "dp"))
}

// mtpItems builds a MeshTrafficPermission from-array of n items spread over
// keys (n/keys values each), with alternating ALLOW/DENY.
func mtpItems(name string, n, keys int) *resource.Resource {
	per := n / keys
	items := make([]string, n)
	for i := range items {
		action := "ALLOW"
		if i%2 == 1 {
			action = "DENY"
		}
		items[i] = fmt.Sprintf(`{"targetRef":{"kind":"MeshSubset","tags":{"key-%d":"value-%d"}},"default":{"action":"%s"}}`, i/per, i%per, action)
	}
	return res("MeshTrafficPermission", name, `{"targetRef":{"kind":"Mesh"},"from":[`+strings.Join(items, ",")+`]}`)
}

func benchMTP(b *testing.B, n, keys int) {
	s := benchSnapshot(b, []*resource.Resource{mtpItems("mtp", n, keys), benchDataplane("dp", 1, 0)})
	if r, err := s.Rules("dp", ""); err != nil || len(r.Rules) != 1 {
		b.Fatalf("rules: %v", err)
	} else {
		b.Logf("%d items over %d keys: %d rules", n, keys, len(r.Rules[0].FromRules[0].Rules))
	}
	b.Run("rules", func(b *testing.B) { benchQuery(b, s, rulesQuery(s, "dp")) })
	b.Run("config+rbac", func(b *testing.B) {
		benchQuery(b, s, func() (any, error) { return s.Config("dp", "") })
	})
}

// BenchmarkMTP70Items2Keys: BENCHMARKS.md, ≤ 10 ms (the naive enumeration: 2^70).
func BenchmarkMTP70Items2Keys(b *testing.B) { benchMTP(b, 70, 2) }

// BenchmarkMTP200Items5Keys: 200 items over 5 keys (40 values each).
func BenchmarkMTP200Items5Keys(b *testing.B) { benchMTP(b, 200, 5) }

// tenThousandTimeouts: MeshTimeouts matching the proxy, alternately
// top-level Mesh and MeshService, each with a to (Mesh) and a from (Mesh)
// entry with its own values.
func tenThousandTimeouts() []*resource.Resource { return timeouts(10000) }

func timeouts(n int) []*resource.Resource {
	rs := make([]*resource.Resource, 0, n)
	for i := 0; i < n; i++ {
		top := `{"kind":"Mesh"}`
		if i%2 == 1 {
			top = `{"kind":"MeshService","name":"backend"}`
		}
		spec := fmt.Sprintf(`{"targetRef":%s,"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"%ds","idleTimeout":"%ds"}}],`+
			`"from":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"requestTimeout":"%ds"}}}]}`, top, i%60+1, i%30+1, i%90+1)
		rs = append(rs, res("MeshTimeout", fmt.Sprintf("timeout-%05d", i), spec))
	}
	return rs
}

// BenchmarkRules10000MeshTimeouts: BENCHMARKS.md, `_rules` of a proxy matched by
// 10,000 MeshTimeouts and a 70-item MeshTrafficPermission, ≤ 50 ms. The
// snapshot is built once, as the zone's cache does; building it is measured
// separately.
func BenchmarkRules10000MeshTimeouts(b *testing.B) {
	rs := append(tenThousandTimeouts(), mtpItems("mtp", 70, 2), benchDataplane("dp", 10, 0))
	s := benchSnapshot(b, rs)
	b.Run("rules", func(b *testing.B) { benchQuery(b, s, rulesQuery(s, "dp")) })
	b.Run("snapshot", func(b *testing.B) {
		for b.Loop() {
			benchSnapshot(b, rs)
		}
	})
	b.Run("snapshot-and-first-rules-after-one-change", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			s = changeFirst(b, s, rs, i)
			if _, err := s.Rules("dp", ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("snapshot-after-one-change", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			s = changeFirst(b, s, rs, i)
		}
	})
}

// BenchmarkRules100000MeshTimeouts: the scale bar's size, a proxy matched by
// 100,000 MeshTimeouts: the first `_rules` after one policy changed (the
// snapshot rebuilt from the previous one, then the query), and the status
// of every policy.
func BenchmarkRules100000MeshTimeouts(b *testing.B) {
	rs := append(timeouts(100000), mtpItems("mtp", 70, 2), benchDataplane("dp", 10, 0))
	s := benchSnapshot(b, rs)
	b.Run("snapshot-and-first-rules-after-one-change", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			s = changeFirst(b, s, rs, i)
			if _, err := s.Rules("dp", ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("snapshot-after-one-change", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			s = changeFirst(b, s, rs, i)
		}
	})
	// As the zone's view builds: from the previous snapshot and the change.
	b.Run("snapshot-from-changes-and-first-rules-after-one-change", func(b *testing.B) {
		s = benchSnapshot(b, rs) // the snapshot of rs, which the changes start from
		for i := 0; b.Loop(); i++ {
			s, rs = changeFirstByChanges(b, s, rs, i)
			if _, err := s.Rules("dp", ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("snapshot-from-changes-after-one-change", func(b *testing.B) {
		s = benchSnapshot(b, rs)
		for i := 0; b.Loop(); i++ {
			s, rs = changeFirstByChanges(b, s, rs, i)
		}
	})
	b.Run("statuses", func(b *testing.B) {
		for b.Loop() {
			forgetMemos(s)
			_ = s.computeStatuses()
		}
	})
	b.Run("global-policy-statuses", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			s = changeFirst(b, s, rs, i)
			_ = s.GlobalPolicyStatuses()
		}
	})
}

// BenchmarkRulesEncode100000: writing the `_rules` of a proxy matched by
// 100,000 MeshTimeouts that arrived in another order than their names
// sort in, so that, as in a zone's heap, the policies an origin list
// names one after the other lie apart.
func BenchmarkRulesEncode100000(b *testing.B) {
	rs := make([]*resource.Resource, 0, 100001)
	for i := range 100000 {
		r := res("MeshTimeout", fmt.Sprintf("t-%d", i), fmt.Sprintf(
			`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}}]}`, i%60+1))
		r.Labels = resource.LabelsOf("kuma.io/origin", "global", "kuma.io/display-name", r.Name)
		rs = append(rs, r)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	s := benchSnapshot(b, append(rs, benchDataplane("dp", 1, 0)))
	r, err := s.Rules("dp", "")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(r.AppendJSON(nil))))
	for b.Loop() {
		if err := r.WriteJSON(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// changeFirst builds the snapshot that follows prev when rs's first
// MeshTimeout changes (version i), reusing prev as the zone's cache does.
func changeFirst(b *testing.B, prev *MeshSnapshot, rs []*resource.Resource, i int) *MeshSnapshot {
	b.Helper()
	changed := append([]*resource.Resource(nil), rs...)
	changed[0] = res("MeshTimeout", rs[0].Name, fmt.Sprintf(
		`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"%ds"}}]}`, i%50+1))
	next, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: prev.reg, Mesh: "default", Zone: "zone-1", Resources: changed, Previous: prev})
	if err != nil {
		b.Fatal(err)
	}
	return next
}

// changeFirstByChanges is changeFirst through Inputs.Changes: it returns
// the next snapshot and its resources.
func changeFirstByChanges(b *testing.B, prev *MeshSnapshot, rs []*resource.Resource, i int) (*MeshSnapshot, []*resource.Resource) {
	b.Helper()
	changed := slices.Clone(rs)
	changed[0] = res("MeshTimeout", rs[0].Name, fmt.Sprintf(
		`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"%ds"}}]}`, i%50+1))
	next, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: prev.reg, Mesh: "default", Zone: "zone-1", Previous: prev,
		Changes: &Changes{Put: changed[:1]}})
	if err != nil {
		b.Fatal(err)
	}
	return next, changed
}

// BenchmarkRecompute1000Dataplanes: BENCHMARKS.md, after one policy change, build
// the new snapshot (reusing the previous one's decoded policies, as the
// zone's cache does) and recompute `_rules` of 1,000 Dataplanes (< 1 s).
func BenchmarkRecompute1000Dataplanes(b *testing.B) {
	policies := append(hundredPolicies(), mtpItems("mtp", 70, 2))
	var dps []*resource.Resource
	for i := 0; i < 1000; i++ {
		dps = append(dps, benchDataplane(fmt.Sprintf("dp-%04d", i), 20, i*20))
	}
	prev := benchSnapshot(b, append(append([]*resource.Resource(nil), policies...), dps...))
	i := 0
	for b.Loop() {
		i++
		changed := append([]*resource.Resource(nil), policies...)
		changed[0] = res("MeshTimeout", "policy-000", fmt.Sprintf(
			`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"%ds"}}]}`, i%50+1))
		s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: prev.reg, Mesh: "default", Zone: "zone-1",
			Resources: append(changed, dps...), Previous: prev})
		if err != nil {
			b.Fatal(err)
		}
		for _, dp := range s.Dataplanes() {
			if _, err := s.Rules(dp.Name, dp.Namespace); err != nil {
				b.Fatal(err)
			}
		}
		prev = s
	}
}

// tenThousandWithOverrides: tenThousandTimeouts where every tenth policy is
// a global one whose entries carry an override (merge) beside the default,
// and every hundredth a `when` constraint: the second pass of docs/policy.md#defaults-and-overrides on
// every outbound and client subset.
func tenThousandWithOverrides() []*resource.Resource {
	rs := tenThousandTimeouts()
	for i := 0; i < len(rs); i += 10 {
		when := ""
		if i%100 == 0 {
			when = `,"when":{"override":"has(self.idleTimeout)"}`
		}
		rs[i] = res("MeshTimeout", rs[i].Name, fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},`+
			`"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"%ds"},"override":{"idleTimeout":"%ds"}%s}],`+
			`"from":[{"targetRef":{"kind":"Mesh"},"override":{"http":{"requestTimeout":"%ds"}}}]}`, i%60+1, i%30+1, when, i%90+1))
		rs[i].Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal})
	}
	return rs
}

// BenchmarkRules10000MeshTimeoutsWithOverrides: BenchmarkRules10000MeshTimeouts
// with 1,000 override blocks among the 10,000 policies; the difference is
// the cost of the overrides pass. statuses measures computing the status of
// every policy of the snapshot (done once per snapshot, on first use).
func BenchmarkRules10000MeshTimeoutsWithOverrides(b *testing.B) {
	rs := append(tenThousandWithOverrides(), mtpItems("mtp", 70, 2), benchDataplane("dp", 10, 0))
	s := benchSnapshot(b, rs)
	b.Run("rules", func(b *testing.B) { benchQuery(b, s, rulesQuery(s, "dp")) })
	b.Run("explain", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Explain("dp", "", "MeshTimeout", ExplainTarget{Outbound: "svc-3"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("statuses", func(b *testing.B) {
		for b.Loop() {
			forgetMemos(s)
			_ = s.computeStatuses()
		}
	})
}

// BenchmarkStatuses1000Dataplanes: the status of every policy (100
// policies and a 70-item MeshTrafficPermission) over 1,000 Dataplanes with
// 20 outbounds each, computed once per snapshot on first use.
func BenchmarkStatuses1000Dataplanes(b *testing.B) {
	rs := append(hundredPolicies(), mtpItems("mtp", 70, 2))
	for i := 0; i < 1000; i++ {
		rs = append(rs, benchDataplane(fmt.Sprintf("dp-%04d", i), 20, i*20))
	}
	s := benchSnapshot(b, rs)
	for b.Loop() {
		forgetMemos(s)
		_ = s.computeStatuses()
	}
}

// BenchmarkSnapshotHeap100000MeshTimeouts reports the heap a zone's
// snapshot of 100,000 MeshTimeouts holds once its statuses and one proxy's
// rules are computed (heap-MiB, measured after a GC; run with -benchtime 1x),
// and the heap spans it takes (inuse-MiB): live objects plus the free slots
// of spans they share with the build's garbage, which resident memory pays
// too.
func BenchmarkSnapshotHeap100000MeshTimeouts(b *testing.B) {
	rs := append(timeouts(100000), mtpItems("mtp", 70, 2), benchDataplane("dp", 10, 0))
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := benchSnapshot(b, rs)
		s.ComputeStatuses()
		if _, err := s.Rules("dp", ""); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "inuse-MiB")
		runtime.KeepAlive(s)
	}
}

// BenchmarkReadSpec: reading one MeshTimeout's spec with the strict v2
// decoder (readSpec) and with encoding/json's Unmarshal (readSpecStd: the
// fallback for a spec the strict decoder refuses; each default then parsed by
// resource.ParseJSON in both).
func BenchmarkReadSpec(b *testing.B) {
	raw := []byte(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"2s","http":{"requestTimeout":"15s","streamIdleTimeout":"30m"},"idleTimeout":"1h"}}],"from":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"3s"}}]}`)
	for _, c := range []struct {
		name string
		read func(json.RawMessage) (*rawSpec, error)
	}{{"v2", readSpec}, {"unmarshal", readSpecStd}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.read(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
