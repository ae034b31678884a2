package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// From-rules (docs/policy.md#rule-views).
//
// The rules of an inbound partition the clients into pairwise-disjoint
// subsets, each a conjunction of per-key constraints: one positive value, or
// a set of negated values. The naive construction enumerates all 2^n combinations of
// positive/negated tags; that explodes (70 items over 2 keys = 2^70). The
// builder here is a decision tree over the entries instead:
//
//   - Entries are visited from the most specific down, carrying the reverse
//     fold (merge.go) of the entries already known to match the cell.
//   - An entry the cell contradicts is skipped; one the cell implies is
//     folded in; an entry that would not change the fold is skipped too,
//     because no client in the cell can tell whether it matched (this is
//     what keeps alternating ALLOW/DENY lists linear: once a cell has an
//     action, nothing less specific matters).
//   - Only an undetermined entry that would change the fold splits the cell:
//     into "all its tags hold" and, per tag key, "the earlier tags hold and
//     this one does not". Splits are per key (one value positive, or values
//     negated), never per power set; independent groups of entries never
//     multiply unless their confs really combine; subsets no client can be
//     in are never created (contradictions are detected on the spot).
//   - Leaves without any conf are dropped; adjacent leaves with equal confs
//     and origins are merged when their union is again one conjunction.
//
// Correctness is the brute-force definition: for any client, the rule it
// falls into carries exactly the merge of the entries that select it (a
// skipped entry changes nothing, so the leaf fold equals that merge).

// maxRulesPerInbound bounds the output of one type on one inbound. Confs
// with many independent fields over many keys really do have a product of
// distinct outcomes; past this bound the engine reports an error instead of
// exhausting memory.
const maxRulesPerInbound = 50_000

// maxRuleSteps bounds the work of one build (entries visited over all
// paths of the tree), so that a pathological policy set costs at most a
// fraction of a second per distinct inbound instead of minutes.
const maxRuleSteps = 5_000_000

var errTooManyRules = errors.New("too many from-rules")

type keyState struct {
	pos    string
	hasPos bool
	negs   []string // sorted
}

// cellLeaf is one finished cell: its constraints, its fold, and the
// blocks that applied to some client of it (its rule's origin).
type cellLeaf struct {
	cons   []keyCons
	st     foldState
	blocks []*contribution
}

// keyCons is the constraint of a leaf on one key.
type keyCons struct {
	key    string
	pos    string
	hasPos bool
	negs   []string // sorted; empty when hasPos
}

type ruleBuilder struct {
	m       merger
	entries []*entry // most specific first
	cell    map[string]*keyState
	keys    []string // every key the cell has constrained, sorted
	leaves  []cellLeaf
	warns   []string
	limit   int
	steps   int
	err     error
	// path holds, in visiting order (most specific first), the entries of
	// the current path that matched some client of the cell when visited:
	// folded in, or skipped because they would change nothing.
	path []*entry
}

// buildFromRules computes the rules of entries given in apply order, and
// the leaves they were rendered from (with their final fold states).
func buildFromRules(m merger, applyOrder []*entry, limit int) (*fromBuild, error) {
	b := &ruleBuilder{m: m, cell: map[string]*keyState{}, limit: limit}
	b.entries = make([]*entry, 0, len(applyOrder))
	for i := len(applyOrder) - 1; i >= 0; i-- {
		if e := applyOrder[i]; !e.never && (e.c.active() || e.o != nil) {
			b.entries = append(b.entries, e)
		}
	}
	b.walk(0, foldState{}, nil)
	if b.err != nil {
		return nil, b.err
	}
	slices.Sort(b.warns)
	rules, blocks := b.rules()
	return &fromBuild{rules: rules, ruleBlocks: blocks, leaves: b.leaves, warns: slices.Compact(b.warns)}, nil
}

// fromBuild is what buildFromRules computed: rules without origins and,
// by rule, the blocks of their origins.
type fromBuild struct {
	rules      []Rule
	ruleBlocks [][]*contribution
	leaves     []cellLeaf // the cells the rules were rendered from, with their final folds
	warns      []string   // `when` expressions that failed to evaluate
}

