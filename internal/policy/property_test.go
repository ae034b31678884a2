package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// forwardMerge is the reference semantics of docs/policy.md#merging: RFC 7396 JSON merge
// patch applied in order, with lists at append paths concatenated. It is
// written independently of merge.go, which folds backwards.
func forwardMerge(target, patch any, path string, appendPaths map[string]bool) any {
	if obj, ok := patch.(map[string]any); ok {
		out := map[string]any{}
		if t, ok := target.(map[string]any); ok {
			for k, v := range t {
				out[k] = v
			}
		}
		for k, v := range obj {
			if v == nil {
				delete(out, k)
				continue
			}
			p := k
			if path != "" {
				p = path + "." + k
			}
			out[k] = forwardMerge(out[k], v, p, appendPaths)
		}
		return out
	}
	if list, ok := patch.([]any); ok && appendPaths[path] {
		if old, ok := target.([]any); ok {
			return append(slices.Clone(old), list...)
		}
	}
	return patch
}

func forwardFold(confs []any, appendPaths map[string]bool) any {
	var out any
	for _, c := range confs {
		if c != nil {
			out = forwardMerge(out, c, "", appendPaths)
		}
	}
	return out
}

// randomPatch builds small patches that collide on purpose: the same keys
// at several depths, objects against scalars, nulls, lists at an append path.
func randomPatch(r *rand.Rand, depth int) any {
	keys := []string{"a", "b", "list"}
	obj := map[string]any{}
	for _, k := range keys {
		if r.IntN(3) == 0 {
			continue
		}
		switch n := r.IntN(10); {
		case n < 2:
			obj[k] = nil
		case n < 4 && depth < 2:
			obj[k] = randomPatch(r, depth+1)
		case n < 6:
			obj[k] = []any{fmt.Sprintf("x%d", r.IntN(3))}
		case n < 7:
			obj[k] = []any{}
		default:
			obj[k] = fmt.Sprintf("v%d", r.IntN(4))
		}
	}
	return obj
}

// TestFoldEqualsForwardMergePatch: the backward fill fold gives exactly the
// forward merge-patch result, including type clashes, deletions and append
// lists, and every contribution it drops changes nothing. With shapes
// (shape.go) the fold skips blocks it knows fill nothing; it must record
// exactly the contributions the fold without them records.
func TestFoldEqualsForwardMergePatch(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	appendPaths := map[string]bool{"list": true, "a.list": true}
	m := newMerger([]string{"list", "a.list"})
	shapes := newShapeTable()
	skipped := 0
	for i := 0; i < 20000; i++ {
		n := 1 + r.IntN(8)
		confs := make([]any, n)
		cs := make([]*contribution, n)
		shaped := make([]*contribution, n)
		confOf := map[*contribution]any{} // the fold keeps patches, not the confs
		for j := range confs {
			confs[j] = randomPatch(r, 0)
			cs[j] = newContribution(nil, nil, -1, "", "default", compileConf(confs[j]))
			confOf[cs[j]] = confs[j]
			c := *cs[j]
			c.plain = shapes.id(c.patch)
			shaped[j] = &c
		}
		want := forwardFold(confs, appendPaths)
		st := m.fold(cs)
		got := st.value()
		if !reflect.DeepEqual(normalizeJSON(got), normalizeJSON(want)) {
			t.Fatalf("case %d: confs %s\n fold    %s\n forward %s", i, compact(confs), compact(got), compact(want))
		}
		// Dropping a contribution the fold did not record must not matter.
		var kept []any
		var recorded []*contributionDef
		for c := st.contrib; c != nil; c = c.next {
			kept = append(kept, confOf[c.c])
			recorded = append(recorded, c.c.contributionDef)
		}
		if again := forwardFold(kept, appendPaths); !reflect.DeepEqual(normalizeJSON(again), normalizeJSON(want)) {
			t.Fatalf("case %d: confs %s: origins %s give %s, want %s", i, compact(confs), compact(kept), compact(again), compact(want))
		}
		sst := m.fold(shaped)
		var shapedRecorded []*contributionDef
		for c := sst.contrib; c != nil; c = c.next {
			shapedRecorded = append(shapedRecorded, c.c.contributionDef)
		}
		if !slices.Equal(recorded, shapedRecorded) || !reflect.DeepEqual(sst.value(), got) {
			t.Fatalf("case %d: confs %s: with shapes the fold gives %s from %d blocks, without %s from %d",
				i, compact(confs), compact(sst.value()), len(shapedRecorded), compact(got), len(recorded))
		}
		if sst.idleShape != 0 {
			skipped++
		}
	}
	if skipped == 0 {
		t.Fatal("no fold ever found a block that filled nothing: the shape path is untested")
	}
}

