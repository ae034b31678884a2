package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// yamlResources decodes and validates a YAML list of resource documents.
func yamlResources(t *testing.T, doc string) []*resource.Resource {
	t.Helper()
	var raw []json.RawMessage
	if err := yaml.Unmarshal([]byte(doc), &raw); err != nil {
		t.Fatal(err)
	}
	return decodeResources(t, raw, "")
}

func mustSnapshot(t testing.TB, zone string, rs []*resource.Resource) *MeshSnapshot {
	t.Helper()
	s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: resource.NewDefaultRegistry(), Mesh: "default", Zone: zone, Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const sugarDataplanes = `
- type: Dataplane
  mesh: default
  name: backend-1
  namespace: backend-ns
  networking:
    address: 10.0.0.2
    inbound: [{port: 8080, tags: {kuma.io/service: backend}}]
    outbound: [{port: 10001, tags: {kuma.io/service: backend, k8s.kuma.io/namespace: backend-ns}}]
- type: Dataplane
  mesh: default
  name: backend-remote
  namespace: backend-ns
  networking:
    address: 10.0.0.5
    inbound: [{port: 8080, tags: {kuma.io/service: backend, kuma.io/zone: zone-2}}]
- type: Dataplane
  mesh: default
  name: frontend-1
  namespace: frontend-ns
  networking:
    address: 10.0.0.1
    inbound: [{port: 8080, tags: {kuma.io/service: frontend}}]
    outbound: [{port: 10001, tags: {kuma.io/service: backend, k8s.kuma.io/namespace: backend-ns}}]
- type: Dataplane
  mesh: default
  name: other-1
  namespace: other-ns
  networking:
    address: 10.0.0.3
    inbound: [{port: 8080, tags: {kuma.io/service: other}}]
    outbound: [{port: 10001, tags: {kuma.io/service: backend, k8s.kuma.io/namespace: backend-ns}}]
`

// TestSugarEquivalence: the implicit-targetRef "semantically equal" pairs give the same
// `_config` on every Dataplane and match the same Dataplanes.
func TestSugarEquivalence(t *testing.T) {
	cases := []struct{ name, sugar, explicit string }{
		{
			name: "producer: empty top-level targetRef and empty to namespace",
			sugar: `
- {type: MeshTimeout, mesh: default, name: p, namespace: backend-ns,
   spec: {to: [{targetRef: {kind: MeshService, name: backend}, default: {idleTimeout: 1s}}]}}`,
			explicit: `
- {type: MeshTimeout, mesh: default, name: p, namespace: backend-ns,
   spec: {targetRef: {kind: Mesh}, to: [{targetRef: {kind: MeshService, name: backend, namespace: backend-ns}, default: {idleTimeout: 1s}}]}}`,
		},
		{
			name: "workload-owner: empty top-level targetRef",
			sugar: `
- {type: MeshTimeout, mesh: default, name: p, namespace: backend-ns,
   spec: {from: [{targetRef: {kind: Mesh}, default: {idleTimeout: 2s}}]}}`,
			explicit: `
- {type: MeshTimeout, mesh: default, name: p, namespace: backend-ns,
   spec: {targetRef: {kind: MeshSubset, tags: {k8s.kuma.io/namespace: backend-ns, kuma.io/zone: zone-1}},
          from: [{targetRef: {kind: Mesh}, default: {idleTimeout: 2s}}]}}`,
		},
		{
			name: "workload-owner: top-level Mesh",
			sugar: `
- {type: MeshTrafficPermission, mesh: default, name: p, namespace: backend-ns,
   spec: {targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, default: {action: DENY}}]}}`,
			explicit: `
- {type: MeshTrafficPermission, mesh: default, name: p, namespace: backend-ns,
   spec: {targetRef: {kind: MeshSubset, tags: {k8s.kuma.io/namespace: backend-ns, kuma.io/zone: zone-1}},
          from: [{targetRef: {kind: Mesh}, default: {action: DENY}}]}}`,
		},
		{
			name: "consumer: empty top-level targetRef",
			sugar: `
- {type: MeshTimeout, mesh: default, name: p, namespace: frontend-ns,
   spec: {to: [{targetRef: {kind: MeshService, name: backend, namespace: backend-ns}, default: {idleTimeout: 3s}}]}}`,
			explicit: `
- {type: MeshTimeout, mesh: default, name: p, namespace: frontend-ns,
   spec: {targetRef: {kind: MeshSubset, tags: {k8s.kuma.io/namespace: frontend-ns, kuma.io/zone: zone-1}},
          to: [{targetRef: {kind: MeshService, name: backend, namespace: backend-ns}, default: {idleTimeout: 3s}}]}}`,
		},
		{
			name: "empty from[].targetRef",
			sugar: `
- {type: MeshTimeout, mesh: default, name: p, namespace: backend-ns,
   spec: {from: [{default: {}}]}}`,
			explicit: `
- {type: MeshTimeout, mesh: default, name: p, namespace: backend-ns,
   spec: {targetRef: {kind: MeshSubset, tags: {k8s.kuma.io/namespace: backend-ns, kuma.io/zone: zone-1}},
          from: [{targetRef: {kind: Mesh}, default: {}}]}}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dps := yamlResources(t, sugarDataplanes)
			a := mustSnapshot(t, "zone-1", append(yamlResources(t, tc.sugar), dps...))
			b := mustSnapshot(t, "zone-1", append(yamlResources(t, tc.explicit), dps...))
			applied := 0
			for _, dp := range a.Dataplanes() {
				ca, errA := a.Config(dp.Name, dp.Namespace)
				cb, errB := b.Config(dp.Name, dp.Namespace)
				if errA != nil || errB != nil {
					t.Fatal(errA, errB)
				}
				ja, jb := compact(ca), compact(cb)
				if ja != jb {
					t.Errorf("%s:\n sugar    %s\n explicit %s", dp.Name, ja, jb)
				}
				if strings.Contains(ja, `"name":"p"`) {
					applied++
				}
			}
			if applied == 0 {
				t.Errorf("the policy applies to no Dataplane: the case tests nothing")
			}
			typ := a.types[a.typeNames[0]].desc.Name
			ma, _ := a.MatchedDataplanes(typ, "p", a.types[typ].policies[0].resNS)
			mb, _ := b.MatchedDataplanes(typ, "p", b.types[typ].policies[0].resNS)
			if compact(ma) != compact(mb) {
				t.Errorf("matched: sugar %s, explicit %s", compact(ma), compact(mb))
			}
		})
	}
}

func TestNewMeshSnapshotErrors(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	dp := dpWithBackend()
	cases := []struct {
		name string
		in   Inputs
		want string
	}{
		{"no registry", Inputs{SystemNamespace: "kuma-system", Mesh: "default"}, "no registry"},
		{"nil resource", Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Resources: []*resource.Resource{nil}}, "resources[0] is nil"},
		{"other mesh", Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "other", Resources: []*resource.Resource{dp}}, "belongs to mesh"},
		{"unknown type", Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Resources: []*resource.Resource{{Type: "Nope", Mesh: "default", Name: "x"}}}, "unknown resource type"},
		{"duplicate", Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Resources: []*resource.Resource{dp, dp.Clone()}}, "duplicate"},
		{"no system namespace", Inputs{Registry: reg, Mesh: "default"}, "no system namespace"},
		{"duplicate in the system namespace", Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Resources: []*resource.Resource{
			{Type: "MeshTimeout", Mesh: "default", Name: "t"},
			{Type: "MeshTimeout", Mesh: "default", Name: "t", Namespace: plane.DefaultSystemNamespace}}}, "duplicate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewMeshSnapshot(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	// One name in two types, or in two namespaces, is not a duplicate.
	_, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Resources: []*resource.Resource{
		{Type: "MeshTimeout", Mesh: "default", Name: "t"}, {Type: "MeshRetry", Mesh: "default", Name: "t"},
		{Type: "MeshTimeout", Mesh: "default", Name: "t", Namespace: "ns1"}}})
	if err != nil {
		t.Fatalf("distinct resources refused: %v", err)
	}
}

// TestBrokenInputsBecomeWarnings: resources the engine cannot evaluate are
// reported on the Dataplanes, never turned into errors or panics.
func TestBrokenInputsBecomeWarnings(t *testing.T) {
	rs := []*resource.Resource{
		{Type: "MeshTimeout", Mesh: "default", Name: "bad-json", Spec: json.RawMessage(`{"to": 5}`)},
		{Type: "MeshTimeout", Mesh: "default", Name: "mixed", Namespace: "ns1",
			Spec: json.RawMessage(`{"to":[{"targetRef":{"kind":"MeshService","name":"a"}},{"targetRef":{"kind":"MeshService","name":"b","namespace":"ns2"}}]}`)},
		{Type: "MeshTimeout", Mesh: "default", Name: "good",
			Spec: json.RawMessage(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}`)},
		{Type: "Dataplane", Mesh: "default", Name: "broken", Spec: json.RawMessage(`{"networking": []}`)},
		{Type: "Dataplane", Mesh: "default", Name: "web", Spec: json.RawMessage(
			`{"networking":{"address":"1.1.1.1","inbound":[{"port":1,"tags":{"kuma.io/service":"web"}}],"outbound":[{"port":2,"tags":{"kuma.io/service":"x"}}]}}`)},
	}
	s := mustSnapshot(t, "z", rs)
	res, err := s.Rules("web", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rules) != 1 || len(res.Rules[0].Warnings) != 2 || len(res.Rules[0].ToRules) != 1 {
		t.Fatalf("rules %s", compact(res))
	}
	for _, w := range res.Rules[0].Warnings {
		if !strings.Contains(w, "skipped") {
			t.Errorf("warning %q", w)
		}
	}
	broken, err := s.Rules("broken", "")
	if err != nil || len(broken.Warnings) != 1 {
		t.Fatalf("broken Dataplane: %v %s", err, compact(broken))
	}
	if m, err := s.MatchedDataplanes("MeshTimeout", "bad-json", ""); err != nil || len(m) != 0 {
		t.Fatalf("skipped policy: %v %v", m, err)
	}
	if _, err := s.MatchedDataplanes("MeshTimeout", "nope", ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown policy: %v", err)
	}
	if _, err := s.Config("nope", "ns"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown Dataplane: %v", err)
	}
}

