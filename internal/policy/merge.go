package policy

import (
	"bytes"
	"encoding/json"
)

// Merging (SPEC 3.3).
//
// Every conf block that may apply to a target is a contribution. A target's
// effective conf is one fold over its contributions, listed in apply order
// (SPEC 3.2, ascending: later wins). The result equals folding them forward
// with RFC 7396 JSON merge patch, with the type's append fields
// concatenated instead of replaced.
//
// The fold runs backwards, from the most specific contribution to the least
// specific, and only fills what is still unset. This is SPEC 3.6's defaults
// pass; it is used here because:
//   - a contribution that fills nothing is provably irrelevant to the result,
//     which lets the from-rule builder prune shadowed entries instead of
//     enumerating subsets (see fromrules.go), and lets a fold over 10,000
//     contributions stop doing work once the conf is saturated;
//   - SPEC 3.6 later slots in without a rewrite: an atomic default applies
//     only to an empty state, `unset` paths become deleted nodes that lower
//     contributions cannot fill, and the overrides pass is a forward fold
//     applied to the result. Every node records the contribution that set it
//     (node.by), which is the per-field provenance 3.6.3 asks for.

// contribution is one conf block of one policy entry: the unit the fold
// works on. SPEC 3.6 adds the override block, strategy, when and unset here.
type contribution struct {
	pol    *policy
	entry  int    // index in the policy's to/from array; -1 for proxy-wide and legacy
	block  string // "default" (3.6: "override")
	conf   any    // decoded JSON, numbers as json.Number; nil = no conf
	patch  *patch // conf compiled for folding
	origin Origin // precomputed for output
	order  int    // apply order among the contributions of one type's to or from entries
}

// newContribution makes a contribution of pol (nil in tests).
func newContribution(pol *policy, entry int, block string, conf confBlock) *contribution {
	c := &contribution{pol: pol, entry: entry, block: block, conf: conf.value, patch: conf.patch}
	if pol != nil {
		c.origin = Origin{Meta: pol.meta}
		if entry >= 0 {
			idx := entry
			c.origin.Entry = &idx
		}
		c.origin = c.origin.withEncoding()
	}
	return c
}

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
	value  any  // nodeLeaf
	items  []any
	kids   map[string]*node
	by     *contribution // the contribution that created the node (provenance)
}

// contributors is the persistent list of contributions that changed a fold
// state, in apply order (the fold prepends as it walks backwards).
type contributors struct {
	c    *contribution
	next *contributors
}

// foldState is the result of folding some contributions. The zero value is
// the empty fold (no conf).
type foldState struct {
	root    *node
	contrib *contributors
}

// merger folds contributions of one policy type.
type merger struct {
	// appendPaths are the dotted conf paths whose lists concatenate.
	appendPaths map[string]bool
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

// fill folds c into st as a contribution less specific than everything st
// already holds. changed is false when c fills nothing, in which case st is
// returned unchanged and c provably does not affect the final conf.
func (m merger) fill(st foldState, c *contribution) (foldState, bool) {
	if c.conf == nil {
		return st, false
	}
	root, changed := m.fillNode(st.root, c.patch, "", c)
	if !changed {
		return st, false
	}
	return foldState{root: root, contrib: &contributors{c: c, next: st.contrib}}, true
}

// fold merges cs, given in apply order.
func (m merger) fold(cs []*contribution) foldState {
	var st foldState
	for i := len(cs) - 1; i >= 0; i-- {
		st, _ = m.fill(st, cs[i])
	}
	return st
}

func (m merger) fillNode(n *node, p *patch, path string, c *contribution) (*node, bool) {
	if n == nil {
		return m.newNode(p, path, c), true
	}
	switch n.kind {
	case nodeLeaf, nodeDeleted:
		return n, false
	case nodeList:
		return m.fillList(n, p)
	}
	if n.sealed {
		return n, false
	}
	if !p.isObj {
		// Forward, this value replaced the object and the more specific
		// contributions merged into the replacement: nothing below it survives.
		return sealed(n), true
	}
	var out *node
	for _, f := range p.fields {
		kid, changed := m.fillNode(n.kids[f.key], f.patch, m.childPath(path, f.key), c)
		if !changed {
			continue
		}
		if out == nil {
			out = copyObject(n)
		}
		out.kids[f.key] = kid
	}
	if out == nil {
		return n, false
	}
	return out, true
}

// fillList prepends a less specific list to an append list; any other value
// cuts the list off from everything less specific.
func (m merger) fillList(n *node, p *patch) (*node, bool) {
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
			return &node{kind: nodeList, items: v, by: c}
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
func (st foldState) empty() bool { return st.root == nil || st.root.kind == nodeDeleted }

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
		return append([]any{}, n.items...)
	}
	obj := make(map[string]any, len(n.kids))
	for k, kid := range n.kids {
		if kid.kind != nodeDeleted {
			obj[k] = nodeValue(kid)
		}
	}
	return obj
}

// contributions lists the contributions that changed the fold, in apply
// order.
func (st foldState) contributions() []*contribution {
	var out []*contribution
	for c := st.contrib; c != nil; c = c.next {
		out = append(out, c.c)
	}
	return out
}

// origins lists the contributions that changed the fold, in apply order.
func (st foldState) origins() []Origin { return originsOf(st.contributions()) }

func originsOf(cs []*contribution) []Origin {
	out := make([]Origin, len(cs))
	for i, c := range cs {
		out[i] = c.origin
	}
	return out
}

// applied renders a fold for output; ok is false when there is no conf.
func (st foldState) applied() (Applied, bool) {
	if st.empty() {
		return Applied{}, false
	}
	return Applied{Conf: canonicalJSON(st.value()), Origin: st.origins()}, true
}

// canonicalJSON encodes v with sorted object keys and without HTML escaping
// (proxy patches carry Envoy YAML with '<' and '&').
func canonicalJSON(v any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// v comes from decoding JSON, so it always encodes; keep output valid anyway.
		return json.RawMessage("null")
	}
	return json.RawMessage(bytes.TrimRight(buf.Bytes(), "\n"))
}

// decodeJSON decodes raw JSON keeping numbers exact. An absent or null raw
// value decodes to nil.
func decodeJSON(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}