// normalizeJSON brings a value (or raw JSON) to what json.Unmarshal gives,
// so that values compare with reflect.DeepEqual.
func normalizeJSON(v any) any {
	raw, ok := v.(json.RawMessage)
	if !ok {
		raw = json.RawMessage(compact(v))
	}
	var out any
	_ = json.Unmarshal(raw, &out)
	return out
}

// --- MeshTrafficPermission and multi-field from-arrays vs brute force ---

var (
	propKeys   = []string{resource.ServiceTag, "env", "zone"}
	propValues = []string{"a", "b", "c"}
	propKinds  = []string{resource.KindMesh, resource.KindMeshSubset, resource.KindMeshService, resource.KindMeshServiceSubset}
	propAction = []string{"ALLOW", "DENY", "ALLOW_WITH_SHADOW_DENY", "DENY_WITH_SHADOW_ALLOW", "Allow", "Deny", "AllowWithShadowDeny", "DenyWithShadowAllow"}
)

// propEntry is a generated from-entry with what the test needs to judge it
// independently of the engine.
type propEntry struct {
	policy     string
	policyKind string
	index      int
	ref        map[string]any
	tags       map[string]string
	never      bool
	conf       any
}

func randomTags(r *rand.Rand, max int) map[string]any {
	tags := map[string]any{}
	for n := 1 + r.IntN(max); len(tags) < n; {
		tags[propKeys[r.IntN(len(propKeys))]] = propValues[r.IntN(len(propValues))]
	}
	return tags
}

func randomFromEntry(r *rand.Rand, conf func() any) (ref map[string]any, tags map[string]string, never bool, c any) {
	kind := propKinds[r.IntN(len(propKinds))]
	ref = map[string]any{"kind": kind}
	tags = map[string]string{}
	switch kind {
	case resource.KindMeshSubset:
		ref["tags"] = randomTags(r, 2)
	case resource.KindMeshService:
		ref["name"] = propValues[r.IntN(len(propValues))]
	case resource.KindMeshServiceSubset:
		ref["name"] = propValues[r.IntN(len(propValues))]
		ref["tags"] = randomTags(r, 2)
	}
	if m, ok := ref["tags"].(map[string]any); ok {
		for k, v := range m {
			tags[k] = v.(string)
		}
	}
	if name, ok := ref["name"].(string); ok {
		if old, ok := tags[resource.ServiceTag]; ok && old != name {
			never = true
		}
		tags[resource.ServiceTag] = name
	}
	return ref, tags, never, conf()
}

