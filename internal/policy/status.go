package policy

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"unsafe"
)

// Policy status (docs/policy.md#status). Statuses are derived from the snapshot: for
// every Dataplane, every target (proxy, outbound, route, client subset of
// an inbound) is traced with the same fold the views use, and each policy
// aggregates what happened to its blocks. They are computed once per
// snapshot, on first use; a snapshot is rebuilt when a policy or Dataplane
// changes, so statuses are always current without polling.

// Condition is one status condition, Kubernetes style.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// PolicyStatus is what the zone reports under a policy's status.
type PolicyStatus struct {
	Conditions []Condition `json:"conditions"`
}

// Condition types and reasons.
const (
	CondAccepted          = "Accepted"
	CondEnforced          = "Enforced"
	ReasonAccepted        = "Accepted"
	ReasonInvalid         = "Invalid"
	ReasonTargetNotFound  = "TargetNotFound"
	ReasonEnforced        = "Enforced"
	ReasonPartially       = "PartiallyEnforced"
	ReasonOverridden      = "Overridden"
	conditionTrue         = "True"
	conditionFalse        = "False"
	maxStatusMessageItems = 10
)

// policyAgg accumulates a policy's outcomes over every target.
type policyAgg struct {
	selected bool // its top-level targetRef selects some Dataplane
	reached  bool // some block of it reached a target
	won      int  // fields in effect, summed over targets
	// lost is what of this policy lost, and to whom, each once: a list
	// (a policy loses a few fields to a few winners), where two maps per
	// policy were a sixth of what computing statuses allocated. While it
	// is short it is the items of lostSeq, a sequence the type's policies
	// share (never written): most lose the same fields to the same
	// winners, and a list each was a third of what computing statuses
	// allocated at 100,000 policies. Past 32 it is the policy's own, with
	// lostSet.
	lost      []loss
	lostSeq   *lossSeq
	lostSet   map[loss]bool // lost as a set, once it is long
	whenFalse map[string]bool
	ignored   map[string]bool // unset paths ignored because of an override
}

// lossAt is a block (where) of a policy, and the conf path in it that lost
// ("" when the whole block did); the message strings are made once per
// policy (enforced), not once per trace.
type lossAt struct{ where, path string }

func (l lossAt) String() string {
	if l.path == "" {
		return l.where
	}
	return l.where + " " + l.path
}

// loss is one block (and path) of a policy that lost, and the winner's name.
type loss struct {
	winner string
	at     lossAt
}

// lossSeq is a sequence of losses, shared by the policies that lost
// those, in that order; seqs is the empty one, its sequences are its
// extensions (with).
type lossSeq struct {
	items []loss // never written
	next  map[loss]*lossSeq
}

// with is s extended by l.
func (s *lossSeq) with(l loss) *lossSeq {
	if n := s.next[l]; n != nil {
		return n
	}
	n := &lossSeq{items: append(slices.Clip(s.items), l)}
	if s.next == nil {
		s.next = map[loss]*lossSeq{}
	}
	s.next[l] = n
	return n
}

// lose records that at lost to winner; seqs are the type's sequences.
func (a *policyAgg) lose(seqs *lossSeq, winner string, at lossAt) {
	l := loss{winner, at}
	switch {
	case a.lostSet != nil:
		if a.lostSet[l] {
			return
		}
		a.lostSet[l] = true
		a.lost = append(a.lost, l)
	case slices.Contains(a.lost, l):
		return
	case len(a.lost) >= 32: // a policy many others override somewhere
		a.lostSet = make(map[loss]bool, 2*len(a.lost))
		for _, have := range a.lost {
			a.lostSet[have] = true
		}
		a.lostSet[l] = true
		a.lost, a.lostSeq = append(slices.Clip(a.lost), l), nil // its own from now on
	default:
		if a.lostSeq == nil {
			a.lostSeq = seqs
		}
		a.lostSeq = a.lostSeq.with(l)
		a.lost = a.lostSeq.items
	}
}

// PolicyStatus returns the status of one policy. An unknown policy is
// ErrNotFound.
func (s *MeshSnapshot) PolicyStatus(policyType, name, namespace string) (*PolicyStatus, error) {
	st := s.statuses().byName[policyType][nsName{s.normNS(namespace), name}]
	if st == nil {
		return nil, fmt.Errorf("%s %q in mesh %q: %w", policyType, qualified(namespace, name), s.mesh, ErrNotFound)
	}
	return st, nil
}

