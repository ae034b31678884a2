package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/meridian-mesh/meridian/internal/condition"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Random mixes of defaults and overrides (docs/policy.md#defaults-and-overrides) against a brute-force
// reference written here without the engine's code: confs are flat maps of
// leaf paths, the defaults pass walks entries from the most specific down
// filling absent paths (atomic only into an empty conf, unset paths of
// more specific entries removed first), and the overrides pass sorts the
// override blocks itself (authority, specificity reversed, name, index) and
// applies them forward. The confs use a fixed schema (no nulls, no
// object/scalar clashes, which the defaults-only property test covers), so
// "set" and "unset" mean one thing.

var doLeaves = []string{"connectionTimeout", "idleTimeout", "http.requestTimeout", "http.streamIdleTimeout"}

var doWhens = []string{
	"has(self.idleTimeout)",
	"!has(self.connectionTimeout)",
	"duration(self.http.requestTimeout) > duration('1s')", // fails (counted false) without http.requestTimeout
	"true",
}

// doBlock is a generated block: its flat conf and qualifiers.
type doBlock struct {
	flat   map[string]string
	atomic bool
	when   string
}

type doEntry struct {
	policy  string
	global  bool
	topKind string
	kind    string // the entry's own targetRef kind
	index   int
	tags    map[string]string // from entries: the client subset
	def     *doBlock
	over    *doBlock
	unset   []string
}

func randomFlat(r *rand.Rand) map[string]string {
	flat := map[string]string{}
	for _, p := range doLeaves {
		if r.IntN(2) == 0 {
			flat[p] = fmt.Sprintf("%ds", 1+r.IntN(3))
		}
	}
	if len(flat) == 0 {
		flat[doLeaves[r.IntN(len(doLeaves))]] = "9s"
	}
	return flat
}

func randomBlock(r *rand.Rand) *doBlock {
	b := &doBlock{flat: randomFlat(r), atomic: r.IntN(3) == 0}
	if r.IntN(3) == 0 {
		b.when = doWhens[r.IntN(len(doWhens))]
	}
	return b
}

func nested(flat map[string]string) map[string]any {
	out := map[string]any{}
	for p, v := range flat {
		if head, tail, ok := strings.Cut(p, "."); ok {
			sub, _ := out[head].(map[string]any)
			if sub == nil {
				sub = map[string]any{}
				out[head] = sub
			}
			sub[tail] = v
			continue
		}
		out[p] = v
	}
	return out
}

// doJSON writes an entry's blocks as the policy spec carries them.
func (e *doEntry) item(ref map[string]any) map[string]any {
	item := map[string]any{"targetRef": ref}
	strategy, when := map[string]any{}, map[string]any{}
	for name, b := range map[string]*doBlock{"default": e.def, "override": e.over} {
		if b == nil {
			continue
		}
		item[name] = nested(b.flat)
		if b.atomic {
			strategy[name] = "atomic"
		}
		if b.when != "" {
			when[name] = b.when
		}
	}
	if len(strategy) > 0 {
		item["strategy"] = strategy
	}
	if len(when) > 0 {
		item["when"] = when
	}
	if len(e.unset) > 0 {
		item["unset"] = e.unset
	}
	return item
}

