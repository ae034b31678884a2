package policy

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/meridian-mesh/meridian/internal/condition"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Merging (docs/policy.md#merging).
//
// Every conf block that may apply to a target is a contribution. A target's
// effective conf is one fold over its contributions, listed in apply order
// (docs/policy.md#ordering, ascending: later wins). The result equals folding them forward
// with RFC 7396 JSON merge patch, with the type's append fields
// concatenated instead of replaced.
//
// The fold runs backwards, from the most specific contribution to the least
// specific, and only fills what is still unset. This is docs/policy.md#defaults-and-overrides's defaults
// pass; it is used here because:
//   - a contribution that fills nothing is provably irrelevant to the result,
//     which lets the from-rule builder prune shadowed entries instead of
//     enumerating subsets (see fromrules.go), and lets a fold over 10,000
//     contributions stop doing work once the conf is saturated;
//   - docs/policy.md#defaults-and-overrides later slots in without a rewrite: an atomic default applies
//     only to an empty state, `unset` paths become deleted nodes that lower
//     contributions cannot fill, and the overrides pass is a forward fold
//     applied to the result. Every node records the contribution that set it
//     (node.by), which is the per-field provenance 3.6.3 asks for.

// Blocks a contribution can come from.
const (
	blockDefault  = "default"
	blockOverride = "override"
	blockConf     = "conf" // legacy policies
)

// overrideOrderBase puts every override after every default when
// contributions are sorted by order (origins list overrides after defaults,
// in their own apply order).
const overrideOrderBase = 1 << 40

// contribution is one conf block of one policy entry: the unit the fold
// works on (docs/policy.md#defaults-and-overrides: a default or an override block, with its strategy,
// when and, for defaults, unset). Its definition is shared by every
// snapshot holding the same version of the policy; the policy it belongs to
// and its apply order are this snapshot's.
type contribution struct {
	*contributionDef
	pol *policy
	// order is the apply order among the contributions of one type's to or
	// from entries; overrides count from overrideOrderBase in the order the
	// overrides pass applies them.
	order int
	// plain is the patch's shape (shape.go) when the block is a plain
	// merge (a conf, no when, no unset), else 0. It is a copy of what the
	// definition implies, kept here so that a fold skipping saturated
	// blocks does not read each block's definition.
	plain shapeID
}

// contributionDef is a contribution as parsed; never written once parsing
// of its policy is done.
type contributionDef struct {
	entry int    // index in the policy's to/from array; -1 for proxy-wide and legacy
	list  string // "to" or "from" for entries
	block string // blockDefault, blockOverride or blockConf
	// hasConf says the block carries a conf (patch); a default block may
	// carry only unset. The decoded JSON itself is kept only for legacy
	// blocks (conf), which are returned as they are: the fold works on the
	// patch, and keeping both doubled a policy's memory.
	hasConf bool
	conf    any    // legacy (blockConf) only: decoded JSON, numbers as json.Number
	patch   *patch // conf compiled for folding
	atomic  bool   // strategy atomic (else merge)
	when    *condition.Expr
	unset   [][]string // default blocks: paths removed from less specific defaults
	at      string     // where(), set when parsing is done (finishContribution)
}

// newContribution makes a contribution of pol (nil in tests) to entry of
// list ("to", "from", "rules"; "" for proxy-wide and legacy blocks), with a
// definition from defs (nil: a definition of its own).
func newContribution(pol *policy, defs *defTable, entry int, list, block string, conf confBlock) *contribution {
	return &contribution{pol: pol, contributionDef: defs.contributionDef(entry, list, block, conf)}
}

// newContributionDef compiles conf into a definition.
func newContributionDef(entry int, list, block string, conf confBlock) *contributionDef {
	d := &contributionDef{entry: entry, list: list, block: block, hasConf: conf.value != nil,
		patch: compilePatch(conf.value), atomic: conf.atomic, when: conf.when, unset: conf.unset}
	if block == blockConf {
		d.conf = conf.value
	}
	d.at = d.computeWhere()
	return d
}

// origin is the contribution for output. It is made on demand, not kept:
// a kept Origin (the policy's Meta, the entry) was 150 bytes of every
// contribution, 17 MB of a zone's heap at 100,000 policies, for a struct
// that costs a few copies to assemble. Entry points
// at the definition's own index, which is never written once parsed.
// A contribution of no policy (tests) has the zero Origin.
func (c *contribution) origin() Origin {
	if c.pol == nil {
		return Origin{}
	}
	o := Origin{Meta: c.pol.meta(), Entry: c.entryRef()}
	if c.block == blockOverride {
		o.Block = blockOverride
	}
	if c.list == "rules" {
		o.List = "rules"
	}
	return o
}