// TestNoPermissionDeniesAll: docs/policy.md#rbac, an inbound without any
// MeshTrafficPermission gets an ALLOW RBAC without policies.
func TestNoPermissionDeniesAll(t *testing.T) {
	s := mustSnapshot(t, "z", []*resource.Resource{dpWithBackend()})
	cfg, err := s.Config("backend-1", "")
	if err != nil {
		t.Fatal(err)
	}
	got := compact(cfg.Inbounds[0].RBAC)
	want := `{"rules":{"action":"ALLOW","policies":{}},"shadow_rules":{"action":"ALLOW","policies":{}}}`
	if got != want {
		t.Fatalf("rbac %s, want %s", got, want)
	}
}

// TestTooManyRules: confs that really combine over many keys are bounded
// with a warning instead of exhausting memory.
func TestTooManyRules(t *testing.T) {
	var from []string
	for k := 0; k < 20; k++ {
		from = append(from, fmt.Sprintf(`{"targetRef":{"kind":"MeshSubset","tags":{"k%d":"v"}},"default":{"f%d":"x"}}`, k, k))
	}
	spec := `{"targetRef":{"kind":"Mesh"},"from":[` + strings.Join(from, ",") + `]}`
	s := mustSnapshot(t, "z", []*resource.Resource{dpWithBackend(),
		{Type: "MeshTimeout", Mesh: "default", Name: "wide", Spec: json.RawMessage(spec)}})
	res, err := s.Rules("backend-1", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rules) != 1 || len(res.Rules[0].FromRules) != 0 || len(res.Rules[0].Warnings) != 1 ||
		!strings.Contains(res.Rules[0].Warnings[0], "too many from-rules") {
		t.Fatalf("rules %.500s", compact(res))
	}
}

