package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestChangesBuildAsFresh: random rounds of adds, changes and deletes of
// MeshTimeouts (colliding sort keys, overrides, unreadable specs),
// MeshTraces (proxy-wide defaults and overrides), Dataplanes, and now and
// then a MeshHTTPRoute or a MeshService (which need a full build). Every
// round builds the next snapshot from the previous one and the changes
// (Inputs.Changes) and a fresh one from the full list: they order, number
// and answer alike. The previous snapshot is queried while the next is
// built: under -race, a write to a shared policy fails.
func TestChangesBuildAsFresh(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	rng := rand.New(rand.NewPCG(13, 17))
	live := map[resource.Key]*resource.Resource{}
	put := func(r *resource.Resource) { live[r.Key()] = r }
	for i := range 30 {
		put(randomTimeout(rng, i))
	}
	put(benchDataplane("dp", 2, 0))
	list := func() []*resource.Resource {
		out := make([]*resource.Resource, 0, len(live))
		for _, r := range live {
			out = append(out, r)
		}
		return out
	}
	prev, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: list()})
	if err != nil {
		t.Fatal(err)
	}
	spliced, full, seeded, summaries, sharedQuick := 0, 0, 0, 0, 0
	for round := 0; round < 300; round++ {
		before := maps_Clone(live)
		for range 1 + rng.IntN(4) {
			switch n := rng.IntN(20); {
			case n == 0:
				put(res("MeshHTTPRoute", fmt.Sprintf("route-%d", rng.IntN(2)), `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},`+
					`"rules":[{"matches":[{"path":{"type":"PathPrefix","value":"/v2"}}],"default":{"backendRefs":[{"kind":"MeshService","name":"backend"}]}}]}]}`))
			case n == 1:
				put(res("MeshService", fmt.Sprintf("svc-%d", rng.IntN(2)), `{"selector":{"dataplaneTags":{"app":"backend"}},"ports":[{"port":80,"targetPort":8080,"appProtocol":"http"}]}`))
			case n == 2:
				put(benchDataplane(fmt.Sprintf("dp-%d", rng.IntN(3)), 1+rng.IntN(3), rng.IntN(5)))
			case n < 5:
				put(randomTrace(rng))
			case n < 7:
				var keys []resource.Key
				for k := range live {
					if k.Type != "Dataplane" || k.Name != "dp" {
						keys = append(keys, k)
					}
				}
				if len(keys) > 0 {
					delete(live, keys[rng.IntN(len(keys))])
				}
			default:
				put(randomTimeout(rng, rng.IntN(40)))
			}
		}
		// A replaced resource is put, with its key among the deleted or
		// not; a key the previous snapshot never had may be deleted.
		ch := &Changes{}
		for k, r := range live {
			if old := before[k]; old != r {
				ch.Put = append(ch.Put, r)
				if old != nil && rng.IntN(2) == 0 {
					ch.Deleted = append(ch.Deleted, k)
				}
			}
		}
		for k := range before {
			if live[k] == nil {
				ch.Deleted = append(ch.Deleted, k)
			}
		}
		if rng.IntN(4) == 0 {
			ch.Deleted = append(ch.Deleted, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "never-there"})
		}
		var reading sync.WaitGroup
		built := make(chan struct{})
		prevOrder := numbersOf(prev)
		reading.Go(func() {
			for {
				if _, err := prev.Rules("dp", ""); err != nil {
					t.Error(err)
				}
				select {
				case <-built:
					return
				default:
				}
			}
		})
		next, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Changes: ch, Previous: prev})
		close(built)
		carried := map[string]bool{}
		if err == nil {
			for name, nt := range next.types {
				if carried[name] = nt.toSeed != nil; carried[name] {
					seeded++
				}
				if nt.summed.Load() != nil { // carried: nothing asked for it yet
					summaries++
				}
				if pt := prev.types[name]; pt != nil && pt != nt && len(nt.quick) > 0 && len(pt.quick) > 0 && &nt.quick[0] == &pt.quick[0] {
					sharedQuick++
				}
			}
		}
		reading.Wait()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if numbersOf(prev) != prevOrder {
			t.Fatalf("round %d: building from the previous snapshot changed its numbers", round)
		}
		if fmt.Sprintf("%p", next.services) == fmt.Sprintf("%p", prev.services) {
			spliced++
		} else {
			full++
		}
		fresh, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: list()})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := numbersOf(next), numbersOf(fresh); got != want {
			t.Fatalf("round %d: changes %s\nfrom changes:\n%s\nfresh:\n%s", round, describe(ch), got, want)
		}
		if got, want := answers(t, &goldenCase{}, next), answers(t, &goldenCase{}, fresh); got != want {
			t.Fatalf("round %d: changes %s: answers differ:\n%s", round, describe(ch), firstDiff(want, got))
		}
		for name, nt := range next.types {
			checkSummary(t, fmt.Sprintf("round %d: %s", round, name), nt)
		}
		for name, nt := range next.types {
			if err := sameToIndex(nt.toEntryIndex(), buildToIndex(nt.to)); err != nil {
				t.Fatalf("round %d: changes %s: %s's index (carried: %v): %v", round, describe(ch), name, carried[name], err)
			}
		}
		prev = next
	}
	if spliced < 100 || full < 10 || seeded < 100 || summaries < 20 || sharedQuick < 20 {
		t.Fatalf("%d rounds spliced and %d built in full, %d type indexes, %d summaries and %d selector arrays carried: every path must be exercised",
			spliced, full, seeded, summaries, sharedQuick)
	}
}