// entryRef is Origin.Entry: nil for proxy-wide and legacy blocks, and for
// a contribution of no policy.
func (c *contribution) entryRef() *int {
	if c.pol == nil || c.entry < 0 {
		return nil
	}
	return &c.contributionDef.entry
}

// overrideContribution is nil when the block is absent.
func overrideContribution(pol *policy, defs *defTable, entry int, list string, conf confBlock) *contribution {
	if conf.value == nil {
		return nil
	}
	return newContribution(pol, defs, entry, list, blockOverride, conf)
}

// active reports whether the contribution can change a fold at all.
func (c *contribution) active() bool { return c != nil && (c.hasConf || len(c.unset) > 0) }

// patch is a conf compiled for folding: an object's fields are a sorted
// slice, so the fold never iterates maps (map iteration, with its random
// start, dominated profiles of large folds).
type patch struct {
	isObj  bool
	fields []patchField
	value  any // a non-object value (nil = JSON null)
}

type patchField struct {
	key   string
	patch *patch
}

func compilePatch(v any) *patch {
	obj, ok := v.(map[string]any)
	if !ok {
		return &patch{value: v}
	}
	p := &patch{isObj: true, fields: make([]patchField, 0, len(obj))}
	for _, k := range sortedKeys(obj) {
		p.fields = append(p.fields, patchField{key: k, patch: compilePatch(obj[k])})
	}
	return p
}

// nodeKind says what a fold node holds.
type nodeKind uint8

const (
	nodeObject  nodeKind = iota // an object; lower contributions may add keys unless sealed
	nodeLeaf                    // a scalar or replaced list: final
	nodeDeleted                 // deleted by null: final, absent from the output
	nodeList                    // an append list: lower contributions prepend unless sealed
)

// node is one position of a conf under construction. Nodes are immutable
// once built: fill copies the path it changes, so fold states can be shared
// between branches of the from-rule builder.
type node struct {
	kind   nodeKind
	sealed bool // object/list: a more specific contribution replaced it, lower ones no longer reach it
	// virtual: an object created only to hold unset markers below it; it is
	// absent from the output unless something real is set inside it.
	virtual bool
	// unset: a nodeDeleted that is an unset marker of by (not a JSON null).
	unset bool
	value any // nodeLeaf
	items []any
	// listBy: nodeList, the contributions whose items it holds, in apply
	// order; counts[i] is how many items listBy[i] holds.
	listBy []*contribution
	counts []int
	// key: a keyed append list (merger.keyed): the item field whose equal
	// values merge the items (Kuma's mergeValuesByKey).
	key  string
	kids map[string]*node
	by   *contribution // the contribution that created the node (provenance)
}

// contributors is the persistent list of contributions that changed a fold
// state, in apply order (the fold prepends as it walks backwards).
type contributors struct {
	c    *contribution
	next *contributors
}

// foldState is the result of folding some contributions. The zero value is
// the empty fold (no conf). It is immutable: the fold functions return new
// states that share structure with the old ones.
type foldState struct {
	root    *node
	contrib *contributors // defaults that changed the fold, in apply order
	// over are the overrides applied, the last applied first.
	over *contributors
	// warns are `when` expressions that failed to evaluate (counted as
	// false), newest first.
	warns *warning
	// skipped are the default blocks whose `when` was false or failed:
	// they matched the target but did not apply to it (origins leave them
	// out).
	skipped *contributors
	// idleShape is the shape of a default block that filled nothing into
	// idleRoot; while root is idleRoot, blocks of that shape fill nothing
	// either (shape.go).
	idleRoot  *node
	idleShape shapeID
}

type warning struct {
	text string
	next *warning
}

func (st foldState) warn(c *contribution, err error) foldState {
	text := fmt.Sprintf("%s %s %s: %v; counted as false", c.pol.desc.Name, qualified(c.pol.resNS, c.pol.resName), c.where(), err)
	st.warns = &warning{text: text, next: st.warns}
	return st
}

// warnings lists the fold's warnings, oldest first, without duplicates.
func (st foldState) warnings() []string {
	var out []string
	for w := st.warns; w != nil; w = w.next {
		out = append(out, w.text)
	}
	slices.Reverse(out)
	return slices.Compact(out)
}

// where names the block in messages: "to[1].override", "default".
func (c *contribution) where() string {
	if c.at != "" {
		return c.at
	}
	return c.computeWhere()
}

func (c *contributionDef) computeWhere() string {
	if c.entry < 0 {
		return c.block
	}
	return fmt.Sprintf("%s[%d].%s", c.list, c.entry, c.block)
}