// TestConcurrentQueries runs every query from many goroutines on one
// snapshot (meaningful under -race).
func TestConcurrentQueries(t *testing.T) {
	gc, s := loadCase(t, "testdata/seed003-three-policies/input.yaml")
	want := map[int]string{}
	for i, req := range gc.Requests {
		resp, err := runRequest(s, req)
		want[i] = compact(resp) + fmt.Sprint(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, req := range gc.Requests {
				resp, err := runRequest(s, req)
				if got := compact(resp) + fmt.Sprint(err); got != want[i] {
					t.Errorf("request %d differs under concurrency", i)
				}
			}
		}()
	}
	wg.Wait()
}

// TestPreviousSnapshotReuse: a snapshot built with Previous gives the same
// results, reuses the parse of unchanged policies (the same resource
// objects, as the zone's view passes them) and parses changed ones again.
func TestPreviousSnapshotReuse(t *testing.T) {
	gc, loaded := loadCase(t, "testdata/seed004-roles/input.yaml")
	rs := decodeResources(t, gc.Resources, "")
	first, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: loaded.reg, Mesh: "default", Zone: "zone-1", Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	rs = slices.Clone(rs)
	var changedKey resource.Key
	for i, r := range rs {
		if r.Name == "zz-backend-producer" {
			c := r.Clone()
			c.Spec = json.RawMessage(strings.Replace(string(c.Spec), "10s", "11s", 1))
			rs[i], changedKey = c, c.Key()
		}
	}
	in := Inputs{SystemNamespace: "kuma-system", Registry: first.reg, Mesh: "default", Zone: "zone-1", Resources: rs}
	fresh, err := NewMeshSnapshot(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Previous = first
	before := first.parses.m.all() // the rebuild takes it
	reused, err := NewMeshSnapshot(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, dp := range fresh.Dataplanes() {
		a, _ := fresh.Config(dp.Name, dp.Namespace)
		b, _ := reused.Config(dp.Name, dp.Namespace)
		if compact(a) != compact(b) {
			t.Errorf("%s: with Previous %s\nwithout %s", dp.Name, compact(b), compact(a))
		}
	}
	if first.parses.m != nil {
		t.Error("the rebuild did not take the previous snapshot's parse table")
	}
	for name, c := range reused.parses.m.all() {
		k := name.desc.Name + " " + name.name
		changed := name.desc.Name == changedKey.Type && name.name == changedKey.Name
		prev, ok := before[name]
		if !ok {
			t.Fatalf("%s: not in the previous snapshot's parse table", k)
		}
		if same := prev.pol != nil && c.pol != nil && prev.pol.policyDef == c.pol.policyDef; same == changed {
			t.Errorf("%s: parse reused %v", k, same)
		}
		// Nothing the policies' targets depend on changed, and the changed
		// policy kept its place: the others are the previous snapshot's.
		if shared := c.pol != nil && c.pol == prev.pol; shared == changed {
			t.Errorf("%s: policy shared with the previous snapshot %v", k, shared)
		}
	}
	if !strings.Contains(compact(must(reused.Config("other-1", "other-ns"))), `"requestTimeout":"11s"`) {
		t.Errorf("the changed policy is not applied")
	}
}

// all is a copy of m's parses, each whole.
func (m *parseMap) all() map[typedName]parsedPolicy {
	out := map[typedName]parsedPolicy{}
	for k := range m.pols {
		out[k], _ = m.get(k)
	}
	maps.Copy(out, m.failed)
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestRebuiltSnapshotsAnswerAsFresh: every golden case's requests, plus the
// rules and config of every Dataplane and every policy's status, answer the
// same from a fresh snapshot as from snapshots rebuilt from previous ones
// (which clone unchanged policies): after a snapshot that lacked half the
// resources (so targets resolved differently and had other warnings), and
// after a rebuild where nothing changed. The previous snapshots are queried
// first so that their memos and statuses exist and must not leak.
func TestRebuiltSnapshotsAnswerAsFresh(t *testing.T) {
	dirs, err := filepath.Glob("testdata/*/input.yaml")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, input := range dirs {
		t.Run(filepath.Base(filepath.Dir(input)), func(t *testing.T) {
			gc, fresh := loadCase(t, input)
			all := decodeResources(t, gc.Resources, gc.SystemNamespace)
			build := func(rs []*resource.Resource, prev *MeshSnapshot) *MeshSnapshot {
				s, err := NewMeshSnapshot(Inputs{Registry: fresh.reg, Mesh: gc.Mesh, Zone: gc.Zone,
					SystemNamespace: gc.SystemNamespace, Resources: rs, Previous: prev})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			var half []*resource.Resource
			for i, r := range all {
				if i%2 == 0 || r.Type == "Dataplane" {
					half = append(half, r)
				}
			}
			want := answers(t, gc, fresh)
			partial := build(half, build(all, nil))
			answers(t, gc, partial)
			rebuilt := build(all, partial)
			if got := answers(t, gc, rebuilt); got != want {
				t.Errorf("rebuilt after a partial snapshot:\n%s", firstDiff(want, got))
			}
			again := build(all, rebuilt)
			if got := answers(t, gc, again); got != want {
				t.Errorf("rebuilt with nothing changed:\n%s", firstDiff(want, got))
			}
			if got := answers(t, gc, rebuilt); got != want {
				t.Errorf("a snapshot changed after the next was built from it:\n%s", firstDiff(want, got))
			}
			// The same from changes: the missing half put, then nothing.
			inHalf := map[*resource.Resource]bool{}
			for _, r := range half {
				inHalf[r] = true
			}
			ch := &Changes{}
			for _, r := range all {
				if !inHalf[r] {
					ch.Put = append(ch.Put, r)
				}
			}
			fromChanges := func(prev *MeshSnapshot, ch *Changes) *MeshSnapshot {
				s, err := NewMeshSnapshot(Inputs{Registry: fresh.reg, Mesh: gc.Mesh, Zone: gc.Zone,
					SystemNamespace: gc.SystemNamespace, Changes: ch, Previous: prev})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			// Each previous snapshot is queried first: the next one reuses
			// the outbound results it memoized (carried).
			queried := build(half, build(all, nil))
			answers(t, gc, queried)
			changed := fromChanges(queried, ch)
			if got := answers(t, gc, changed); got != want {
				t.Errorf("built from changes after a partial snapshot:\n%s", firstDiff(want, got))
			}
			if got := answers(t, gc, fromChanges(changed, &Changes{})); got != want {
				t.Errorf("built from no changes:\n%s", firstDiff(want, got))
			}
			// Policies only (not routes): the changes are spliced in.
			var base []*resource.Resource
			policiesOnly := &Changes{}
			for i, r := range all {
				if d, _ := fresh.reg.Lookup(r.Type); d.IsPolicy() && r.Type != "MeshHTTPRoute" && i%2 == 1 {
					policiesOnly.Put = append(policiesOnly.Put, r)
					continue
				}
				base = append(base, r)
			}
			prev := build(base, nil)
			answers(t, gc, prev)
			spliced := fromChanges(prev, policiesOnly)
			if fmt.Sprintf("%p", spliced.services) != fmt.Sprintf("%p", prev.services) {
				t.Errorf("policy changes were not spliced in")
			}
			if got := answers(t, gc, spliced); got != want {
				t.Errorf("policies spliced in:\n%s", firstDiff(want, got))
			}
		})
	}
}

// answers renders everything a snapshot answers about a golden case.
func answers(t *testing.T, gc *goldenCase, s *MeshSnapshot) string {
	t.Helper()
	var out []any
	for _, req := range gc.Requests {
		resp, err := runRequest(s, req)
		out = append(out, resp, fmt.Sprint(err))
	}
	for _, dp := range s.Dataplanes() {
		r, err := s.Rules(dp.Name, dp.Namespace)
		c, cerr := s.Config(dp.Name, dp.Namespace)
		out = append(out, r, fmt.Sprint(err), c, fmt.Sprint(cerr))
	}
	out = append(out, s.GlobalPolicyStatuses())
	b, err := json.MarshalIndent(out, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRebuildKeepsOrder: random rounds of adds, changes and deletes over
// MeshTimeouts whose sort keys collide often (top kinds, origins, roles,
// display names shared across namespaces, rules with several matches). A
// snapshot rebuilt from the previous one (which merges the changed policies
// into the kept order, shares the unchanged policies whose numbers stay and
// clones those whose numbers move) orders and numbers policies, entries and
// override blocks exactly as a fresh one. The previous snapshot is queried
// while the next is built: under -race, a write to a shared policy fails.
func TestRebuildKeepsOrder(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	rng := rand.New(rand.NewPCG(7, 11))
	live := map[resource.Key]*resource.Resource{}
	var prev *MeshSnapshot
	shared, cloned := 0, 0
	for round := 0; round < 40; round++ {
		for range 1 + rng.IntN(30) {
			name := fmt.Sprintf("t-%02d", rng.IntN(40))
			ns := []string{"", "a", "b"}[rng.IntN(3)]
			r := timeoutVersion(name, ns, rng.IntN(1000))
			if rng.IntN(5) == 0 {
				delete(live, r.Key())
				continue
			}
			live[r.Key()] = r
		}
		rs := []*resource.Resource{benchDataplane("dp", 2, 0)}
		for _, r := range live {
			rs = append(rs, r)
		}
		build := func(p *MeshSnapshot) *MeshSnapshot {
			s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: rs, Previous: p})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		var reading sync.WaitGroup
		built := make(chan struct{})
		var before map[typedName]parsedPolicy
		if prev != nil {
			before = prev.parses.m.all()
			before := orderOf(prev)
			reading.Go(func() {
				for {
					if _, err := prev.Rules("dp", ""); err != nil {
						t.Error(err)
					}
					if orderOf(prev) != before {
						t.Error("the previous snapshot's numbers changed")
					}
					select {
					case <-built:
						return
					default:
					}
				}
			})
		}
		rebuilt := build(prev)
		close(built)
		reading.Wait()
		fresh := build(nil)
		if got, want := orderOf(rebuilt), orderOf(fresh); got != want {
			t.Fatalf("round %d: rebuilt order\n%s\nfresh order\n%s", round, got, want)
		}
		if prev != nil {
			for k, parse := range rebuilt.parses.m.all() {
				if old, ok := before[k]; ok && old.pol != nil && parse.pol != nil && old.pol.policyDef == parse.pol.policyDef {
					if parse.pol == old.pol {
						shared++
					} else {
						cloned++
					}
				}
			}
		}
		prev = rebuilt
	}
	if shared == 0 || cloned == 0 {
		t.Fatalf("unchanged policies shared %d times and cloned %d times: both paths must be exercised", shared, cloned)
	}
}

// orderOf lists a snapshot's MeshTimeouts and their entries in sort order.
func orderOf(s *MeshSnapshot) string {
	t := s.types["MeshTimeout"]
	if t == nil {
		return ""
	}
	var b strings.Builder
	for i, p := range t.policies {
		fmt.Fprintf(&b, "%d %s/%s idx=%d\n", i, p.resNS, p.resName, p.idx)
	}
	for _, list := range [][]*entry{t.to, t.from} {
		for i, e := range list {
			fmt.Fprintf(&b, "%d %s/%s[%d] pos=%d order=%d", i, e.pol.resNS, e.pol.resName, e.index, e.pos, e.c.order)
			if e.o != nil {
				fmt.Fprintf(&b, " override=%d", e.o.order)
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// TestParseMapKeepsOneParsePerName: a name's parse moves between the
// policies and the failures as it is parsed again, and a policy's parse
// reads its resource from the policy.
func TestParseMapKeepsOneParsePerName(t *testing.T) {
	r1, r2 := res("MeshTimeout", "a", "{}"), res("MeshTimeout", "a", "{}")
	k := typedName{name: "a"}
	m := newParseMap(0)
	steps := []struct {
		name string
		set  parsedPolicy
		want parsedPolicy
	}{
		{"failed", parsedPolicy{res: r1, err: errors.New("bad")}, parsedPolicy{res: r1, err: errors.New("bad")}},
		{"parsed", parsedPolicy{pol: &policy{policyDef: &policyDef{resName: r2.Name}}}, parsedPolicy{}},
		{"failed again", parsedPolicy{res: r1, err: errors.New("worse")}, parsedPolicy{res: r1, err: errors.New("worse")}},
	}
	for _, s := range steps {
		m.set(k, s.set)
		got, ok := m.get(k)
		if !ok || got.res != s.want.res || (got.pol == nil) != (s.set.pol == nil) || fmt.Sprint(got.err) != fmt.Sprint(s.want.err) {
			t.Fatalf("%s: got %+v, want %+v", s.name, got, s.want)
		}
		if m.len() != 1 {
			t.Fatalf("%s: %d parses for one name", s.name, m.len())
		}
	}
	m.remove(k)
	if _, ok := m.get(k); ok || m.len() != 0 {
		t.Fatal("a removed parse is still there")
	}
	var none *parseMap
	if _, ok := none.get(k); ok {
		t.Fatal("a nil map has a parse")
	}
}

// TestReuseByContent: a build with Previous reuses the parse of a resource
// with the same spec, labels and (for a legacy policy) creation time, even
// when it is another object, and parses one that differs in any of them.
func TestReuseByContent(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	mt := res("MeshTimeout", "a", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}`)
	tp := res("TrafficPermission", "p", `{"sources":[{"match":{"kuma.io/service":"web"}}],"destinations":[{"match":{"kuma.io/service":"backend"}}]}`)
	tp.CreationTime = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	dp := benchDataplane("dp", 1, 0)
	build := func(prev *MeshSnapshot, rs ...*resource.Resource) *MeshSnapshot {
		t.Helper()
		s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: append(rs, dp), Previous: prev})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	def := func(s *MeshSnapshot, typ string) *policyDef { return s.types[typ].policies[0].policyDef }
	steps := []struct {
		name           string
		mt, tp         func(*resource.Resource) *resource.Resource
		sameMT, sameTP bool
	}{
		{"other objects, same content", clone, clone, true, true},
		{"a label added, a later creation time", func(r *resource.Resource) *resource.Resource {
			c := r.Clone()
			c.Labels.Set("team", "a")
			return c
		}, func(r *resource.Resource) *resource.Resource {
			c := r.Clone()
			c.CreationTime = c.CreationTime.Add(time.Hour)
			return c
		}, false, false},
		{"another spec", func(r *resource.Resource) *resource.Resource {
			c := r.Clone()
			c.Spec = json.RawMessage(strings.Replace(string(c.Spec), "1s", "2s", 1))
			return c
		}, clone, false, true},
		{"a modification time and version only", func(r *resource.Resource) *resource.Resource {
			c := r.Clone()
			c.Version++
			c.ModificationTime = c.ModificationTime.Add(time.Minute)
			return c
		}, clone, true, true},
	}
	prev := build(nil, mt, tp)
	for _, s := range steps {
		mt, tp = s.mt(mt), s.tp(tp)
		next := build(prev, mt, tp)
		if got := def(next, "MeshTimeout") == def(prev, "MeshTimeout"); got != s.sameMT {
			t.Errorf("%s: MeshTimeout parse reused %v, want %v", s.name, got, s.sameMT)
		}
		if got := def(next, "TrafficPermission") == def(prev, "TrafficPermission"); got != s.sameTP {
			t.Errorf("%s: TrafficPermission parse reused %v, want %v", s.name, got, s.sameTP)
		}
		if got, want := compact(must(next.Rules("dp", ""))), compact(must(build(nil, mt, tp).Rules("dp", ""))); got != want {
			t.Errorf("%s: rules %s, built afresh %s", s.name, got, want)
		}
		prev = next
	}
}

func clone(r *resource.Resource) *resource.Resource { return r.Clone() }

// TestExplainIsMemoized: an explanation is computed once per snapshot and
// query (viewers repeating it do not re-run `when` expressions); Limit
// returns a copy and leaves the memoized one whole.
func TestExplainIsMemoized(t *testing.T) {
	s := mustSnapshot(t, "zone-1", yamlResources(t, `
- type: Dataplane
  mesh: default
  name: web-1
  networking:
    address: 10.0.0.1
    inbound: [{port: 8080, tags: {kuma.io/service: web}}]
    outbound: [{port: 10001, tags: {kuma.io/service: backend}}]
- type: MeshTimeout
  mesh: default
  name: a
  spec: {targetRef: {kind: Mesh}, to: [{targetRef: {kind: Mesh}, default: {idleTimeout: 1s}}]}
- type: MeshTimeout
  mesh: default
  name: b
  spec: {targetRef: {kind: Mesh}, to: [{targetRef: {kind: Mesh}, default: {idleTimeout: 2s}}]}
`))
	first, err := s.Explain("web-1", "", "MeshTimeout", ExplainTarget{Outbound: "backend"})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := s.Explain("web-1", "", "MeshTimeout", ExplainTarget{Outbound: "backend"})
	if first != again {
		t.Error("the same query computed twice")
	}
	limited := first.Limit(1)
	if len(first.Blocks) != 2 || len(limited.Blocks) != 1 || limited.BlocksTotal != 2 {
		t.Errorf("Limit: memoized %d blocks, limited %d of %d", len(first.Blocks), len(limited.Blocks), limited.BlocksTotal)
	}
}