// propCase builds 1-3 policies on the "backend" proxy with random from
// arrays; entries come back in the order docs/policy.md#ordering prescribes, computed
// here without the engine: top-level kind, name (smaller later), entry
// kind, index.
func propCase(r *rand.Rand, typ string, conf func() any) ([]*resource.Resource, []propEntry) {
	var rs []*resource.Resource
	var entries []propEntry
	for p := 0; p < 1+r.IntN(3); p++ {
		name := fmt.Sprintf("p%d", r.IntN(5)+p*10)
		topKind := resource.KindMesh
		top := map[string]any{"kind": topKind}
		if r.IntN(2) == 0 {
			topKind = resource.KindMeshService
			top = map[string]any{"kind": topKind, "name": "backend"}
		}
		var from []any
		for i := 0; i < r.IntN(7); i++ {
			ref, tags, never, c := randomFromEntry(r, conf)
			item := map[string]any{"targetRef": ref, "default": c}
			if ref["kind"] == resource.KindMesh && r.IntN(2) == 0 {
				delete(item, "targetRef") // missing from[].targetRef means Mesh
			}
			from = append(from, item)
			entries = append(entries, propEntry{policy: name, policyKind: topKind, index: i, ref: ref, tags: tags, never: never, conf: normalizeConf(typ, normalizeJSON(c))})
		}
		spec, _ := json.Marshal(map[string]any{"targetRef": top, "from": from})
		rs = append(rs, &resource.Resource{Type: typ, Mesh: "default", Name: name, Spec: spec})
	}
	slices.SortStableFunc(entries, func(a, b propEntry) int {
		return cmp.Or(
			cmp.Compare(kindRank(a.policyKind), kindRank(b.policyKind)),
			cmp.Compare(kindRank(a.ref["kind"].(string)), kindRank(b.ref["kind"].(string))),
			cmp.Compare(b.policy, a.policy),
			cmp.Compare(a.index, b.index))
	})
	return rs, entries
}

func randomClient(r *rand.Rand) map[string]string {
	client := map[string]string{}
	for _, k := range propKeys {
		if r.IntN(5) < 3 {
			client[k] = append(propValues, "z")[r.IntN(len(propValues)+1)]
		}
	}
	return client
}

func bruteForce(entries []propEntry, client map[string]string, appendPaths map[string]bool) any {
	var confs []any
	for _, e := range entries {
		if e.never {
			continue
		}
		ok := true
		for k, v := range e.tags {
			if client[k] != v {
				ok = false
			}
		}
		if ok {
			confs = append(confs, e.conf)
		}
	}
	return forwardFold(confs, appendPaths)
}

// bruteOrigins lists, in apply order, the entries that select the client:
// the origin docs/policy.md#merging gives its conf.
func bruteOrigins(entries []propEntry, client map[string]string) []string {
	out := []string{}
	for _, e := range entries {
		if e.never {
			continue
		}
		ok := true
		for k, v := range e.tags {
			if client[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, fmt.Sprintf("%s[%d]", e.policy, e.index))
		}
	}
	return out
}

func originNames(os []Origin) []string {
	out := []string{}
	for _, o := range os {
		out = append(out, fmt.Sprintf("%s[%d]", o.Name, *o.Entry))
	}
	return out
}

// isSubsequence reports whether every item of sub appears in list, in order.
func isSubsequence(sub, list []string) bool {
	i := 0
	for _, v := range list {
		if i < len(sub) && sub[i] == v {
			i++
		}
	}
	return i == len(sub)
}

func ruleMatches(rule Rule, client map[string]string) bool {
	for _, m := range rule.Matchers {
		v, ok := client[m.Key]
		if m.Not == (ok && v == m.Value) {
			return false
		}
	}
	return true
}

func dpWithBackend() *resource.Resource {
	spec := `{"networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"backend"}}]}}`
	return &resource.Resource{Type: "Dataplane", Mesh: "default", Name: "backend-1", Spec: json.RawMessage(spec)}
}