// merger folds contributions of one policy type.
type merger struct {
	// appendPaths are the dotted conf paths whose lists concatenate.
	appendPaths map[string]bool
	// keyed are the append paths whose items merge by a key field (the
	// path's value): MeshHTTPRoute rules with equal matches (mergeByKey).
	keyed map[string]string
	// budget is the snapshot's time for `when` expressions (nil: none).
	budget *condition.Budget
}

func newMerger(appendFields []string) merger {
	m := merger{}
	if len(appendFields) > 0 {
		m.appendPaths = make(map[string]bool, len(appendFields))
		for _, f := range appendFields {
			m.appendPaths[f] = true
		}
	}
	return m
}

// fill folds the default block c into st as a contribution less specific
// than everything st already holds (docs/policy.md#defaults-and-overrides defaults pass): merge fills
// only what is unset, atomic applies only when nothing is set, unset paths
// become markers that less specific defaults cannot fill, and a `when` that
// is false (or fails, with a warning) skips the block's conf. changed is false when
// c changes nothing, in which case c provably does not affect the final
// conf; the returned state may still carry a new warning.
func (m merger) fill(st foldState, c *contribution) (foldState, bool) {
	if c != nil && c.plain != 0 && st.root != nil && st.root == st.idleRoot && c.plain == st.idleShape {
		return st, false
	}
	if !c.active() {
		return st, false
	}
	apply := c.hasConf && (!c.atomic || !hasContent(st.root))
	if apply && c.when != nil {
		ok, err := c.when.Eval(st.value(), m.budget)
		if err != nil {
			st = st.warn(c, err)
		}
		apply = ok && err == nil
		if !apply {
			st.skipped = &contributors{c: c, next: st.skipped}
		}
	}
	root, changed := st.root, false
	if apply {
		root, changed = m.fillNode(st.root, c.patch, "", c)
	}
	if c.plain != 0 && !changed {
		st.idleRoot, st.idleShape = st.root, c.plain
		return st, false
	}
	// unset belongs to the entry, not to its default block: it applies
	// whatever the block's when says.
	for _, path := range c.unset {
		var marked bool
		root, marked = markUnset(root, path, c)
		changed = changed || marked
	}
	if !changed {
		return st, false
	}
	st.root = root
	st.contrib = &contributors{c: c, next: st.contrib}
	return st, true
}

// fold merges defaults-only contributions cs, given in apply order.
func (m merger) fold(cs []*contribution) foldState {
	var st foldState
	for i := len(cs) - 1; i >= 0; i-- {
		st, _ = m.fill(st, cs[i])
	}
	return st
}

// override applies the override block c on top of st (docs/policy.md#defaults-and-overrides overrides
// pass, forward): merge is an RFC 7396 patch that wins over what is set,
// atomic replaces the whole conf, and a false (or failing) `when` skips it.
func (m merger) override(st foldState, c *contribution) (foldState, bool) {
	if c == nil || !c.hasConf {
		return st, false
	}
	if c.when != nil {
		ok, err := c.when.Eval(st.value(), m.budget)
		if err != nil {
			return st.warn(c, err), false
		}
		if !ok {
			return st, false
		}
	}
	if c.atomic {
		st.root = m.newNode(c.patch, "", c)
	} else {
		st.root = m.patchNode(st.root, c.patch, "", c)
	}
	st.over = &contributors{c: c, next: st.over}
	return st, true
}

// overrides applies override blocks given in the overrides pass's order.
func (m merger) overrides(st foldState, os []*contribution) foldState {
	for _, o := range os {
		st, _ = m.override(st, o)
	}
	return st
}

// patchNode merges p over n, p winning (forward RFC 7396). Append lists
// concatenate, the override's items last.
func (m merger) patchNode(n *node, p *patch, path string, c *contribution) *node {
	if !p.isObj {
		if list, ok := p.value.([]any); ok && n != nil && n.kind == nodeList && m.appendPaths[path] {
			out := *n
			out.sealed = false
			out.items = append(append(make([]any, 0, len(n.items)+len(list)), n.items...), list...)
			out.listBy = append(slices.Clone(n.listBy), c)
			out.counts = append(slices.Clone(n.counts), len(list))
			return &out
		}
		return m.newNode(p, path, c)
	}
	var out *node
	if n != nil && n.kind == nodeObject {
		out = copyObject(n)
		out.sealed, out.virtual = false, false
	} else {
		out = &node{kind: nodeObject, kids: make(map[string]*node, len(p.fields)), by: c}
	}
	for _, f := range p.fields {
		out.kids[f.key] = m.patchNode(out.kids[f.key], f.patch, m.childPath(path, f.key), c)
	}
	return out
}