// walk visits entries from i on. st is the defaults fold of the entries
// known to match the cell; overs are their override blocks, which the
// overrides pass applies at the leaf (docs/policy.md#defaults-and-overrides runs both passes per client
// subset). An entry with an override always matters, so it always splits
// an undetermined cell.
func (b *ruleBuilder) walk(i int, st foldState, overs *contributors) {
	mark := len(b.path)
	defer func() { b.path = b.path[:mark] }()
	for ; i < len(b.entries); i++ {
		if b.steps++; b.steps > maxRuleSteps {
			b.err = fmt.Errorf("%w: more than %d steps", errTooManyRules, maxRuleSteps)
			return
		}
		e := b.entries[i]
		undetermined, possible := b.classify(e.tags)
		if !possible {
			continue
		}
		next, changed := b.m.fill(st, e.c)
		if !changed && e.o == nil {
			st = next // a failed `when` leaves a warning
			b.path = append(b.path, e)
			continue
		}
		nextOvers := overs
		if e.o != nil {
			nextOvers = &contributors{c: e.o, next: overs}
		}
		if len(undetermined) == 0 {
			st, overs = next, nextOvers
			b.path = append(b.path, e)
			continue
		}
		b.split(i, st, next, overs, nextOvers, undetermined)
		return
	}
	b.emit(st, overs)
}

// classify says whether the cell contradicts tags (possible = false), and
// which of them it does not decide yet.
func (b *ruleBuilder) classify(tags []tag) (undetermined []tag, possible bool) {
	for _, t := range tags {
		ks := b.cell[t.key]
		switch {
		case ks == nil:
			undetermined = append(undetermined, t)
		case ks.hasPos:
			if ks.pos != t.value {
				return nil, false
			}
		case hasSorted(ks.negs, t.value):
			return nil, false
		default:
			undetermined = append(undetermined, t)
		}
	}
	return undetermined, true
}

// possible reports whether some client of the cell carries tags.
func (b *ruleBuilder) possible(tags []tag) bool {
	for _, t := range tags {
		ks := b.cell[t.key]
		switch {
		case ks == nil:
		case ks.hasPos:
			if ks.pos != t.value {
				return false
			}
		case hasSorted(ks.negs, t.value):
			return false
		}
	}
	return true
}

// split visits the cell where every undetermined tag holds (with the entry
// folded in), then, for each tag in turn, the cell where the tags before it
// hold and it does not (without the entry).
func (b *ruleBuilder) split(i int, st, next foldState, overs, nextOvers *contributors, tags []tag) {
	for _, t := range tags {
		b.setPos(t)
	}
	b.path = append(b.path, b.entries[i])
	b.walk(i+1, next, nextOvers)
	b.path = b.path[:len(b.path)-1]
	for _, t := range tags {
		b.unsetPos(t.key)
	}
	for _, t := range tags {
		if b.err != nil {
			break
		}
		b.addNeg(t)
		b.walk(i+1, st, overs)
		b.removeNeg(t)
		b.setPos(t)
	}
	for _, t := range tags {
		b.unsetPos(t.key)
	}
}

func (b *ruleBuilder) state(key string) *keyState {
	ks := b.cell[key]
	if ks == nil {
		ks = &keyState{}
		b.cell[key] = ks
		i, _ := slices.BinarySearch(b.keys, key)
		b.keys = slices.Insert(b.keys, i, key)
	}
	return ks
}

func (b *ruleBuilder) setPos(t tag) {
	ks := b.state(t.key)
	ks.pos, ks.hasPos = t.value, true
}

func (b *ruleBuilder) unsetPos(key string) { b.cell[key].hasPos = false }

func (b *ruleBuilder) addNeg(t tag) {
	ks := b.state(t.key)
	i, _ := slices.BinarySearch(ks.negs, t.value)
	ks.negs = slices.Insert(ks.negs, i, t.value)
}

func (b *ruleBuilder) removeNeg(t tag) {
	ks := b.cell[t.key]
	if i, ok := slices.BinarySearch(ks.negs, t.value); ok {
		ks.negs = slices.Delete(ks.negs, i, i+1)
	}
}

func hasSorted(list []string, v string) bool {
	_, ok := slices.BinarySearch(list, v)
	return ok
}

// emit applies the cell's overrides and records the cell as a leaf when it
// has a conf.
func (b *ruleBuilder) emit(st foldState, overs *contributors) {
	if overs != nil {
		var os []*contribution
		for c := overs; c != nil; c = c.next {
			os = append(os, c.c)
		}
		sortByOrder(os)
		st = b.m.overrides(st, os)
	}
	if st.warns != nil {
		b.warns = append(b.warns, st.warnings()...)
	}
	if st.empty() || b.err != nil {
		return
	}
	if len(b.leaves) >= b.limit {
		b.err = fmt.Errorf("%w: more than %d subsets", errTooManyRules, b.limit)
		return
	}
	var cons []keyCons
	for _, k := range b.keys {
		ks := b.cell[k]
		switch {
		case ks.hasPos:
			cons = append(cons, keyCons{key: k, pos: ks.pos, hasPos: true})
		case len(ks.negs) > 0:
			cons = append(cons, keyCons{key: k, negs: slices.Clone(ks.negs)})
		}
	}
	b.leaves = append(b.leaves, cellLeaf{cons: cons, st: st, blocks: st.appliedBlocks(b.matchedDefaults())})
}