// checkPropCase verifies, for many clients, that exactly the rule the
// client falls into carries the brute-force merge, that EvaluateInbound
// agrees, and (for MeshTrafficPermission) that the RBAC filters allow the
// client exactly when its action says so.
func checkPropCase(t *testing.T, reg *resource.Registry, r *rand.Rand, typ string, conf func() any, clients int) {
	t.Helper()
	rs, entries := propCase(r, typ, conf)
	snap, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "z1",
		Resources: append(rs, dpWithBackend())})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := snap.Config("backend-1", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) > 0 {
		t.Fatalf("warnings: %v", cfg.Warnings)
	}
	in := cfg.Inbounds[0]
	rules := in.Policies[typ].Rules
	ruleConfs := make([]any, len(rules))
	for i, rule := range rules {
		ruleConfs[i] = normalizeJSON(rule.Conf)
	}
	for c := 0; c < clients; c++ {
		client := randomClient(r)
		want := normalizeJSON(bruteForce(entries, client, nil))
		wantOrigins := bruteOrigins(entries, client)
		var got any
		var gotRule *Rule
		n := 0
		for i, rule := range rules {
			if ruleMatches(rule, client) {
				n++
				got = ruleConfs[i]
				gotRule = &rules[i]
			}
		}
		fail := func(format string, args ...any) {
			t.Helper()
			specs := []string{}
			for _, res := range rs {
				specs = append(specs, res.Name+": "+string(res.Spec))
			}
			t.Fatalf("client %v, policies %v:\nrules %s\n%s", client, specs, compact(rules), fmt.Sprintf(format, args...))
		}
		if n > 1 {
			fail("%d rules match", n)
		}
		if !reflect.DeepEqual(got, want) {
			fail("rule conf %s, brute force %s", compact(got), compact(want))
		}
		// A rule's origin is the union of its clients' origins, in apply
		// order: it holds this client's.
		if gotRule != nil && !isSubsequence(wantOrigins, originNames(gotRule.Origin)) {
			fail("rule origin %v does not hold the client's %v", originNames(gotRule.Origin), wantOrigins)
		}
		ev, err := snap.EvaluateInbound("backend-1", "", 8080, client)
		if err != nil {
			t.Fatal(err)
		}
		evConf := any(nil)
		if ap, ok := ev.Policies[typ]; ok {
			evConf = normalizeJSON(ap.Conf)
			if got := originNames(ap.Origin); !slices.Equal(got, wantOrigins) {
				fail("evaluate origin %v, brute force %v", got, wantOrigins)
			}
		}
		if !reflect.DeepEqual(evConf, want) {
			fail("evaluate conf %s, brute force %s", compact(evConf), compact(want))
		}
		if typ == mtpType {
			checkRBAC(t, in.RBAC, client, want, fail)
		}
	}
}

func checkRBAC(t *testing.T, f RBACFilter, client map[string]string, want any, fail func(string, ...any)) {
	t.Helper()
	action := ""
	if m, ok := want.(map[string]any); ok {
		action, _ = m["action"].(string)
	}
	ids := map[string]bool{}
	for k, v := range client {
		ids[IdentityOf("default", k, v)] = true
	}
	allowed := rbacAllows(f.Rules, rbacPolicy, ids)
	shadow := rbacAllows(f.ShadowRules, rbacShadowPolicy, ids)
	wantAllowed := action == "ALLOW" || action == "ALLOW_WITH_SHADOW_DENY"
	wantShadow := action == "ALLOW" || action == "DENY_WITH_SHADOW_ALLOW"
	if allowed != wantAllowed || shadow != wantShadow {
		fail("action %q: rbac allows %v (want %v), shadow allows %v (want %v)", action, allowed, wantAllowed, shadow, wantShadow)
	}
}

func rbacAllows(cfg *RBAC, name string, ids map[string]bool) bool {
	if cfg.Action != "ALLOW" {
		return false
	}
	for n, p := range cfg.Policies {
		if n != name || len(p.Permissions) != 1 || !p.Permissions[0].Any {
			return false
		}
		for _, pr := range p.Principals {
			if principalMatches(pr, ids) {
				return true
			}
		}
	}
	return false
}