// markUnset puts an unset marker of c at path below n unless a value is
// already set there (by a more specific contribution, or by c itself).
func markUnset(n *node, path []string, c *contribution) (*node, bool) {
	if n == nil {
		if len(path) == 0 {
			return &node{kind: nodeDeleted, unset: true, by: c}, true
		}
		kid, _ := markUnset(nil, path[1:], c)
		return &node{kind: nodeObject, virtual: true, kids: map[string]*node{path[0]: kid}, by: c}, true
	}
	if len(path) == 0 {
		switch {
		case n.sealed || n.kind == nodeLeaf || n.kind == nodeDeleted:
			return n, false // settled by something more specific
		case n.kind == nodeObject && n.virtual && !hasContent(n):
			return &node{kind: nodeDeleted, unset: true, by: c}, true
		}
		// An object or append list that more specific contributions started:
		// less specific defaults may no longer add to it.
		return sealed(n), true
	}
	if n.kind != nodeObject || n.sealed {
		return n, false // settled: a value, a deletion, or an object lower defaults no longer reach
	}
	kid, changed := markUnset(n.kids[path[0]], path[1:], c)
	if !changed {
		return n, false
	}
	out := copyObject(n)
	out.kids[path[0]] = kid
	return out, true
}

// hasContent reports whether n holds anything the output shows.
func hasContent(n *node) bool {
	if n == nil {
		return false
	}
	switch n.kind {
	case nodeDeleted:
		return false
	case nodeObject:
		if !n.virtual {
			return true
		}
		for _, kid := range n.kids {
			if hasContent(kid) {
				return true
			}
		}
		return false
	}
	return true
}

func (m merger) fillNode(n *node, p *patch, path string, c *contribution) (*node, bool) {
	if n == nil {
		return m.newNode(p, path, c), true
	}
	switch n.kind {
	case nodeLeaf, nodeDeleted:
		return n, false
	case nodeList:
		return m.fillList(n, p, c)
	}
	if n.sealed {
		return n, false
	}
	if !p.isObj {
		if n.virtual {
			// Only unset markers below: nothing more specific set this
			// object, so the value takes the position.
			return m.newNode(p, path, c), true
		}
		// Forward, this value replaced the object and the more specific
		// contributions merged into the replacement: nothing below it survives.
		return sealed(n), true
	}
	var out *node
	if n.virtual && len(p.fields) == 0 {
		// An explicit {} makes the object real (it shows even when empty);
		// otherwise it shows only once a real value lands inside.
		out = copyObject(n)
		out.virtual, out.by = false, c
	}
	for _, f := range p.fields {
		kid, changed := m.fillNode(n.kids[f.key], f.patch, m.childPath(path, f.key), c)
		if !changed {
			continue
		}
		if out == nil {
			out = copyObject(n)
		}
		out.kids[f.key] = kid
		if out.virtual && hasContent(kid) {
			out.virtual, out.by = false, c // a real value landed inside
		}
	}
	if out == nil {
		return n, false
	}
	return out, true
}

// fillList prepends a less specific list to an append list; any other value
// cuts the list off from everything less specific.
func (m merger) fillList(n *node, p *patch, c *contribution) (*node, bool) {
	if n.sealed {
		return n, false
	}
	list, ok := p.value.([]any)
	if p.isObj || !ok {
		return sealed(n), true
	}
	if len(list) == 0 {
		return n, false
	}
	out := *n
	out.items = make([]any, 0, len(list)+len(n.items))
	out.items = append(append(out.items, list...), n.items...)
	out.listBy = append([]*contribution{c}, n.listBy...)
	out.counts = append([]int{len(list)}, n.counts...)
	return &out, true
}

func (m merger) newNode(p *patch, path string, c *contribution) *node {
	if p.isObj {
		n := &node{kind: nodeObject, kids: make(map[string]*node, len(p.fields)), by: c}
		for _, f := range p.fields {
			n.kids[f.key] = m.newNode(f.patch, m.childPath(path, f.key), c)
		}
		return n
	}
	switch v := p.value.(type) {
	case nil:
		return &node{kind: nodeDeleted, by: c}
	case []any:
		if m.appendPaths[path] {
			return &node{kind: nodeList, items: v, listBy: []*contribution{c}, counts: []int{len(v)}, key: m.keyed[path], by: c}
		}
	}
	return &node{kind: nodeLeaf, value: p.value, by: c}
}