// ComputeStatuses computes every policy's status now (they are otherwise
// computed on the first PolicyStatus call); the zone's view does it in the
// background after changes.
func (s *MeshSnapshot) ComputeStatuses() { s.statuses() }

// statuses computes every policy's status once per snapshot.
func (s *MeshSnapshot) statuses() *statusSet {
	s.statusOnce.Do(func() { s.status = s.computeStatuses() })
	return s.status
}

// statusSet is every policy's status, by type: by name (a policy's status,
// the skipped ones' too), and in the order of the type's policies (the
// report to the global walks them; looking each up by name was most of
// making it at 100,000 policies).
type statusSet struct {
	byName  map[string]map[nsName]*PolicyStatus
	ordered map[string][]*PolicyStatus
}

func (s *MeshSnapshot) computeStatuses() *statusSet {
	out := &statusSet{byName: map[string]map[nsName]*PolicyStatus{}, ordered: map[string][]*PolicyStatus{}}
	same := statusInterner{}
	memo := statusMemo{}
	for _, name := range s.typeNames {
		t := s.types[name]
		byName := make(map[nsName]*PolicyStatus, len(t.policies)+len(t.skipped))
		ordered := make([]*PolicyStatus, len(t.policies))
		out.byName[name], out.ordered[name] = byName, ordered
		for key := range t.skipped {
			byName[key] = &PolicyStatus{Conditions: []Condition{{Type: CondAccepted, Status: conditionFalse,
				Reason: ReasonInvalid, Message: skippedMessage(t, key)}}}
		}
		if legacyKindOf(t.desc) != notLegacy {
			s.legacyStatuses(t, byName)
			for i, p := range t.policies {
				ordered[i] = byName[nsName{s.normNS(p.resNS), p.resName}]
			}
			continue
		}
		aggs := s.aggregate(t)
		for i, p := range t.policies {
			ordered[i] = memo.statusOf(s, p, &aggs[i], same)
			byName[nsName{s.normNS(p.resNS), p.resName}] = ordered[i]
		}
	}
	return out
}

// statusMemo keeps the status of policies that were reached, by what
// their status is made of: whether a field of theirs won, and their
// shared loss sequence, else their losses written out (statusKeyOf). At
// 100,000 MeshTimeouts most lost the same fields to the same winner, and
// writing each one's messages was a third of computing statuses.
type statusMemo struct {
	bySeq map[seqKey]*PolicyStatus
	byKey map[string]*PolicyStatus
	buf   []byte
}

type seqKey struct {
	seq *lossSeq
	won bool
}

func (m *statusMemo) statusOf(s *MeshSnapshot, p *policy, a *policyAgg, same statusInterner) *PolicyStatus {
	if !a.selected || !a.reached || len(a.whenFalse) > 0 || len(a.ignored) > 0 {
		return same.intern(s.statusOf(p, a))
	}
	if a.lostSet == nil { // a.lost is lostSeq's (nil: nothing lost)
		k := seqKey{a.lostSeq, a.won > 0}
		if st, ok := m.bySeq[k]; ok {
			return st
		}
		st := same.intern(s.statusOf(p, a))
		if m.bySeq == nil {
			m.bySeq = map[seqKey]*PolicyStatus{}
		}
		m.bySeq[k] = st
		return st
	}
	m.buf = statusKeyOf(m.buf[:0], a)
	if st, ok := m.byKey[string(m.buf)]; ok {
		return st
	}
	st := same.intern(s.statusOf(p, a))
	if m.byKey == nil {
		m.byKey = map[string]*PolicyStatus{}
	}
	m.byKey[string(m.buf)] = st
	return st
}

// statusKeyOf writes what the status of a selected and reached policy
// without when-false blocks or ignored unsets is made of: whether a field
// of it won, and its losses in their order (length-prefixed). Two
// policies with the same key have the same status (enforced sorts).
func statusKeyOf(b []byte, a *policyAgg) []byte {
	b = append(b, byte(min(a.won, 1)))
	for _, l := range a.lost {
		for _, part := range [...]string{l.winner, l.at.where, l.at.path} {
			b = binary.AppendUvarint(b, uint64(len(part)))
			b = append(b, part...)
		}
	}
	return b
}