// matchedDefaults lists, in apply order, the default blocks of the path's
// entries that match some client of the finished cell: an entry skipped
// while its tags were undetermined may have been contradicted by a later
// split.
func (b *ruleBuilder) matchedDefaults() []*contribution {
	out := make([]*contribution, 0, len(b.path))
	for i := len(b.path) - 1; i >= 0; i-- {
		if b.possible(b.path[i].tags) {
			out = append(out, b.path[i].c)
		}
	}
	return out
}

// rules renders the leaves, merging adjacent ones with equal confs whose
// union is a single conjunction, and lists each rule's origin blocks. A
// merged rule's origin lists the blocks of every rule merged into it, in
// apply order: each of them applied to some of its clients.
func (b *ruleBuilder) rules() ([]Rule, [][]*contribution) {
	type rendered struct {
		cons    []keyCons
		conf    json.RawMessage
		contrib []*contribution
	}
	confs := map[*node]json.RawMessage{}
	var stack []rendered
	for _, l := range b.leaves {
		conf, ok := confs[l.st.root]
		if !ok {
			conf = canonicalJSON(l.st.value())
			confs[l.st.root] = conf
		}
		stack = append(stack, rendered{cons: l.cons, conf: conf, contrib: l.blocks})
		for len(stack) >= 2 {
			x, y := &stack[len(stack)-2], &stack[len(stack)-1]
			if !bytes.Equal(x.conf, y.conf) {
				break
			}
			merged, ok := unionCons(x.cons, y.cons)
			if !ok {
				break
			}
			x.cons, x.contrib = merged, mergeContributions(x.contrib, y.contrib)
			stack = stack[:len(stack)-1]
		}
	}
	out := make([]Rule, len(stack))
	blocks := make([][]*contribution, len(stack))
	for i, r := range stack {
		out[i] = Rule{Matchers: matchersOf(r.cons), Conf: r.conf}
		blocks[i] = r.contrib
	}
	return out, blocks
}

// mergeContributions unions two lists sorted in apply order.
func mergeContributions(a, b []*contribution) []*contribution {
	out := make([]*contribution, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].order < b[j].order):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j].order < a[i].order:
			out = append(out, b[j])
			j++
		default: // the same contribution on both sides
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// unionCons merges two disjoint conjunctions that differ on exactly one key,
// where one says key=v and the other key∉N with v∈N: the union is key∉N\{v}.
// Both lists are sorted by key.
func unionCons(a, b []keyCons) ([]keyCons, bool) {
	if len(a) != len(b) {
		return nil, false // a key constrained on one side only: never of that form
	}
	diff := -1
	for i := range a {
		if a[i].key != b[i].key {
			return nil, false
		}
		if !equalCons(a[i], b[i]) {
			if diff >= 0 {
				return nil, false
			}
			diff = i
		}
	}
	if diff < 0 {
		return a, true
	}
	pos, neg := a[diff], b[diff]
	if !pos.hasPos {
		pos, neg = neg, pos
	}
	if !pos.hasPos || neg.hasPos || !hasSorted(neg.negs, pos.pos) {
		return nil, false
	}
	rest := slices.DeleteFunc(slices.Clone(neg.negs), func(v string) bool { return v == pos.pos })
	out := make([]keyCons, 0, len(a))
	out = append(out, a[:diff]...)
	if len(rest) > 0 {
		out = append(out, keyCons{key: pos.key, negs: rest})
	}
	return append(out, a[diff+1:]...), true
}

func equalCons(a, b keyCons) bool {
	return a.hasPos == b.hasPos && a.pos == b.pos && slices.Equal(a.negs, b.negs)
}

func matchersOf(cons []keyCons) []Matcher {
	n := 0
	for _, c := range cons {
		n += max(1, len(c.negs))
	}
	out := make([]Matcher, 0, n)
	for _, c := range cons {
		if c.hasPos {
			out = append(out, Matcher{Key: c.key, Value: c.pos})
			continue
		}
		for _, v := range c.negs {
			out = append(out, Matcher{Key: c.key, Value: v, Not: true})
		}
	}
	return out
}