// doCase builds 1-4 policies (global or zone, Mesh or MeshService-level)
// whose to-entries target the backend outbound (list "to") or whose
// from-entries select random client subsets (list "from").
func doCase(r *rand.Rand, list string) ([]*resource.Resource, []*doEntry) {
	var rs []*resource.Resource
	var entries []*doEntry
	for p := 0; p < 1+r.IntN(4); p++ {
		name := fmt.Sprintf("p%d", r.IntN(5)+p*10)
		global := r.IntN(2) == 0
		topKind := resource.KindMesh
		top := map[string]any{"kind": topKind}
		if r.IntN(2) == 0 {
			topKind = resource.KindMeshService
			top = map[string]any{"kind": topKind, "name": "backend"}
		}
		var items []any
		for i := 0; i < 1+r.IntN(4); i++ {
			e := &doEntry{policy: name, global: global, topKind: topKind, index: i}
			if r.IntN(4) != 0 {
				e.def = randomBlock(r)
			}
			if r.IntN(3) == 0 {
				e.over = randomBlock(r)
			}
			if r.IntN(4) == 0 {
				e.unset = []string{[]string{"idleTimeout", "http.requestTimeout", "http", "connectionTimeout"}[r.IntN(4)]}
			}
			if e.def == nil && e.over == nil && e.unset == nil {
				e.def = randomBlock(r)
			}
			var ref map[string]any
			if list == "to" {
				e.kind = resource.KindMesh
				ref = map[string]any{"kind": resource.KindMesh}
				if r.IntN(2) == 0 {
					e.kind = resource.KindMeshService
					ref = map[string]any{"kind": e.kind, "name": "backend"}
				}
			} else {
				var never bool
				ref, e.tags, never, _ = randomFromEntry(r, func() any { return nil })
				if never {
					ref, e.tags = map[string]any{"kind": resource.KindMesh}, map[string]string{}
				}
				e.kind = ref["kind"].(string)
			}
			items = append(items, e.item(ref))
			entries = append(entries, e)
		}
		spec, _ := json.Marshal(map[string]any{"targetRef": top, list: items})
		origin := resource.OriginZone
		if global {
			origin = resource.OriginGlobal
		}
		rs = append(rs, &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name, Spec: spec,
			Labels: resource.NewLabels(map[string]string{resource.LabelOrigin: origin})})
	}
	// docs/policy.md#ordering apply order, computed here: top-level kind, origin (global
	// first), entry kind, name (smaller later), index.
	slices.SortStableFunc(entries, func(a, b *doEntry) int {
		return cmp.Or(
			cmp.Compare(kindRank(a.topKind), kindRank(b.topKind)),
			cmp.Compare(boolRank(!a.global), boolRank(!b.global)),
			cmp.Compare(kindRank(a.kind), kindRank(b.kind)),
			cmp.Compare(b.policy, a.policy),
			cmp.Compare(a.index, b.index))
	})
	return rs, entries
}

// reference computes docs/policy.md#defaults-and-overrides for the entries that apply, given in apply
// order.
func reference(t *testing.T, env *condition.Env, es []*doEntry) any {
	t.Helper()
	holds := func(b *doBlock, state map[string]string) bool {
		if b.when == "" {
			return true
		}
		expr, err := env.Compile(b.when)
		if err != nil {
			t.Fatal(err)
		}
		var self any
		if len(state) > 0 {
			self = normalizeJSON(nested(state))
		}
		ok, err := expr.Eval(self, nil)
		return ok && err == nil
	}
	state := map[string]string{}
	var unset []string
	covered := func(p string) bool {
		for _, u := range unset {
			if p == u || strings.HasPrefix(p, u+".") {
				return true
			}
		}
		return false
	}
	for i := len(es) - 1; i >= 0; i-- { // defaults: most specific first
		e := es[i]
		if e.def != nil && holds(e.def, state) && (!e.def.atomic || len(state) == 0) {
			for p, v := range e.def.flat {
				if _, set := state[p]; !set && !covered(p) {
					state[p] = v
				}
			}
		}
		unset = append(unset, e.unset...)
	}
	var overs []*doEntry
	for _, e := range es {
		if e.over != nil {
			overs = append(overs, e)
		}
	}
	authority := func(e *doEntry) int { return boolRank(e.global) } // all are system policies
	slices.SortStableFunc(overs, func(a, b *doEntry) int {
		return cmp.Or(
			cmp.Compare(authority(a), authority(b)),
			cmp.Compare(kindRank(b.topKind), kindRank(a.topKind)),
			cmp.Compare(kindRank(b.kind), kindRank(a.kind)),
			cmp.Compare(b.policy, a.policy),
			cmp.Compare(a.index, b.index))
	})
	for _, e := range overs {
		if !holds(e.over, state) {
			continue
		}
		if e.over.atomic {
			state = map[string]string{}
		}
		for p, v := range e.over.flat {
			state[p] = v
		}
	}
	if len(state) == 0 {
		return nil
	}
	return normalizeJSON(nested(state))
}

func doDataplane() *resource.Resource {
	spec := `{"networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"backend"}}],` +
		`"outbound":[{"port":10001,"tags":{"kuma.io/service":"backend"}}]}}`
	return &resource.Resource{Type: "Dataplane", Mesh: "default", Name: "backend-1", Spec: json.RawMessage(spec)}
}