func maps_Clone(m map[resource.Key]*resource.Resource) map[resource.Key]*resource.Resource {
	out := make(map[resource.Key]*resource.Resource, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func describe(ch *Changes) string {
	var b strings.Builder
	for _, r := range ch.Deleted {
		fmt.Fprintf(&b, " -%s/%s", r.Type, r.Name)
	}
	for _, r := range ch.Put {
		fmt.Fprintf(&b, " +%s/%s", r.Type, r.Name)
	}
	return b.String()
}

// sameToIndex compares a toIndex with the reference, buildToIndex of the
// same entries.
func sameToIndex(got, want *toIndex) error {
	if !slices.Equal(got.other, want.other) || got.all != want.all {
		return fmt.Errorf("other entries %d (%d for every outbound), want %d (%d)", len(got.other), got.all, len(want.other), want.all)
	}
	if len(got.byService) != len(want.byService) {
		return fmt.Errorf("services %v, want %v", slices.Sorted(maps.Keys(got.byService)), slices.Sorted(maps.Keys(want.byService)))
	}
	for svc, w := range want.byService {
		g := got.byService[svc]
		if g == nil || !slices.Equal(g.list, w.list) || g.plain != w.plain {
			return fmt.Errorf("service %s differs", svc)
		}
	}
	return nil
}

// sameEveryPolicyView compares an index's everyPolicyView (made or
// carried) with the type's entries: those for every outbound that are not
// a route's, in order, and their entriesKey.
func sameEveryPolicyView(got *everyPolicyView, to []*entry, defs *defTable) error {
	var want []*entry
	rest := false
	for _, e := range to {
		switch {
		case indexedOne(e):
		case e.target.all && e.pol.top.Kind != resource.KindMeshHTTPRoute:
			want = append(want, e)
		default:
			rest = true
		}
	}
	if !slices.Equal(got.common, want) || got.key != defs.entriesKey(want, nil) || got.rest != rest {
		return fmt.Errorf("every-policy view: %d entries (rest %v), want %d (rest %v), keys equal %v",
			len(got.common), got.rest, len(want), rest, got.key == defs.entriesKey(want, nil))
	}
	return nil
}

// randomTimeout is MeshTimeout t-<i> in a random version (timeoutVersion),
// in a namespace that collides with other versions'.
func randomTimeout(rng *rand.Rand, i int) *resource.Resource {
	v := rng.IntN(1000)
	return timeoutVersion(fmt.Sprintf("t-%02d", i), []string{"", "a", "b"}[v%3], v)
}

// timeoutVersion is version v of MeshTimeout ns/name: top kinds and
// origins collide often, a third have override blocks, one in fifteen
// cannot be read.
func timeoutVersion(name, ns string, v int) *resource.Resource {
	tops := []string{`{"kind":"Mesh"}`, `{"kind":"MeshService","name":"backend"}`, `{"kind":"MeshSubset","tags":{"version":"v1"}}`}
	spec := fmt.Sprintf(`{"targetRef":%s,"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}},`+
		`{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"idleTimeout":"%ds"}},`+
		`{"targetRef":{"kind":"MeshService","name":"svc-%d"},"default":{"connectionTimeout":"%ds"}}],`+
		`"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}}]}`, tops[v%len(tops)], v%7+1, v%5+1, v%2, v%11+1, v%3+1)
	switch {
	case v%3 == 0:
		spec = fmt.Sprintf(`{"targetRef":%s,"to":[{"targetRef":{"kind":"Mesh"},"override":{"idleTimeout":"%ds"}}],`+
			`"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"},"override":{"connectionTimeout":"1s"}}]}`, tops[v%len(tops)], v%7+1, v%3+1)
	case v%15 == 1:
		spec = `{"targetRef":{"kind":"Mesh"},"to":"not a list"}`
	}
	r := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name, Namespace: ns, Spec: json.RawMessage(spec)}
	switch v % 4 {
	case 0:
		r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal})
	case 1:
		r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginZone, resource.LabelZone: "zone-2"})
	}
	return r
}