// statusInterner hands out one PolicyStatus per distinct content: many
// policies have the same status (at 100,000 MeshTimeouts most are
// overridden by the same few), and each kept its own conditions and
// messages, 28 MB of a zone's heap. Statuses are read-only once computed.
// Statuses have one or two conditions; the key is them, compared as values
// (building a string key of every message was 5% of computing statuses).
type statusInterner map[statusKey]*PolicyStatus

type statusKey struct {
	n     int
	conds [2]Condition
}

func (in statusInterner) intern(st *PolicyStatus) *PolicyStatus {
	if len(st.Conditions) > len(statusKey{}.conds) {
		return st
	}
	key := statusKey{n: len(st.Conditions)}
	copy(key.conds[:], st.Conditions)
	if have, ok := in[key]; ok {
		return have
	}
	in[key] = st
	return st
}

func skippedMessage(t *typeIndex, key nsName) string {
	prefix := t.desc.Name + " " + qualified(key.ns, key.name) + ": skipped: "
	for _, w := range t.warnings {
		if strings.HasPrefix(w, prefix) {
			return "Policy is invalid: " + strings.TrimPrefix(w, prefix)
		}
	}
	return "Policy is invalid"
}

// aggregate traces every target of every Dataplane for one type; the
// outcomes are by policy index (one array: 100,000 policies were as many
// allocations and map entries).
func (s *MeshSnapshot) aggregate(t *typeIndex) []policyAgg {
	aggs := make([]policyAgg, len(t.policies))
	seqs := &lossSeq{}        // the policies' loss sequences (lossSeq)
	seen := map[string]bool{} // traces already accumulated, by their blocks
	// seenOut are the outbound entry lists traced (common and specific,
	// by their keys): Dataplanes mostly call the same services through
	// the same entries, which are traced once without listing blocks.
	seenOut := map[[2]entriesKey]bool{}
	selected := make([]bool, len(t.policies)) // by policy index
	add := func(defaults, overrides []*contribution) {
		key := blocksKey(defaults, overrides)
		if seen[key] {
			return
		}
		seen[key] = true
		accumulate(t, aggs, seqs, statusTrace(s.mergerOf(t), defaults, overrides))
	}
	for _, raw := range s.dpList {
		dp := s.effective(raw)
		matched := s.matchedPolicies(t, dp)
		for i, m := range matched {
			selected[i] = selected[i] || m
		}
		if t.desc.ProxyWide {
			add(proxyBlocks(t, matched))
		}
		if t.desc.To && len(dp.outbounds) > 0 && len(t.to) > 0 {
			oe := s.outboundEntriesOf(t, dp, matched)
			common, specific, routed := oe.common, oe.specific, oe.routed
			commonKey := s.defs.entriesKey(common, nil)
			for i := range dp.outbounds {
				key := [2]entriesKey{commonKey}
				if w := oe.whole[i]; w != nil {
					key[1] = w.key
				} else {
					key[1] = s.defs.entriesKey(specific[i], nil)
				}
				if !seenOut[key] {
					seenOut[key] = true
					es := mergeByPos(common, specific[i])
					add(defaultsOf(es), overridesOf(es))
				}
				for _, res := range routed[i].entries {
					rs := mergeByPos(common, res)
					add(defaultsOf(rs), overridesOf(rs))
				}
			}
		}
		if t.desc.From {
			for _, in := range dp.inbounds {
				s.aggregateInbound(t, dp, in, add)
			}
		}
	}
	for i := range aggs {
		aggs[i].selected = selected[i]
	}
	return aggs
}

// aggregateInbound traces one client per from-rule cell: the blocks of the
// entries that select that client.
func (s *MeshSnapshot) aggregateInbound(t *typeIndex, dp *dataplane, in *inbound, add func(d, o []*contribution)) {
	es := s.inboundEntries(t, dp, in)
	if len(es) == 0 {
		return
	}
	fr := s.fromRules(t, es)
	for _, leaf := range fr.leaves {
		client := representative(leaf.cons)
		var matching []*entry
		for _, e := range es {
			if clientMatches(e, client) {
				matching = append(matching, e)
			}
		}
		add(defaultsOf(matching), overridesOf(matching))
	}
}

// representative is a client inside a cell: the positive tags; a key with
// only negated values is left out (a client without it matches none).
func representative(cons []keyCons) map[string]string {
	client := map[string]string{}
	for _, c := range cons {
		if c.hasPos {
			client[c.key] = c.pos
		}
	}
	return client
}