func doSnapshot(t *testing.T, reg *resource.Registry, rs []*resource.Resource) *MeshSnapshot {
	t.Helper()
	for _, res := range rs {
		if err := reg.Validate(res, plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvKubernetes, SystemNamespace: plane.DefaultSystemNamespace}); err != nil {
			t.Fatalf("generated policy %s is invalid: %v: %s", res.Name, err, res.Spec)
		}
	}
	snap, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "z1", Resources: append(rs, doDataplane())})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func specsOf(rs []*resource.Resource) string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name+" "+r.Labels.Get(resource.LabelOrigin)+": "+string(r.Spec))
	}
	return strings.Join(out, "\n")
}

// checkDOOutbound compares the backend outbound's MeshTimeout with the
// reference, through _evaluate and _explain.
func checkDOOutbound(t *testing.T, reg *resource.Registry, snap *MeshSnapshot, rs []*resource.Resource, entries []*doEntry) {
	t.Helper()
	want := reference(t, reg.Conditions(), entries)
	ev, err := snap.EvaluateOutbound("backend-1", "", "backend")
	if err != nil {
		t.Fatal(err)
	}
	var got any
	if op, ok := ev.Policies["MeshTimeout"]; ok {
		got = normalizeJSON(op.Conf)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("engine %s, reference %s\npolicies:\n%s", compact(got), compact(want), specsOf(rs))
	}
	// _explain renders the same conf, and every field it lists as in
	// effect is in it.
	ex, err := snap.Explain("backend-1", "", "MeshTimeout", ExplainTarget{Outbound: "backend"})
	if err != nil {
		t.Fatal(err)
	}
	if exConf := normalizeJSON(ex.Conf); !reflect.DeepEqual(exConf, want) {
		t.Fatalf("explain conf %s, reference %s\npolicies:\n%s", compact(exConf), compact(want), specsOf(rs))
	}
	for _, f := range ex.Fields {
		if (f.SetBy != nil) != (f.Value != nil) {
			t.Fatalf("field %s: setBy %v with value %s", f.Path, f.SetBy, f.Value)
		}
	}
}

// checkDOClient compares what a client of the backend inbound gets with the
// reference, through the from-rules (exactly one rule matches) and
// _evaluate. rules may be nil to skip the rule check.
func checkDOClient(t *testing.T, reg *resource.Registry, snap *MeshSnapshot, rs []*resource.Resource, entries []*doEntry, rules []Rule, client map[string]string) {
	t.Helper()
	var matching []*doEntry
	for _, e := range entries {
		if subsetOf(e.tags, client) {
			matching = append(matching, e)
		}
	}
	want := reference(t, reg.Conditions(), matching)
	if rules != nil {
		var got any
		n := 0
		for _, rule := range rules {
			if ruleMatches(rule, client) {
				n++
				got = normalizeJSON(rule.Conf)
			}
		}
		if n > 1 || !reflect.DeepEqual(got, want) {
			t.Fatalf("client %v: %d rules match, conf %s, reference %s\nrules %s\npolicies:\n%s",
				client, n, compact(got), compact(want), compact(rules), specsOf(rs))
		}
	}
	ev, err := snap.EvaluateInbound("backend-1", "", 8080, client)
	if err != nil {
		t.Fatal(err)
	}
	var evConf any
	if ap, ok := ev.Policies["MeshTimeout"]; ok {
		evConf = normalizeJSON(ap.Conf)
	}
	if !reflect.DeepEqual(evConf, want) {
		t.Fatalf("client %v: evaluate %s, reference %s\npolicies:\n%s", client, compact(evConf), compact(want), specsOf(rs))
	}
}

func subsetOf(tags, client map[string]string) bool {
	for k, v := range tags {
		if client[k] != v {
			return false
		}
	}
	return true
}

func TestPropertyDefaultsOverridesOutbound(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 8))
	reg := resource.NewDefaultRegistry()
	for i := 0; i < 3000; i++ {
		rs, entries := doCase(r, "to")
		checkDOOutbound(t, reg, doSnapshot(t, reg, rs), rs, entries)
	}
}

func TestPropertyDefaultsOverridesFromRules(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(9, 10))
	reg := resource.NewDefaultRegistry()
	for i := 0; i < 1500; i++ {
		rs, entries := doCase(r, "from")
		snap := doSnapshot(t, reg, rs)
		cfg, err := snap.Config("backend-1", "")
		if err != nil {
			t.Fatal(err)
		}
		rules := cfg.Inbounds[0].Policies["MeshTimeout"].Rules
		if rules == nil {
			rules = []Rule{}
		}
		for c := 0; c < 20; c++ {
			checkDOClient(t, reg, snap, rs, entries, rules, randomClient(r))
		}
	}
}