// randomTrace is one of a few MeshTraces: proxy-wide defaults and
// overrides.
func randomTrace(rng *rand.Rand) *resource.Resource {
	v := rng.IntN(100)
	block := "default"
	if v%2 == 0 {
		block = "override"
	}
	r := res("MeshTrace", fmt.Sprintf("trace-%d", v%4), fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},%q:{"sampling":{"overall":%d}}}`, block, v))
	if v%3 == 0 {
		r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal})
	}
	return r
}

// numbersOf lists every type's policies, entries and override blocks with
// their numbers, in the snapshot's order.
func numbersOf(s *MeshSnapshot) string {
	var b strings.Builder
	for _, name := range s.typeNames {
		t := s.types[name]
		fmt.Fprintf(&b, "%s warnings=%q skipped=%v\n", name, t.warnings, len(t.skipped))
		for i, p := range t.policies {
			fmt.Fprintf(&b, "%d %s/%s idx=%d quick=%d", i, p.resNS, p.resName, p.idx, t.quick[i].kind)
			if p.proxy != nil {
				fmt.Fprintf(&b, " proxy=%d", p.proxy.order)
			}
			if p.proxyOver != nil {
				fmt.Fprintf(&b, " proxyOver=%d", p.proxyOver.order)
			}
			b.WriteByte('\n')
		}
		for _, list := range [][]*entry{t.to, t.from, t.overTo, t.overFrom} {
			for i, e := range list {
				fmt.Fprintf(&b, "%d %s/%s[%d] pos=%d order=%d", i, e.pol.resNS, e.pol.resName, e.index, e.pos, e.c.order)
				if e.o != nil {
					fmt.Fprintf(&b, " override=%d", e.o.order)
				}
				b.WriteByte('\n')
			}
		}
		for i, p := range t.overProxy {
			fmt.Fprintf(&b, "%d proxy override %s\n", i, p.resName)
		}
	}
	return b.String()
}

// TestChangesErrors: changes that do not fit the previous snapshot are
// refused, naming the resource; a previous snapshot used for one build
// cannot be used for another from changes.
func TestChangesErrors(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	a := res("MeshTimeout", "a", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}`)
	dp := benchDataplane("dp", 1, 0)
	base := func() *MeshSnapshot {
		s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: []*resource.Resource{a, dp}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		ch   Changes
		want string
	}{
		{"deleted twice", Changes{Deleted: []resource.Key{a.Key(), a.Key()}}, "deleted twice"},
		{"put twice", Changes{Put: []*resource.Resource{res("MeshTimeout", "b", `{}`), res("MeshTimeout", "b", `{}`)}}, "duplicate resource"},
		{"nil", Changes{Put: []*resource.Resource{nil}}, "put[0] is nil"},
		{"other mesh", Changes{Put: []*resource.Resource{{Type: "MeshTimeout", Mesh: "other", Name: "x"}}}, `belongs to mesh "other"`},
		{"deleted from another mesh", Changes{Deleted: []resource.Key{{Type: "MeshTimeout", Mesh: "other", Name: "a"}}}, `deleted[0]: MeshTimeout`},
		{"unknown type", Changes{Put: []*resource.Resource{{Type: "Nope", Mesh: "default", Name: "x"}}}, `unknown resource type "Nope"`},
		{"deleted of an unknown type", Changes{Deleted: []resource.Key{{Type: "Nope", Mesh: "default", Name: "x"}}}, `unknown resource type "Nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Changes: &tc.ch, Previous: base()})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	// The previous snapshot keeps parses, not resources: changes against
	// one built for another zone (or registry, system namespace, mesh)
	// cannot be applied.
	if _, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-2", Changes: &Changes{}, Previous: base()}); err == nil ||
		!strings.Contains(err.Error(), "pass the resources instead") {
		t.Fatalf("changes against another zone's snapshot: %v", err)
	}
	prev := base()
	if _, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: []*resource.Resource{a, dp}, Previous: prev}); err != nil {
		t.Fatal(err)
	}
	_, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Changes: &Changes{}, Previous: prev})
	if !errors.Is(err, ErrPreviousTaken) {
		t.Fatalf("a second build from one previous snapshot: %v, want ErrPreviousTaken", err)
	}
}

// TestReplacedSnapshotsAreCollected: a snapshot whose policies later
// snapshots share is not kept alive by them (its memos and statuses are
// garbage once it is replaced), whether the next is built from the full
// list or from changes.
func TestReplacedSnapshotsAreCollected(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	rs := append(timeouts(50), benchDataplane("dp", 2, 0))
	first, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Rules("dp", ""); err != nil {
		t.Fatal(err)
	}
	first.ComputeStatuses()
	collected := make(chan struct{})
	runtime.AddCleanup(first, func(ch chan struct{}) { close(ch) }, collected)
	second, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: rs, Previous: first})
	if err != nil {
		t.Fatal(err)
	}
	changed := res("MeshTimeout", rs[0].Name, `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"9s"}}]}`)
	third, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Previous: second,
		Changes: &Changes{Put: []*resource.Resource{changed}, Deleted: []resource.Key{rs[0].Key()}}})
	if err != nil {
		t.Fatal(err)
	}
	first, second = nil, nil
	awaitCollected(t, collected, third, "the first snapshot is still reachable from the ones built after it")
}

// TestEqualStatusesAreShared: policies with the same status share one
// PolicyStatus (statusInterner), and only those.
func TestEqualStatusesAreShared(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1",
		Resources: append(timeouts(200), benchDataplane("dp", 2, 0))})
	if err != nil {
		t.Fatal(err)
	}
	distinct := map[*PolicyStatus]bool{}
	contents := map[string]bool{}
	for _, st := range s.statuses().byName["MeshTimeout"] {
		distinct[st] = true
		b, _ := json.Marshal(st)
		contents[string(b)] = true
	}
	if len(distinct) != len(contents) || len(distinct) >= 200 {
		t.Fatalf("%d status objects for %d distinct contents among 200 policies", len(distinct), len(contents))
	}
}

// TestChangesOfIgnoredTypes: changes to a type the engine ignores (a
// MeshIdentity) build like any other, and the snapshot answers as before.
func TestChangesOfIgnoredTypes(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	id := res("MeshIdentity", "id", `{}`)
	rs := append(timeouts(5), benchDataplane("dp", 1, 0), id)
	prev, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	want := answers(t, &goldenCase{}, prev)
	next, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Previous: prev,
		Changes: &Changes{Deleted: []resource.Key{id.Key()}}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Previous: next,
		Changes: &Changes{Put: []*resource.Resource{res("MeshIdentity", "id", `{}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := answers(t, &goldenCase{}, again); got != want {
		t.Fatalf("after changes to a MeshIdentity:\n%s", firstDiff(want, got))
	}
}