// blocksKey identifies a list of blocks by the blocks' addresses: traces
// of targets with the same blocks are accumulated once. (Formatting every
// address with %p was an eighth of aggregating at 100,000 policies.)
func blocksKey(defaults, overrides []*contribution) string {
	buf := make([]byte, 0, 5*(len(defaults)+len(overrides))+1)
	for _, c := range defaults {
		buf = binary.AppendUvarint(buf, uint64(uintptr(unsafe.Pointer(c))))
	}
	buf = append(buf, 0) // uvarint(0): no block's address, so the key parses one way
	for _, c := range overrides {
		buf = binary.AppendUvarint(buf, uint64(uintptr(unsafe.Pointer(c))))
	}
	return string(buf)
}

// accumulate adds a trace's outcomes to aggs, t's by policy index.
func accumulate(t *typeIndex, aggs []policyAgg, seqs *lossSeq, tr *trace) {
	for _, bt := range tr.blocks {
		p := bt.c.pol
		if p == nil || bt.fate == fateNotReached || p.idx >= len(aggs) || t.policies[p.idx] != p {
			continue
		}
		a := &aggs[p.idx]
		a.reached = true
		switch bt.fate {
		case fateWhenFalse, fateWhenFailed:
			if a.whenFalse == nil {
				a.whenFalse = map[string]bool{}
			}
			a.whenFalse[bt.c.where()] = true
			continue
		case fateAtomicLost:
			for _, w := range winnersOf(tr, bt.c) {
				a.lose(seqs, w, lossAt{where: bt.c.where()})
			}
			continue
		}
		for i := range bt.fieldCount() {
			f := bt.fieldAt(i)
			a.field(seqs, bt.c, f.path, f.won, f.by)
		}
		for _, u := range bt.unsets {
			if u.ignored {
				if a.ignored == nil {
					a.ignored = map[string]bool{}
				}
				a.ignored["unset "+u.path+" ignored: "+u.by.name()+" overrides it"] = true
			}
		}
	}
}

// field adds the fate of one field of block c (at path) to a.
func (a *policyAgg) field(seqs *lossSeq, c *contribution, path string, won bool, by *contribution) {
	switch {
	case won:
		a.won++
	case by != nil && by.pol == c.pol:
		// Lost to another entry of the same policy: the author's own
		// choice, neither enforced nor overridden by someone else.
	case by != nil:
		a.lose(seqs, policyName(by.pol), lossAt{c.where(), path})
	}
}