func (m merger) childPath(path, key string) string {
	if m.appendPaths == nil {
		return ""
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func sealed(n *node) *node {
	out := *n
	out.sealed = true
	return &out
}

func copyObject(n *node) *node {
	out := *n
	out.kids = make(map[string]*node, len(n.kids)+1)
	for k, v := range n.kids {
		out.kids[k] = v
	}
	return &out
}

// empty reports whether the fold produced no conf at all.
func (st foldState) empty() bool { return !hasContent(st.root) }

// value converts the fold to plain JSON values.
func (st foldState) value() any {
	if st.empty() {
		return nil
	}
	return nodeValue(st.root)
}

func nodeValue(n *node) any {
	switch n.kind {
	case nodeLeaf:
		return n.value
	case nodeList:
		if n.key != "" {
			return mergeByKey(n.items, n.counts, n.key)
		}
		return append([]any{}, n.items...)
	}
	obj := make(map[string]any, len(n.kids))
	for k, kid := range n.kids {
		if kid.kind != nodeDeleted && (!kid.virtual || hasContent(kid)) {
			obj[k] = nodeValue(kid)
		}
	}
	return obj
}

// contributions lists the contributions that changed the fold: defaults in
// apply order, then overrides in the order they were applied. Once an
// override applied, a contribution is listed only if something it set is
// still in the conf (an atomic override, say, discards every default).
func (st foldState) contributions() []*contribution {
	var out []*contribution
	for c := st.contrib; c != nil; c = c.next {
		out = append(out, c.c)
	}
	if st.over == nil {
		return out
	}
	var overs []*contribution
	for c := st.over; c != nil; c = c.next {
		overs = append(overs, c.c)
	}
	slices.Reverse(overs)
	out = append(out, overs...)
	owners := map[*contribution]bool{}
	collectOwners(st.root, owners)
	return slices.DeleteFunc(out, func(c *contribution) bool { return !owners[c] })
}

// collectOwners marks every contribution that set something visible in n
// (or deleted something, or unset it).
func collectOwners(n *node, owners map[*contribution]bool) {
	if n == nil || (n.virtual && !hasContent(n)) {
		return
	}
	switch n.kind {
	case nodeList:
		for _, c := range n.listBy {
			owners[c] = true
		}
		return
	case nodeObject:
		for _, kid := range n.kids {
			collectOwners(kid, owners)
		}
		if len(n.kids) == 0 {
			owners[n.by] = true
		}
		return
	}
	owners[n.by] = true
}

// appliedBlocks lists the blocks that applied to the fold's target, as
// origins show them (docs/policy.md#merging): the default blocks of every
// entry that matched it, given in apply order (defaults), whether or not a
// later block replaced all they set, except those whose `when` was false
// or failed; then the overrides applied, in the order applied. A block
// listed twice in a row (the entries of one rule's matches share it) is
// listed once.
func (st foldState) appliedBlocks(defaults []*contribution) []*contribution {
	var skipped map[*contribution]bool
	for c := st.skipped; c != nil; c = c.next {
		if skipped == nil {
			skipped = map[*contribution]bool{}
		}
		skipped[c.c] = true
	}
	out := make([]*contribution, 0, len(defaults))
	for _, c := range defaults {
		if c.active() && !skipped[c] && (len(out) == 0 || out[len(out)-1] != c) {
			out = append(out, c)
		}
	}
	n := len(out)
	for c := st.over; c != nil; c = c.next {
		out = append(out, c.c)
	}
	slices.Reverse(out[n:])
	return out
}

func originsOf(cs []*contribution) []Origin {
	out := make([]Origin, len(cs))
	for i, c := range cs {
		out[i] = c.origin()
	}
	return out
}

// applied renders a fold of the default blocks defaults (in apply order)
// and its overrides for output; ok is false when there is no conf.
func (st foldState) applied(defaults []*contribution) (Applied, bool) {
	if st.empty() {
		return Applied{}, false
	}
	return Applied{Conf: st.conf(), Origin: originsOf(st.appliedBlocks(defaults))}, true
}

// conf is the fold's conf as canonical JSON.
func (st foldState) conf() json.RawMessage { return canonicalJSON(st.value()) }

// canonicalJSON encodes v with sorted object keys and without HTML escaping
// (proxy patches carry Envoy YAML with '<' and '&'): resource.CanonicalJSON,
// the stored form.
func canonicalJSON(v any) json.RawMessage {
	out, err := resource.CanonicalJSON(v)
	if err != nil {
		// v comes from decoding JSON, so it always encodes; keep output valid anyway.
		return json.RawMessage("null")
	}
	return out
}