// TestReplacedClonesAreCollected: a clone no later snapshot holds is
// collected although clones made beside it are still held. Clones once
// came from chunks shared by a build's policies, and a chunk lived as long
// as any of its values: a zone whose policies changed one by one kept
// every build's chunks (the heap of 100,000 policies grew from 166 to 552
// MiB over 500 changes).
func TestReplacedClonesAreCollected(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	rs := append(timeouts(50), benchDataplane("dp", 2, 0))
	first, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	// timeout-00048 sorts first (names apply in reverse order) and loses
	// its from entry: the from entries of the policies after it move up,
	// so those are cloned.
	noFrom := res("MeshTimeout", rs[48].Name, `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"9s"}}]}`)
	second, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Previous: first,
		Changes: &Changes{Put: []*resource.Resource{noFrom}, Deleted: []resource.Key{rs[48].Key()}}})
	if err != nil {
		t.Fatal(err)
	}
	victim := rs[10]
	of := func(s *MeshSnapshot) *policy {
		for _, p := range s.types["MeshTimeout"].policies {
			if p.resName == victim.Name {
				return p
			}
		}
		return nil
	}
	clone := of(second)
	if clone == nil || clone == of(first) {
		t.Fatal("the second build did not clone the policy")
	}
	collected := make(chan struct{})
	runtime.AddCleanup(&clone.to[0].pos, func(ch chan struct{}) { close(ch) }, collected)
	// Replacing the victim moves nothing: the third build shares every
	// other clone of the second and drops the victim's.
	changed := res("MeshTimeout", victim.Name, string(victim.Spec))
	third, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Previous: second,
		Changes: &Changes{Put: []*resource.Resource{changed}}})
	if err != nil {
		t.Fatal(err)
	}
	first, second, clone = nil, nil, nil
	awaitCollected(t, collected, third, "a replaced clone is still reachable through the clones made beside it")
}