// winnersOf names the policies whose blocks are in the final conf, for a
// block discarded as a whole.
func winnersOf(tr *trace, loser *contribution) []string {
	var out []string
	for _, c := range tr.final.contributions() {
		if c.pol != loser.pol {
			out = append(out, policyName(c.pol))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (s *MeshSnapshot) statusOf(p *policy, a *policyAgg) *PolicyStatus {
	if !a.selected {
		return &PolicyStatus{Conditions: []Condition{{Type: CondAccepted, Status: conditionFalse, Reason: ReasonTargetNotFound,
			Message: fmt.Sprintf("Policy target %s was not found: it selects no Dataplane in zone %q", describeRef(*p.top), s.zone)}}}
	}
	if !a.reached {
		return &PolicyStatus{Conditions: []Condition{{Type: CondAccepted, Status: conditionFalse, Reason: ReasonTargetNotFound,
			Message: "Policy target was not found: no inbound, outbound or route of the Dataplanes it selects matches its entries"}}}
	}
	accepted := Condition{Type: CondAccepted, Status: conditionTrue, Reason: ReasonAccepted, Message: "Policy has been accepted"}
	return &PolicyStatus{Conditions: []Condition{accepted, enforced(a)}}
}

func enforced(a *policyAgg) Condition {
	var lost []string
	var winners []string
	losses := slices.Clone(a.lost) // shared (lossSeq): sorted as a copy
	slices.SortFunc(losses, func(x, y loss) int { return strings.Compare(x.winner, y.winner) })
	for from := 0; from < len(losses); {
		w := losses[from].winner
		to := from
		var paths []string
		for ; to < len(losses) && losses[to].winner == w; to++ {
			paths = append(paths, losses[to].at.String())
		}
		slices.Sort(paths)
		winners = append(winners, w)
		lost = append(lost, fmt.Sprintf("%s overridden by %s", limitList(paths), w))
		from = to
	}
	lost = append(lost, sortedKeys(a.ignored)...)
	switch {
	case len(lost) == 0:
		msg := "Policy has been successfully enforced"
		if a.won == 0 && len(a.whenFalse) > 0 {
			msg += "; its when conditions were false wherever it applies (" + limitList(sortedKeys(a.whenFalse)) + "), so it changed nothing"
		}
		return Condition{Type: CondEnforced, Status: conditionTrue, Reason: ReasonEnforced, Message: msg}
	case a.won > 0:
		return Condition{Type: CondEnforced, Status: conditionTrue, Reason: ReasonPartially,
			Message: "Policy has been partially enforced: " + strings.Join(limit(lost), "; ")}
	case len(winners) == 0:
		// Nothing of it is in effect and only unsets were ignored.
		return Condition{Type: CondEnforced, Status: conditionTrue, Reason: ReasonPartially,
			Message: "Policy has been partially enforced: " + strings.Join(limit(lost), "; ")}
	default:
		return Condition{Type: CondEnforced, Status: conditionFalse, Reason: ReasonOverridden,
			Message: "Policy has been overridden by " + limitList(winners) + ": " + strings.Join(limit(lost), "; ")}
	}
}

func limit(items []string) []string {
	if len(items) <= maxStatusMessageItems {
		return items
	}
	return append(items[:maxStatusMessageItems:maxStatusMessageItems], fmt.Sprintf("and %d more", len(items)-maxStatusMessageItems))
}

func limitList(items []string) string { return strings.Join(limit(items), ", ") }

func describeRef(ref targetRef) string {
	switch {
	case ref.Name != "":
		return ref.Kind + " " + qualified(ref.Namespace, ref.Name)
	case len(ref.Tags) > 0:
		var tags []string
		for _, k := range sortedKeys(ref.Tags) {
			tags = append(tags, k+"="+ref.Tags[k])
		}
		return ref.Kind + " {" + strings.Join(tags, ", ") + "}"
	}
	return ref.Kind
}

// legacyStatuses: a legacy policy is enforced where it is the one selected
// , else it lost to a more specific or newer one.
func (s *MeshSnapshot) legacyStatuses(t *typeIndex, byName map[nsName]*PolicyStatus) {
	for _, p := range t.policies {
		applies := false
		for _, dp := range s.dpList {
			if s.applies(t, p, s.effective(dp)) {
				applies = true
				break
			}
		}
		accepted := Condition{Type: CondAccepted, Status: conditionTrue, Reason: ReasonAccepted, Message: "Policy has been accepted"}
		enf := Condition{Type: CondEnforced, Status: conditionTrue, Reason: ReasonEnforced, Message: "Policy has been successfully enforced"}
		if !applies {
			enf = Condition{Type: CondEnforced, Status: conditionFalse, Reason: ReasonOverridden,
				Message: "Policy has been overridden: a more specific (or, at equal rank, newer) policy is selected wherever it matches, or it matches nothing"}
		}
		byName[nsName{s.normNS(p.resNS), p.resName}] = &PolicyStatus{Conditions: []Condition{accepted, enf}}
	}
}

// GlobalPolicyStatus is the status of one of the global's policies in this
// zone, keyed by its name on the global (the display name of the copy).
type GlobalPolicyStatus struct {
	Type, Mesh, Name string
	Conditions       []Condition
	// LocalName and LocalNamespace are the zone's own name and namespace
	// ("" for the system namespace) of the policy Name names on the
	// global, for what the zone adds to the report (a data plane's
	// Programmed condition).
	LocalName, LocalNamespace string
}

// GlobalPolicyStatuses lists the status of every global-origin policy of
// the snapshot (what a zone reports to the global): by type name, then in
// the order the engine applies the type's policies (a snapshot's order,
// the same for the same policies; sorting by name was a third of making
// the list at 100,000 policies, and the global keys statuses by name).
func (s *MeshSnapshot) GlobalPolicyStatuses() []GlobalPolicyStatus {
	all := s.statuses()
	var out []GlobalPolicyStatus
	for _, name := range s.typeNames {
		t := s.types[name]
		ordered := all.ordered[name]
		for i, p := range t.policies {
			if p.origin != originGlobal || ordered[i] == nil {
				continue
			}
			if out == nil {
				out = make([]GlobalPolicyStatus, 0, len(t.policies)-i)
			}
			out = append(out, GlobalPolicyStatus{Type: name, Mesh: s.mesh, Name: p.display, Conditions: ordered[i].Conditions,
				LocalName: p.resName, LocalNamespace: s.normNS(p.resNS)})
		}
	}
	return out
}
