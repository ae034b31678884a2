package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Explanation is the `_explain` response (docs/policy.md#provenance-and-explain, 5): the effective conf
// of one policy type on one target, every field path with the block that
// set it, and every block that lost with its reason.
type Explanation struct {
	Dataplane Meta            `json:"dataplane"`
	Type      string          `json:"type"`
	Target    ExplainTarget   `json:"target"`
	Conf      json.RawMessage `json:"conf"` // null when the type gives the target nothing
	Fields    []FieldExplain  `json:"fields"`
	Blocks    []BlockExplain  `json:"blocks"`
	// BlocksTotal, set by Limit when it cut Blocks, counts them all.
	BlocksTotal int      `json:"blocksTotal,omitempty"`
	Warnings    []string `json:"warnings"`
}

// ExplainTarget names what to explain: an outbound (by service), the
// traffic of one route of an outbound (by the route's name or display
// name, optionally namespace/name), an inbound (by port) with a client, or
// the proxy (none of them).
type ExplainTarget struct {
	Outbound string            `json:"outbound,omitempty"`
	Route    string            `json:"route,omitempty"`
	Inbound  int               `json:"inbound,omitempty"`
	Client   map[string]string `json:"client,omitempty"`
	Proxy    bool              `json:"proxy,omitempty"`
}

// BlockRef names one block of one policy entry.
type BlockRef struct {
	Policy Meta   `json:"policy"`
	Entry  *int   `json:"entry,omitempty"`
	Block  string `json:"block"`
}

// FieldExplain is one field path: its effective value and the block that
// set it (both absent when the field is not in the effective conf), the
// blocks whose value for it lost, and the unsets that named it.
type FieldExplain struct {
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value,omitempty"`
	SetBy *BlockRef       `json:"setBy"`
	Lost  []LostValue     `json:"lost"`
	// LostTotal, set by Limit when it cut Lost, counts them all.
	LostTotal int            `json:"lostTotal,omitempty"`
	Unsets    []UnsetExplain `json:"unsets,omitempty"`
}

// LostValue is a value a block had for a field and why it is not in effect.
type LostValue struct {
	By     BlockRef        `json:"by"`
	Value  json.RawMessage `json:"value"`
	Reason string          `json:"reason"`
	Winner *BlockRef       `json:"winner,omitempty"`
}

// UnsetExplain is an unset of the field: applied (less specific defaults
// cannot set it) or ignored because an override sets it.
type UnsetExplain struct {
	By      BlockRef `json:"by"`
	Applied bool     `json:"applied"`
	Reason  string   `json:"reason,omitempty"`
}

// BlockExplain is one block that reached the target, in the order the two
// passes applied them, with its outcome: applied, partially applied, lost,
// when false, when failed, atomic default discarded.
type BlockExplain struct {
	BlockRef
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
	When    string `json:"when,omitempty"`
}

func (c *contribution) ref() BlockRef {
	r := BlockRef{Block: c.block, Entry: c.entryRef()}
	if c.pol != nil {
		r.Policy = c.pol.meta()
	}
	return r
}

// Explain explains one policy type on one target of a Dataplane: the
// outbound to target.Outbound (or the traffic of its route target.Route),
// or the inbound on port target.Inbound for a client with the tags
// target.Client, or (none set) the proxy-wide conf.
//
// The result is memoized for the snapshot (an explanation re-runs the
// folds, `when` expressions included; viewers asking again must not): it
// is shared, and callers must not change it.
func (s *MeshSnapshot) Explain(dpName, dpNamespace, policyType string, target ExplainTarget) (*Explanation, error) {
	key := explainKey(dpName, dpNamespace, policyType, target)
	if v, ok := s.explainMemo.Load(key); ok {
		return v.(*Explanation), nil
	}
	ex, err := s.explain(dpName, dpNamespace, policyType, target)
	if err != nil {
		return nil, err
	}
	if s.explained.Add(1) > maxExplainMemo {
		return ex, nil // callers choose the clients: the memo stays bounded
	}
	v, _ := s.explainMemo.LoadOrStore(key, ex)
	return v.(*Explanation), nil
}

// maxExplainMemo bounds the explanations a snapshot keeps.
const maxExplainMemo = 1024

func explainKey(dpName, dpNamespace, policyType string, target ExplainTarget) string {
	var b strings.Builder
	for _, s := range []string{dpName, dpNamespace, policyType, target.Outbound, target.Route, strconv.Itoa(target.Inbound)} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, k := range slices.Sorted(maps.Keys(target.Client)) {
		b.WriteString(k)
		b.WriteByte(1)
		b.WriteString(target.Client[k])
		b.WriteByte(0)
	}
	return b.String()
}

func (s *MeshSnapshot) explain(dpName, dpNamespace, policyType string, target ExplainTarget) (*Explanation, error) {
	service, route, port, client := target.Outbound, target.Route, target.Inbound, target.Client
	dp, err := s.dataplane(dpName, dpNamespace)
	if err != nil {
		return nil, err
	}
	t := s.types[policyType]
	if t == nil {
		if _, ok := s.reg.Lookup(policyType); !ok {
			return nil, fmt.Errorf("unknown policy type %q: %w", policyType, ErrNotFound)
		}
	}
	ex := &Explanation{Dataplane: dp.meta, Type: policyType, Conf: json.RawMessage("null"), Fields: []FieldExplain{},
		Blocks: []BlockExplain{}, Warnings: []string{}}
	if t != nil && legacyKindOf(t.desc) != notLegacy {
		ex.Warnings = append(ex.Warnings, policyType+" is a legacy source/destination type: one policy applies per "+
			"connection (the most specific, docs/policy.md#legacy-policies), nothing merges; _evaluate shows which")
		return ex, nil
	}
	var tr *trace
	switch {
	case service != "":
		ex.Target.Outbound, ex.Target.Route = service, route
		tr, err = s.traceOutbound(t, dp, service, route)
	case port != 0:
		ex.Target.Inbound, ex.Target.Client = port, maps.Clone(client)
		if ex.Target.Client == nil {
			ex.Target.Client = map[string]string{}
		}
		tr, err = s.traceInbound(t, dp, port, client)
	default:
		ex.Target.Proxy = true
		if t != nil && t.desc.ProxyWide {
			defaults, overrides := proxyBlocks(t, s.matchedPolicies(t, dp))
			tr = traceFold(s.mergerOf(t), defaults, overrides)
		}
	}
	if err != nil {
		return nil, err
	}
	if tr != nil {
		ex.render(tr)
	}
	return ex, nil
}

// traceOutbound traces the outbound to service, or the traffic of its
// route route (docs/policy.md#routes: the Mesh entries and the route's).
func (s *MeshSnapshot) traceOutbound(t *typeIndex, dp *dataplane, service, route string) (*trace, error) {
	idx := dp.byService[service]
	if len(idx) == 0 {
		return nil, fmt.Errorf("Dataplane %q has no outbound to %q: %w", qualified(dp.ns, dp.res.Name), service, ErrNotFound)
	}
	if t == nil || !t.desc.To {
		if route != "" && !s.routeOf(dp, idx[0], route) {
			return nil, fmt.Errorf("no MeshHTTPRoute %q sends the traffic of Dataplane %q to %q: %w", route, qualified(dp.ns, dp.res.Name), service, ErrNotFound)
		}
		return nil, nil
	}
	common, specific, routed := s.outboundEntries(t, dp, s.matchedPolicies(t, dp))
	es := mergeByPos(common, specific[idx[0]])
	if route != "" {
		rs := routed[idx[0]]
		k := slices.IndexFunc(rs.routes, func(r *policy) bool { return r.named(route) })
		switch {
		case k >= 0:
			es = mergeByPos(common, rs.entries[k])
		case !s.routeOf(dp, idx[0], route):
			return nil, fmt.Errorf("no MeshHTTPRoute %q sends the traffic of Dataplane %q to %q: %w", route, qualified(dp.ns, dp.res.Name), service, ErrNotFound)
		default:
			es = common // no entry names the route: its traffic gets the Mesh entries
		}
	}
	return traceFold(s.mergerOf(t), defaultsOf(es), overridesOf(es)), nil
}

// named reports whether a route is called name: its stored name, its
// display name, or namespace/name.
func (p *policy) named(name string) bool {
	if ns, n, ok := strings.Cut(name, "/"); ok {
		return p.resNS == ns && (p.resName == n || p.display == n)
	}
	return p.resName == name || p.display == name
}

// routeOf reports whether the MeshHTTPRoute called name applies to dp and
// sends the traffic of its outbound i.
func (s *MeshSnapshot) routeOf(dp *dataplane, i int, name string) bool {
	routed := make([]routeEntries, len(dp.outbounds))
	for _, r := range s.routes {
		if r.named(name) {
			s.addRouteEntry(routed, r, nil, dp)
		}
	}
	return len(routed[i].routes) > 0
}

func (s *MeshSnapshot) traceInbound(t *typeIndex, dp *dataplane, port int, client map[string]string) (*trace, error) {
	in := dp.inboundByPort(port)
	if in == nil {
		return nil, fmt.Errorf("Dataplane %q has no inbound on port %d: %w", qualified(dp.ns, dp.res.Name), port, ErrNotFound)
	}
	if t == nil || !t.desc.From {
		return nil, nil
	}
	var es []*entry
	for _, e := range s.inboundEntries(t, dp, in) {
		if clientMatches(e, client) {
			es = append(es, e)
		}
	}
	return traceFold(s.mergerOf(t), defaultsOf(es), overridesOf(es)), nil
}

// defaultsOf lists the default blocks of es, in apply order.
func defaultsOf(es []*entry) []*contribution {
	out := make([]*contribution, len(es))
	for i, e := range es {
		out[i] = e.c
	}
	return out
}

func (ex *Explanation) render(tr *trace) {
	ex.Warnings = append(ex.Warnings, tr.final.warnings()...)
	if !tr.final.empty() {
		ex.Conf = tr.final.conf()
	}
	fields := map[string]*FieldExplain{}
	field := func(path string) *FieldExplain {
		if f := fields[path]; f != nil {
			return f
		}
		f := &FieldExplain{Path: path, Lost: []LostValue{}}
		fields[path] = f
		return f
	}
	// Every path of the effective conf, with the block that set it.
	walkFinal(tr.final.root, nil, func(path string, n *node) {
		f := field(path)
		f.Value = canonicalJSON(nodeValue(n))
		ref := n.by.ref()
		if n.kind == nodeList && len(n.listBy) > 0 {
			ref = n.listBy[len(n.listBy)-1].ref()
		}
		f.SetBy = &ref
	})
	for _, bt := range tr.blocks {
		if bt.fate == fateNotReached {
			continue
		}
		ex.Blocks = append(ex.Blocks, bt.explain())
		for _, ff := range bt.fields {
			if ff.won {
				continue
			}
			lv := LostValue{By: bt.c.ref(), Value: canonicalJSON(ff.value), Reason: ff.reason}
			if ff.by != nil {
				w := ff.by.ref()
				lv.Winner = &w
			}
			f := field(ff.path)
			f.Lost = append(f.Lost, lv)
		}
		for _, u := range bt.unsets {
			ue := UnsetExplain{By: bt.c.ref(), Applied: !u.ignored}
			if u.ignored {
				ue.Reason = "unset ignored: " + u.by.name() + " overrides it"
			}
			f := field(u.path)
			f.Unsets = append(f.Unsets, ue)
		}
	}
	for _, k := range sortedKeys(fields) {
		ex.Fields = append(ex.Fields, *fields[k])
	}
}

// walkFinal calls fn for every visible leaf of the effective conf (values,
// lists, empty objects).
func walkFinal(n *node, path []string, fn func(string, *node)) {
	if !visible(n) {
		return
	}
	if n.kind == nodeObject && len(n.kids) > 0 {
		any := false
		for _, k := range sortedKeys(n.kids) {
			if visible(n.kids[k]) {
				any = true
				walkFinal(n.kids[k], append(path, k), fn)
			}
		}
		if any || n.virtual {
			return
		}
	}
	fn(strings.Join(path, "."), n)
}

func (bt *blockTrace) explain() BlockExplain {
	be := BlockExplain{BlockRef: bt.c.ref()}
	if bt.c.when != nil {
		be.When = bt.c.when.Source()
	}
	switch bt.fate {
	case fateWhenFalse:
		be.Outcome, be.Reason = "when false", "when false: "+bt.c.when.Source()
		return be
	case fateWhenFailed:
		be.Outcome, be.Reason = "when failed", fmt.Sprintf("when failed, counted as false: %v", bt.whenErr)
		return be
	case fateAtomicLost:
		be.Outcome, be.Reason = "atomic default discarded", "a more specific default already set the conf"
		return be
	}
	won, lost := bt.won()
	var reasons []string
	for _, l := range lost {
		reasons = append(reasons, l.path+": "+l.reason)
	}
	for _, u := range bt.unsets {
		if u.ignored {
			reasons = append(reasons, "unset "+u.path+" ignored: "+u.by.name()+" overrides it")
		}
	}
	slices.Sort(reasons)
	switch {
	case len(lost) == 0 && len(reasons) == 0:
		be.Outcome = "applied"
	case won > 0 || (len(lost) == 0 && len(bt.unsets) > 0):
		be.Outcome = "partially applied"
	default:
		be.Outcome = "lost"
	}
	be.Reason = strings.Join(reasons, "; ")
	return be
}

// Limit keeps at most n blocks and n losing values per field (the first
// ones, in apply order) and records the totals it cut: with 10,000 policies
// on one target the whole explanation is megabytes, while a reader (the
// console) shows the winners and a count. n <= 0 keeps everything.
//
// It returns a copy: an Explanation is shared by every query of its
// snapshot (Explain memoizes it).
func (e *Explanation) Limit(n int) *Explanation {
	if n <= 0 {
		return e
	}
	out := *e
	if len(out.Blocks) > n {
		out.BlocksTotal, out.Blocks = len(out.Blocks), out.Blocks[:n]
	}
	out.Fields = slices.Clone(out.Fields)
	for i := range out.Fields {
		if f := &out.Fields[i]; len(f.Lost) > n {
			f.LostTotal, f.Lost = len(f.Lost), f.Lost[:n]
		}
	}
	return &out
}