// awaitCollected collects until collected is closed, then checks that
// held, still in use, answers; it fails with msg after 20 collections.
func awaitCollected(t *testing.T, collected <-chan struct{}, held *MeshSnapshot, msg string) {
	t.Helper()
	for range 20 {
		runtime.GC()
		select {
		case <-collected:
			if _, err := held.Rules("dp", ""); err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal(msg)
}

// TestOutboundResultsCarry: a snapshot built from changes reuses the
// outbound results its predecessor computed where the change does not
// reach (the same ResultID, the same answer as a fresh build), computes
// the reached outbound again, and never carries a result that evaluated
// a `when` expression (it spent its snapshot's budget).
func TestOutboundResultsCarry(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	timeout := func(name, svc, d, when string) *resource.Resource {
		w := ""
		if when != "" {
			w = fmt.Sprintf(`,"when":{"default":%q}`, when)
		}
		return res("MeshTimeout", name, fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":%q},"default":{"idleTimeout":%q}%s}]}`, svc, d, w))
	}
	build := func(prev *MeshSnapshot, rs []*resource.Resource, ch *Changes) *MeshSnapshot {
		t.Helper()
		s, err := NewMeshSnapshot(Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: "kuma-system", Resources: rs, Previous: prev, Changes: ch})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ids := func(s *MeshSnapshot) []uint64 {
		t.Helper()
		cfg, err := s.Config("dp", "")
		if err != nil {
			t.Fatal(err)
		}
		out := make([]uint64, len(cfg.Outbounds))
		for i, o := range cfg.Outbounds {
			if p := o.Policies["MeshTimeout"]; p != nil {
				out[i] = p.ResultID()
			}
		}
		return out
	}
	rs := []*resource.Resource{benchDataplane("dp", 3, 0), timeout("a", "svc-0", "1s", ""), timeout("b", "svc-1", "2s", ""),
		timeout("c", "svc-2", "3s", `true`)}
	first := build(nil, rs, nil)
	before := ids(first)
	changed := timeout("b", "svc-1", "5s", "")
	next := build(first, nil, &Changes{Put: []*resource.Resource{changed}})
	after := ids(next)
	switch {
	case before[0] == 0 || after[0] != before[0]:
		t.Errorf("svc-0's result was not carried: %d then %d", before[0], after[0])
	case after[1] == before[1]:
		t.Error("svc-1's result was carried across a change that reaches it")
	case before[2] == 0 || after[2] == before[2]:
		t.Errorf("a result with a `when` expression was carried (or none computed): %d then %d", before[2], after[2])
	}
	fresh := build(nil, []*resource.Resource{benchDataplane("dp", 3, 0), timeout("a", "svc-0", "1s", ""), changed,
		timeout("c", "svc-2", "3s", `true`)}, nil)
	want, _ := fresh.Config("dp", "")
	got, _ := next.Config("dp", "")
	if a, b := mustJSON(t, want), mustJSON(t, got); a != b {
		t.Errorf("carried results differ from a fresh build:\n%s", firstDiff(a, b))
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestToIndexCarried: a type's entry index made from the previous
// snapshot's (toSeed) equals the index made from the type's entries
// (buildToIndex), over random rounds of MeshTimeouts put and deleted: on
// a few services, some naming a port or a zone (not plain), in three
// namespaces and two origins so that sort positions move, and Dataplanes
// joining (their changes splice too). Each round queries the snapshot, so
// the next one has an index to start from.
func TestToIndexCarried(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	rng := rand.New(rand.NewPCG(5, 8))
	timeout := func() *resource.Resource {
		v := rng.IntN(1000)
		var to []string
		for range 1 + rng.IntN(3) {
			switch k := rng.IntN(10); {
			case k == 0:
				to = append(to, `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}`)
			case k == 1:
				to = append(to, fmt.Sprintf(`{"targetRef":{"kind":"MeshService","name":"svc-%d","sectionName":"%d"},"default":{"idleTimeout":"2s"}}`, rng.IntN(4), 10000+rng.IntN(2)))
			case k == 2:
				to = append(to, fmt.Sprintf(`{"targetRef":{"kind":"MeshService","name":"svc-%d","labels":{"kuma.io/zone":"zone-2"}},"default":{"idleTimeout":"3s"}}`, rng.IntN(4)))
			default:
				to = append(to, fmt.Sprintf(`{"targetRef":{"kind":"MeshService","name":"svc-%d"},"default":{"idleTimeout":"%ds"}}`, rng.IntN(4), v%9+1))
			}
		}
		r := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("t-%02d", rng.IntN(60)), Namespace: []string{"", "a", "b"}[v%3],
			Spec: json.RawMessage(fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"to":[%s]}`, strings.Join(to, ",")))}
		if v%2 == 0 {
			r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal})
		}
		return r
	}
	var rs []*resource.Resource
	for range 40 {
		rs = append(rs, timeout())
	}
	rs = append(rs, benchDataplane("dp", 4, 0))
	live := map[resource.Key]*resource.Resource{}
	for _, r := range rs {
		live[r.Key()] = r
	}
	s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: slices.Collect(maps.Values(live))})
	if err != nil {
		t.Fatal(err)
	}
	carried, touchedSome := 0, 0
	for round := range 400 {
		if _, err := s.Config("dp", ""); err != nil {
			t.Fatal(err)
		}
		put, gone := map[resource.Key]*resource.Resource{}, map[resource.Key]bool{}
		for range 1 + rng.IntN(3) {
			switch n := rng.IntN(10); {
			case n == 0:
				dp := benchDataplane(fmt.Sprintf("dp-%d", rng.IntN(3)), 1+rng.IntN(4), rng.IntN(3))
				live[dp.Key()], put[dp.Key()] = dp, dp
			case n < 3:
				for k := range live {
					if k.Type == "MeshTimeout" {
						delete(live, k)
						delete(put, k)
						gone[k] = true
						break
					}
				}
			default:
				r := timeout()
				live[r.Key()], put[r.Key()] = r, r
				delete(gone, r.Key())
			}
		}
		ch := &Changes{Put: slices.Collect(maps.Values(put)), Deleted: slices.Collect(maps.Keys(gone))}
		next, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Previous: s, Changes: ch})
		if err != nil {
			t.Fatal(err)
		}
		nt := next.types["MeshTimeout"]
		if nt == nil {
			s = next
			continue
		}
		if sd := nt.toSeed; sd != nil {
			carried++
			for _, e := range sd.added {
				if indexedOne(e) {
					touchedSome++
					break
				}
			}
		}
		if err := sameToIndex(nt.toEntryIndex(), buildToIndex(nt.to)); err != nil {
			t.Fatalf("round %d: changes %s: %v", round, describe(ch), err)
		}
		s = next
	}
	if carried < 300 || touchedSome < 200 {
		t.Fatalf("%d indexes carried, %d with service entries added: the carry must be exercised", carried, touchedSome)
	}
}

// TestEveryPolicyViewCarried holds the Mesh-wide entries a view matching
// every policy takes from its type's index (made once per index, carried
// by an index seeded with the previous one's other entries) to the list
// and key made afresh, and the proxy's configuration to a fresh
// snapshot's, over random changes of policies that all select the proxy.
func TestEveryPolicyViewCarried(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	rng := rand.New(rand.NewPCG(9, 4))
	timeout := func() *resource.Resource {
		var to []string
		mixed := rng.IntN(3) == 0 // else MeshService entries only
		for range 1 + rng.IntN(3) {
			k := rng.IntN(6)
			if !mixed {
				k = 4 + rng.IntN(2)
			}
			switch {
			case k < 3:
				to = append(to, fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}}`, 1+rng.IntN(5)))
			case k == 3:
				to = append(to, `{"targetRef":{"kind":"MeshService","labels":{"app":"x"}},"default":{"idleTimeout":"7s"}}`)
			default:
				to = append(to, fmt.Sprintf(`{"targetRef":{"kind":"MeshService","name":"svc-%d"},"default":{"connectionTimeout":"%ds"}}`, rng.IntN(4), 1+rng.IntN(5)))
			}
		}
		return res("MeshTimeout", fmt.Sprintf("t-%02d", rng.IntN(40)), fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"to":[%s]}`, strings.Join(to, ",")))
	}
	live := map[resource.Key]*resource.Resource{}
	for range 30 {
		r := timeout()
		live[r.Key()] = r
	}
	dp := benchDataplane("dp", 4, 0)
	live[dp.Key()] = dp
	build := func(prev *MeshSnapshot, ch *Changes) *MeshSnapshot {
		in := Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Previous: prev, Changes: ch}
		if prev == nil {
			in.Resources = slices.Collect(maps.Values(live))
		}
		s, err := NewMeshSnapshot(in)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := build(nil, nil)
	checked, carried := 0, 0
	for round := range 300 {
		cfg, err := s.Config("dp", "")
		if err != nil {
			t.Fatal(err)
		}
		st := s.types["MeshTimeout"]
		if ev := st.toEntryIndex().every.Load(); ev != nil {
			checked++
			if err := sameEveryPolicyView(ev, st.to, s.defs); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		fresh, err := build(nil, nil).Config("dp", "")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := configJSON(t, cfg), configJSON(t, fresh); got != want {
			t.Fatalf("round %d: configuration differs from a fresh snapshot's:\n%s", round, firstDiff(want, got))
		}
		ch := &Changes{}
		if rng.IntN(4) == 0 {
			for k := range live {
				if k.Type == "MeshTimeout" {
					delete(live, k)
					ch.Deleted = append(ch.Deleted, k)
					break
				}
			}
		} else {
			r := timeout()
			live[r.Key()] = r
			ch.Put = append(ch.Put, r)
		}
		next := build(s, ch)
		if nt := next.types["MeshTimeout"]; nt != nil && nt.toSeed != nil && nt.toEntryIndex().every.Load() != nil {
			carried++ // from the previous index, before any view asked
		}
		s = next
	}
	if checked < 250 || carried < 20 {
		t.Fatalf("%d every-policy views checked, %d carried: both paths must be exercised", checked, carried)
	}
}

func configJSON(t *testing.T, c *ConfigResult) string {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
