package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Provenance (docs/policy.md#provenance-and-explain). A trace runs the same fold functions as the
// views (fill, then override) over one target's blocks, remembering what
// happened to each block; every field of the result names the block that
// set it (node.by). `_explain` renders a trace, and policy status
// aggregates the traces of every target a policy reaches, so both say
// exactly what the config computation did.

// blockFate is what happened to one block as a whole.
type blockFate uint8

const (
	fateApplied    blockFate = iota // folded in (some of its fields may still have lost)
	fateNoEffect                    // applied but changed nothing
	fateWhenFalse                   // its when was false
	fateWhenFailed                  // its when failed to evaluate (counted as false)
	fateAtomicLost                  // an atomic default, discarded because a more specific default set the conf
	fateNotReached                  // a default block with no conf and no unset
)

// blockTrace is one block's part in a target's conf.
type blockTrace struct {
	c       *contribution
	fate    blockFate
	whenErr error
	// fields are the block's leaf paths (dotted) with what became of each.
	fields []fieldFate
	// unsets are the block's unset paths with what became of each.
	unsets []unsetFate
	// leaves, for a plain block of a trace without detail, replace fields:
	// its shape's leaves in the final conf, shared by every block of the
	// shape (a trace over 100,000 blocks made a list for each).
	leaves []located
}

// fieldCount and fieldAt read the fates of the block's fields, judged when
// traced or, for leaves, as they are read.
func (bt *blockTrace) fieldCount() int { return len(bt.leaves) + len(bt.fields) }

func (bt *blockTrace) fieldAt(i int) fieldFate {
	if i >= len(bt.leaves) {
		return bt.fields[i-len(bt.leaves)]
	}
	l := bt.leaves[i]
	ff := fieldFate{path: l.path}
	ff.won, ff.by = winnerAt(bt.c, l.node, l.depth, len(l.parts))
	return ff
}

// fieldFate: won is true when the block's value is the one in effect;
// otherwise by is the block that decided the field (nil for a block that
// did not apply as a whole) and reason says how.
type fieldFate struct {
	path   string
	value  any
	won    bool
	by     *contribution
	reason string
}

// unsetFate: ignored when an override sets the field anyway.
type unsetFate struct {
	path    string
	ignored bool
	by      *contribution // the override that set it, when ignored
}

// trace is the outcome of one target's fold.
type trace struct {
	final  foldState
	blocks []*blockTrace // defaults in apply order, then overrides in their order
	// detail: the fields' values and reasons are filled in (`_explain`);
	// statuses need only who won each field, and at 100,000 policies the
	// reasons were a fifth of what computing statuses allocated.
	detail bool
	// leaves are, by shape (plain blocks only, without detail), the leaf
	// paths of that shape and the final conf's node at each: blocks of one
	// shape have the same leaves, so a trace over 100,000 blocks of a few
	// shapes walks each shape once instead of every block.
	leaves map[shapeID][]located
}

// located is a leaf path of a shape and where it ends in the final conf.
type located struct {
	path  string
	parts []string
	node  *node
	depth int
}

// traceFold folds defaults (apply order) and overrides (the overrides pass's
// order) like foldEntries, recording each block's fate, with every field's
// value and reason.
func traceFold(m merger, defaults, overrides []*contribution) *trace {
	return foldTrace(m, defaults, overrides, true)
}

// statusTrace is traceFold without the fields' values and reasons.
func statusTrace(m merger, defaults, overrides []*contribution) *trace {
	return foldTrace(m, defaults, overrides, false)
}

func foldTrace(m merger, defaults, overrides []*contribution, detail bool) *trace {
	tr := &trace{detail: detail}
	var st foldState
	// One array holds every block's trace (defaults in apply order, then
	// overrides): a trace over 100,000 blocks made as many objects.
	bts := make([]blockTrace, len(defaults)+len(overrides))
	tr.blocks = make([]*blockTrace, len(bts))
	for i := range bts {
		tr.blocks[i] = &bts[i]
	}
	for i := len(defaults) - 1; i >= 0; i-- {
		c := defaults[i]
		bt := &bts[i]
		bt.c = c
		if !c.active() {
			bt.fate = fateNotReached
			continue
		}
		bt.fate = preFate(m, c, st)
		if c.when != nil && bt.fate != fateApplied {
			bt.whenErr = whenError(m, c, st)
		}
		atomicLost := bt.fate == fateApplied && c.hasConf && c.atomic && hasContent(st.root)
		var changed bool
		st, changed = m.fill(st, c)
		switch {
		case atomicLost:
			bt.fate = fateAtomicLost // its unset paths may still have applied
		case bt.fate == fateApplied && !changed:
			bt.fate = fateNoEffect
		}
	}
	for j, c := range overrides {
		bt := &bts[len(defaults)+j]
		bt.c, bt.fate = c, preFate(m, c, st)
		if c.when != nil && bt.fate != fateApplied {
			bt.whenErr = whenError(m, c, st)
		}
		st, _ = m.override(st, c)
	}
	tr.final = st
	for _, bt := range tr.blocks {
		tr.judge(bt)
	}
	return tr
}

// preFate evaluates a block's when against the state it is about to patch.
func preFate(m merger, c *contribution, st foldState) blockFate {
	if c.when == nil {
		return fateApplied
	}
	ok, err := c.when.Eval(st.value(), m.budget)
	switch {
	case err != nil:
		return fateWhenFailed
	case !ok:
		return fateWhenFalse
	}
	return fateApplied
}

func whenError(m merger, c *contribution, st foldState) error {
	_, err := c.when.Eval(st.value(), m.budget)
	return err
}

// judge decides, for every leaf of bt's conf, whether its value is in
// effect and, if not, which block decided otherwise.
func (tr *trace) judge(bt *blockTrace) {
	c := bt.c
	if !tr.detail && c.plain != 0 {
		// A plain block (a conf, no when, no unset, not atomic) was folded
		// in: each leaf won or lost by its shape's node alone, judged as
		// the fields are read (fieldAt).
		bt.leaves = tr.leavesOf(c)
		return
	}
	if c.patch != nil && c.hasConf {
		leafPaths(c.patch, nil, func(path []string, p *patch) {
			ff := fieldFate{path: strings.Join(path, ".")}
			if !tr.detail {
				if bt.fate != fateWhenFalse && bt.fate != fateWhenFailed && bt.fate != fateAtomicLost {
					ff.won, ff.by = tr.winner(c, path)
				}
				bt.fields = append(bt.fields, ff)
				return
			}
			ff.value = patchValue(p)
			switch bt.fate {
			case fateWhenFalse:
				ff.reason = "when false: " + c.when.Source()
			case fateWhenFailed:
				ff.reason = fmt.Sprintf("when failed, counted as false: %v", bt.whenErr)
			case fateAtomicLost:
				ff.reason = "atomic default discarded: a more specific default already set the conf"
			default:
				ff.won, ff.by, ff.reason = tr.decide(c, path)
			}
			bt.fields = append(bt.fields, ff)
		})
	}
	for _, u := range c.unset {
		n, depth := locate(tr.final.root, u)
		uf := unsetFate{path: strings.Join(u, ".")}
		if depth == len(u) && n != nil && n.by != nil && n.by.block == blockOverride && visible(n) {
			uf.ignored, uf.by = true, n.by
		}
		bt.unsets = append(bt.unsets, uf)
	}
}

// winner is decide without the reason.
func (tr *trace) winner(c *contribution, path []string) (won bool, by *contribution) {
	n, depth := locate(tr.final.root, path)
	return winnerAt(c, n, depth, len(path))
}

// winnerAt is winner for a path of length want that locate ended at n,
// depth.
func winnerAt(c *contribution, n *node, depth, want int) (won bool, by *contribution) {
	if n == nil {
		return false, nil
	}
	if depth == want && (n.kind == nodeList && slices.Contains(n.listBy, c) || n.by == c) {
		return true, c
	}
	return false, n.by
}

// leavesOf returns the leaves of c's shape located in the final conf,
// computing them on the first block of the shape.
func (tr *trace) leavesOf(c *contribution) []located {
	if ls, ok := tr.leaves[c.plain]; ok {
		return ls
	}
	var ls []located
	leafPaths(c.patch, nil, func(path []string, _ *patch) {
		n, depth := locate(tr.final.root, path)
		ls = append(ls, located{path: strings.Join(path, "."), parts: path, node: n, depth: depth})
	})
	if tr.leaves == nil {
		tr.leaves = map[shapeID][]located{}
	}
	tr.leaves[c.plain] = ls
	return ls
}

// decide says whether c's value at path is in effect, else who set what is.
func (tr *trace) decide(c *contribution, path []string) (won bool, by *contribution, reason string) {
	n, depth := locate(tr.final.root, path)
	if n == nil {
		return false, nil, "not in the effective conf"
	}
	if depth == len(path) {
		switch {
		case n.kind == nodeList && slices.Contains(n.listBy, c):
			return true, c, ""
		case n.by == c:
			return true, c, ""
		case n.kind == nodeDeleted && n.unset:
			return false, n.by, "unset by " + n.by.name()
		case n.kind == nodeDeleted:
			return false, n.by, "deleted (null) by " + n.by.name()
		}
	}
	if n.by == nil || n.by == c {
		return false, n.by, "not in the effective conf"
	}
	if n.by.block == blockOverride {
		return false, n.by, "overridden by " + n.by.name()
	}
	return false, n.by, "overridden by more specific default " + n.by.name()
}

// name identifies a block in messages: "MeshTimeout g-timeouts to[0].override".
func (c *contribution) name() string {
	if c.pol == nil {
		return c.where()
	}
	return policyName(c.pol) + " " + c.where()
}

// policyName names a policy in messages by the name its author gave it: a
// synced copy by its display name and where it came from ("MeshTimeout
// guardrail (global)"); the exact stored name is in every META.
func policyName(p *policy) string {
	if p.name != "" {
		return p.name
	}
	return p.desc.Name + " " + resource.Naming{Name: p.resName, Namespace: p.resNS, Labels: p.labels.Get}.String()
}

// locate walks path from root; it returns the node at path (depth ==
// len(path)) or the deepest node on the way (a value, or an object lacking
// the next key).
func locate(root *node, path []string) (*node, int) {
	n := root
	for depth, key := range path {
		if n == nil || n.kind != nodeObject {
			return n, depth
		}
		kid := n.kids[key]
		if kid == nil {
			return n, depth
		}
		n = kid
	}
	return n, len(path)
}

func visible(n *node) bool {
	return n != nil && n.kind != nodeDeleted && (!n.virtual || hasContent(n))
}

// leafPaths calls fn for every leaf of p: a non-object value or an empty
// object.
func leafPaths(p *patch, prefix []string, fn func([]string, *patch)) {
	if !p.isObj || len(p.fields) == 0 {
		fn(slices.Clone(prefix), p)
		return
	}
	for _, f := range p.fields {
		leafPaths(f.patch, append(prefix, f.key), fn)
	}
}

func patchValue(p *patch) any {
	if !p.isObj {
		return p.value
	}
	obj := make(map[string]any, len(p.fields))
	for _, f := range p.fields {
		obj[f.key] = patchValue(f.patch)
	}
	return obj
}

// won counts the block's fields in effect; lost lists the others.
func (bt *blockTrace) won() (won int, lost []fieldFate) {
	for _, f := range bt.fields {
		if f.won {
			won++
		} else {
			lost = append(lost, f)
		}
	}
	return won, lost
}