func principalMatches(p Principal, ids map[string]bool) bool {
	switch {
	case p.Any:
		return true
	case p.AndIDs != nil:
		for _, id := range p.AndIDs.IDs {
			if !principalMatches(id, ids) {
				return false
			}
		}
		return true
	case p.NotID != nil:
		return !principalMatches(*p.NotID, ids)
	case p.Authenticated != nil:
		return ids[p.Authenticated.PrincipalName.Exact]
	}
	return false
}

func TestPropertyMeshTrafficPermission(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	conf := func() any { return map[string]any{"action": propAction[r.IntN(len(propAction))]} }
	reg := resource.NewDefaultRegistry()
	for i := 0; i < 2000; i++ {
		checkPropCase(t, reg, r, mtpType, conf, 25)
	}
}

// TestPropertyMultiFieldConfs uses confs whose fields do not shadow each
// other, so cells really combine entries from independent groups.
func TestPropertyMultiFieldConfs(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	conf := func() any {
		c := map[string]any{}
		for _, k := range []string{"connectionTimeout", "idleTimeout"} {
			if r.IntN(2) == 0 {
				c[k] = fmt.Sprintf("%ds", r.IntN(3))
			}
		}
		if r.IntN(3) == 0 {
			c["http"] = map[string]any{"requestTimeout": fmt.Sprintf("%ds", r.IntN(3))}
		}
		if r.IntN(8) == 0 {
			c["idleTimeout"] = nil
		}
		return c
	}
	reg := resource.NewDefaultRegistry()
	for i := 0; i < 1000; i++ {
		checkPropCase(t, reg, r, "MeshTimeout", conf, 25)
	}
}

// TestStatusTraceDecidesAsExplain: over random folds of defaults and
// overrides (nulls, lists, unsets, atomic blocks), the trace statuses use
// (no values, no reasons; plain blocks judged once per shape) gives every
// block the same fate and every field the same winner as the one
// `_explain` renders.
func TestStatusTraceDecidesAsExplain(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(9, 4))
	m := newMerger([]string{"list", "a.list"})
	shapes := newShapeTable()
	plain := 0
	for i := 0; i < 5000; i++ {
		var defaults, overrides []*contribution
		for j := range 1 + r.IntN(6) {
			conf := compileConf(randomPatch(r, 0))
			if r.IntN(3) == 0 {
				conf.atomic = true
			}
			if r.IntN(4) == 0 {
				conf.unset = [][]string{{"a"}, {"b", "list"}}[r.IntN(2):]
			}
			block := blockDefault
			if j%3 == 2 {
				block = blockOverride
			}
			c := newContribution(nil, nil, -1, "", block, conf)
			if c.hasConf && !c.atomic && len(c.unset) == 0 {
				c.plain = shapes.id(c.patch) // as finishContribution does
				plain++
			}
			if block == blockOverride {
				overrides = append(overrides, c)
			} else {
				defaults = append(defaults, c)
			}
		}
		full, status := traceFold(m, defaults, overrides), statusTrace(m, defaults, overrides)
		if len(full.leaves) != 0 {
			t.Fatal("the explain trace took the plain blocks' shortcut")
		}
		for b, bt := range full.blocks {
			st := status.blocks[b]
			if st.fate != bt.fate || st.fieldCount() != len(bt.fields) || len(st.unsets) != len(bt.unsets) {
				t.Fatalf("case %d block %d: fate %d, %d fields; explain: %d, %d", i, b, st.fate, st.fieldCount(), bt.fate, len(bt.fields))
			}
			for f, ff := range bt.fields {
				sf := st.fieldAt(f)
				if sf.path != ff.path || sf.won != ff.won || sf.by != ff.by {
					t.Fatalf("case %d block %d field %s: won %v by %p; explain: won %v by %p (%s)", i, b, ff.path, sf.won, sf.by, ff.won, ff.by, ff.reason)
				}
			}
		}
	}
	if plain == 0 {
		t.Fatal("no plain block: the status trace's shortcut is untested")
	}
}
