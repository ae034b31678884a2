package policy

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// typeView is everything one policy type gives one Dataplane; `_rules`,
// `_config` and `_evaluate` are renderings of it.
type typeView struct {
	t        *typeIndex
	warnings []string
	proxy    *Applied
	inbound  [][]Rule          // by inbound index; nil = no rules
	from     []*fromResult     // by inbound index, for the RBAC filter; nil = no rules
	outbound []*OutboundPolicy // by outbound index; nil = nothing
}

func (v *typeView) empty() bool {
	if len(v.warnings) > 0 || v.proxy != nil {
		return false
	}
	for _, r := range v.inbound {
		if len(r) > 0 {
			return false
		}
	}
	for _, o := range v.outbound {
		if o != nil {
			return false
		}
	}
	return true
}

// view computes what t gives dp. With lazy, origins are left for the
// `_rules` encoder to write from the blocks (lazyOrigin).
func (s *MeshSnapshot) view(t *typeIndex, dp *dataplane, lazy bool) *typeView {
	v := &typeView{t: t, warnings: append([]string{}, t.warnings...)}
	if k := legacyKindOf(t.desc); k != notLegacy {
		s.legacyView(v, k, dp)
		return v
	}
	matched := s.matchedPolicies(t, dp)
	for _, i := range t.summary().warned {
		if matched[i] {
			v.warnings = append(v.warnings, t.policies[i].warnings...)
		}
	}
	if t.desc.ProxyWide {
		var warns []string
		v.proxy, warns = proxyView(s.mergerOf(t), t, matched, lazy)
		v.warnings = append(v.warnings, warns...)
	}
	if t.desc.To {
		var warns []string
		v.outbound, warns = s.toView(t, dp, matched, lazy)
		v.warnings = append(v.warnings, warns...)
	}
	if t.desc.From {
		s.fromView(v, dp, lazy)
	}
	return v
}

// proxyView merges the proxy-wide blocks of the matched policies: defaults
// in policy order, then overrides (docs/policy.md#defaults-and-overrides).
func proxyView(m merger, t *typeIndex, matched []bool, lazy bool) (*Applied, []string) {
	defaults, overrides := proxyBlocks(t, matched)
	st := m.overrides(m.fold(defaults), overrides)
	if st.empty() {
		return nil, st.warnings()
	}
	ap := &Applied{Conf: st.conf()}
	if blocks := st.appliedBlocks(defaults); lazy {
		ap.lazy = lazyOrigin{set: true, blocks: blocks}
	} else {
		ap.Origin = originsOf(blocks)
	}
	return ap, st.warnings()
}

// proxyBlocks lists the proxy-wide defaults of the matched policies in apply
// order and their overrides in the overrides pass's order.
func proxyBlocks(t *typeIndex, matched []bool) (defaults, overrides []*contribution) {
	for _, p := range t.policies {
		if !matched[p.idx] {
			continue
		}
		if p.proxy != nil {
			defaults = append(defaults, p.proxy)
		}
		if p.proxyOver != nil {
			overrides = append(overrides, p.proxyOver)
		}
	}
	sortByOrder(overrides)
	return defaults, overrides
}

// toView computes every outbound's merged conf. Entries of kind Mesh apply
// to all outbounds; the others are distributed to the outbounds they
// select. Outbounds with the same specific entries share one fold, which
// keeps a proxy with 1,000 outbounds cheap.
func (s *MeshSnapshot) toView(t *typeIndex, dp *dataplane, matched []bool, lazy bool) ([]*OutboundPolicy, []string) {
	n := len(dp.outbounds)
	if n == 0 || len(t.to) == 0 {
		return nil, nil
	}
	oe := s.outboundEntriesOf(t, dp, matched)
	common, specific, routed := oe.common, oe.specific, oe.routed
	key := oe.commonKey
	if !oe.commonKeyed {
		key = s.defs.entriesKey(common, nil)
	}
	memoKey := commonKey{t.desc.Name, key}
	prev := s.prevOutboundMemo(memoKey)
	memo := s.outboundMemo(memoKey, prev)
	out := make([]*OutboundPolicy, n)
	rendered := make(map[*outboundResult]*OutboundPolicy, n)
	var warns []string
	for i := range n {
		var key entriesKey
		if w := oe.whole[i]; w != nil && len(routed[i].routes) == 0 {
			key = w.key
		} else {
			key = s.defs.entriesKey(specific[i], &routed[i])
		}
		r := s.outboundResultOf(memo, prev, key, func() *outboundResult {
			return outboundPolicy(s.mergerOf(t), common, specific[i], routed[i])
		})
		op, ok := rendered[r]
		if !ok {
			op = r.render(lazy)
			rendered[r] = op
		}
		out[i] = op
		warns = append(warns, r.warns...)
	}
	slices.Sort(warns)
	return out, slices.Compact(warns)
}

// outboundResultOf is the memoized result of key in memo, else prev's
// (the previous snapshot's memo for the same Mesh entries, or nil) when it
// may be carried, else compute's.
func (s *MeshSnapshot) outboundResultOf(memo, prev *resultMemo, key entriesKey, compute func() *outboundResult) *outboundResult {
	if r, ok := memo.load(key); ok {
		return r
	}
	if prev != nil {
		if r, ok := prev.load(key); ok && r.carry {
			return memo.loadOrStore(key, r)
		}
	}
	r := compute()
	r.id = s.defs.nextUID()
	return memo.loadOrStore(key, r)
}

// resultMemo holds the outbound results of one type computed with one
// set of Mesh entries, by outbound signature. A proxy's first view on a
// new snapshot looks up each of its outbounds here and in the previous
// snapshot's memo: a map under a read lock does that without the
// allocations a sync.Map's boxed keys and new entries cost (a fifth of a
// proxy's _config after one change, at 100 outbounds).
type resultMemo struct {
	mu sync.RWMutex
	m  map[entriesKey]*outboundResult
}

// newResultMemo makes a memo the size of prev (the previous snapshot's
// for the same entries, or nil): after one change, about as many results.
func newResultMemo(prev *resultMemo) *resultMemo {
	n := 0
	if prev != nil {
		prev.mu.RLock()
		n = len(prev.m)
		prev.mu.RUnlock()
	}
	return &resultMemo{m: make(map[entriesKey]*outboundResult, n)}
}

func (m *resultMemo) load(key entriesKey) (*outboundResult, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.m[key]
	return r, ok
}

// loadOrStore returns the result held for key, storing r when there is
// none: concurrent views computing the same key agree on one result (its
// id is the one the fragments of a rendering are keyed by).
func (m *resultMemo) loadOrStore(key entriesKey, r *outboundResult) *outboundResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	if held, ok := m.m[key]; ok {
		return held
	}
	m.m[key] = r
	return r
}

// outboundResult is a memoized outbound computation. It keeps the blocks
// of its origins, not the origins: a proxy matched by 100,000 policies has
// as many origins per target, 13 MB as Origin values, which a memo kept for
// the snapshot's life. They are rendered per query (render), once per
// distinct result.
type outboundResult struct {
	has    bool // something applies
	conf   json.RawMessage
	blocks []*contribution
	routes []routeResult
	warns  []string
	// carry says the next snapshot may reuse the result: it depends on
	// its entries only (no `when` expression, which spends this
	// snapshot's budget).
	carry bool
	// id identifies the result (OutboundPolicy.ResultID).
	id uint64

	// origins are the origins of blocks and of each route's, written on
	// first use and shared by every result rendered from it.
	originsOnce  sync.Once
	origins      []Origin
	routeOrigins [][]Origin
}

// originLists writes the result's origins once.
func (r *outboundResult) originLists() ([]Origin, [][]Origin) {
	r.originsOnce.Do(func() {
		r.origins = originsOf(r.blocks)
		for _, rr := range r.routes {
			r.routeOrigins = append(r.routeOrigins, originsOf(rr.blocks))
		}
	})
	return r.origins, r.routeOrigins
}

// routeResult is the conf of one route's traffic on an outbound.
type routeResult struct {
	route  *policy
	conf   json.RawMessage
	blocks []*contribution
}

// render is the result as a view shows it, with origins or (lazy) their
// blocks; nil when nothing applies.
func (r *outboundResult) render(lazy bool) *OutboundPolicy {
	if !r.has {
		return nil
	}
	op := &OutboundPolicy{Conf: r.conf, result: r.id}
	var routeOrigins [][]Origin
	if lazy {
		op.lazy = lazyOrigin{set: true, blocks: r.blocks}
	} else {
		op.Origin, routeOrigins = r.originLists()
	}
	for i, rr := range r.routes {
		rc := RouteConf{Route: rr.route.meta(), Conf: rr.conf}
		if lazy {
			rc.lazy = lazyOrigin{set: true, blocks: rr.blocks}
		} else {
			rc.Origin = routeOrigins[i]
		}
		op.Routes = append(op.Routes, rc)
	}
	return op
}

// outboundEntries distributes the to-entries of the matched policies: Mesh
// entries apply to every outbound (common), the others to the outbounds
// they select (specific, by outbound index), and entries naming routes to
// the outbounds those routes send traffic to (routed), as do the entries of
// a policy whose top-level targetRef is a route: such a policy shapes that
// route's traffic only (docs/policy.md#routes).
func (s *MeshSnapshot) outboundEntries(t *typeIndex, dp *dataplane, matched []bool) ([]*entry, [][]*entry, []routeEntries) {
	oe := s.outboundEntriesOf(t, dp, matched)
	return oe.common, oe.specific, oe.routed
}

// outboundEntryLists is outboundEntries' result; whole[i] is set when
// specific[i] is exactly a service's entry list of the index (shared: never
// written), whose key is then known.
type outboundEntryLists struct {
	common   []*entry
	specific [][]*entry
	routed   []routeEntries
	whole    []*serviceEntries
	// commonKey is common's entriesKey when commonKeyed (common is then
	// the index's list for views matching every policy: shared, never
	// written).
	commonKey   entriesKey
	commonKeyed bool
}

func (s *MeshSnapshot) outboundEntriesOf(t *typeIndex, dp *dataplane, matched []bool) outboundEntryLists {
	n := len(dp.outbounds)
	oe := outboundEntryLists{specific: make([][]*entry, n), routed: make([]routeEntries, n), whole: make([]*serviceEntries, n)}
	specific := oe.specific
	idx := t.toEntryIndex()
	everyPolicy := t.matchesEvery(matched)
	if everyPolicy {
		// The Mesh-wide entries and their key are the index's.
		ev := idx.everyPolicyView(s.defs)
		oe.common, oe.commonKey, oe.commonKeyed = ev.common, ev.key, true
		if ev.rest {
			s.walkOther(idx, matched, dp, &oe, false)
		}
	} else {
		// Sized for every entry that may be in it (at 100,000 Mesh-wide
		// entries, growing it made four times its size).
		oe.common = make([]*entry, 0, idx.all)
		s.walkOther(idx, matched, dp, &oe, true)
	}
	// The entries naming one service, the common shape, by outbound: no
	// walk over every entry of the type.
	for i, o := range dp.outbounds {
		se := idx.byService[o.service]
		if se == nil {
			continue
		}
		if se.plain && (everyPolicy || se.allMatched(matched)) {
			// Every entry of the list applies: the list itself.
			whole := se.wholeList(s.defs)
			if len(specific[i]) == 0 {
				specific[i], oe.whole[i] = whole, se
			} else {
				specific[i] = mergeByPos(specific[i], whole)
			}
			continue
		}
		mine := make([]*entry, 0, len(se.list))
		for j := range se.list {
			if ie := &se.list[j]; matched[ie.pol] && ie.matches(o) {
				mine = append(mine, ie.e)
			}
		}
		specific[i] = mergeByPos(specific[i], mine)
	}
	return oe
}

// walkOther distributes the index's other entries of matched policies
// (outboundEntries): to oe.common when common is set (else the caller has
// those), to the outbounds and routes they select.
func (s *MeshSnapshot) walkOther(idx *toIndex, matched []bool, dp *dataplane, oe *outboundEntryLists, common bool) {
	for j := range idx.other {
		o := &idx.other[j]
		if !matched[o.pol] || (o.all && !o.route && !common) {
			continue
		}
		e := o.e
		if o.route {
			p := e.pol
			for _, r := range s.lookupRoutes(p.top, p.ownNS) {
				s.addRouteEntry(oe.routed, r, e, dp)
			}
			continue
		}
		if o.all {
			oe.common = append(oe.common, e)
			continue
		}
		for _, i := range e.target.outbounds(dp) {
			oe.specific[i] = append(oe.specific[i], e)
		}
		for _, r := range e.target.routes {
			s.addRouteEntry(oe.routed, r, e, dp)
		}
	}
}

// everyPolicyView is what a view matching every policy of the type takes
// from the index's other entries without walking them: the entries for
// every outbound, in order, and their entriesKey. A zone's policies mostly
// target the Mesh, so nearly every proxy's view is such a view: at
// 100,000 Mesh-wide entries, gathering and keying them again took each
// proxy's view about 14 ms.
type everyPolicyView struct {
	common []*entry // shared: never written
	key    entriesKey
	// rest: other holds entries that are not for every outbound (or are
	// a route's), which the view still walks.
	rest bool
}

// everyPolicyView is idx's everyPolicyView, made on first use (racing
// makers make the same).
func (idx *toIndex) everyPolicyView(defs *defTable) *everyPolicyView {
	if ev := idx.every.Load(); ev != nil {
		return ev
	}
	ev := &everyPolicyView{common: make([]*entry, 0, idx.all)}
	for j := range idx.other {
		if o := &idx.other[j]; o.all && !o.route {
			ev.common = append(ev.common, o.e)
		} else {
			ev.rest = true
		}
	}
	ev.key = defs.entriesKey(ev.common, nil)
	idx.every.Store(ev)
	return ev
}

// toIndex splits a type's to-entries: those whose target is exactly one
// service match (by that service, in position order) and the others
// (in position order), which outboundEntries walks.
type toIndex struct {
	byService map[string]*serviceEntries
	other     []otherEntry
	all       int // the entries of other whose target is every outbound
	// every is made from other on first use; an index seeded with the
	// previous one's other entries takes it too.
	every atomic.Pointer[everyPolicyView]
}

// otherEntry is an entry of toIndex.other with what outboundEntries reads
// of it before it takes it. A zone's 100,000 Mesh-wide entries and their
// policies lie wherever its heap put them: reading each entry and its
// policy to filter them was two cache misses an entry, most of a proxy's
// first view after a change at that size. This array is read in order.
type otherEntry struct {
	e     *entry
	pol   int32 // e.pol.idx
	all   bool  // e.target.all
	route bool  // e's policy's top-level targetRef is a MeshHTTPRoute
}

func otherEntryOf(e *entry) otherEntry {
	return otherEntry{e: e, pol: int32(e.pol.idx), all: e.target.all, route: e.pol.top.Kind == resource.KindMeshHTTPRoute}
}

// countAll sets idx.all from idx.other.
func (idx *toIndex) countAll() {
	idx.all = 0
	for j := range idx.other {
		if idx.other[j].all {
			idx.all++
		}
	}
}

// serviceEntries are the entries of one service in a toIndex.
type serviceEntries struct {
	list []indexedEntry
	// plain: no entry narrows the service by port, namespace or zone, so
	// each applies to every outbound of the service its policy matches.
	plain bool

	// entries are list's entries and key their entriesKey, for the
	// outbounds every entry applies to: made on first use.
	once    sync.Once
	entries []*entry
	key     entriesKey
}

func (se *serviceEntries) allMatched(matched []bool) bool {
	for j := range se.list {
		if !matched[se.list[j].pol] {
			return false
		}
	}
	return true
}

// wholeList is the list's entries (never to be written) and sets their key.
func (se *serviceEntries) wholeList(defs *defTable) []*entry {
	se.once.Do(func() {
		se.entries = make([]*entry, len(se.list))
		for j := range se.list {
			se.entries[j] = se.list[j].e
		}
		se.key = defs.entriesKey(se.entries, nil)
	})
	return se.entries
}

// indexedEntry is an entry with what outboundEntries reads of it, in one
// array: its policy's index and its service match (less the service,
// the index's key).
type indexedEntry struct {
	e        *entry
	pol      int32
	port     int32
	ns, zone string
}

func (ie *indexedEntry) matches(o *outbound) bool {
	return svcMatch{service: o.service, ns: ie.ns, zone: ie.zone, port: int(ie.port)}.matches(o)
}

// toEntryIndex is t's toIndex, made on first use: a type index is never
// written once its snapshot is published.
func (t *typeIndex) toEntryIndex() *toIndex {
	t.toOnce.Do(func() {
		if t.toSeed != nil {
			t.toIdx.Store(t.toSeed.index())
			t.toSeed = nil // frees the previous index
			return
		}
		t.toIdx.Store(buildToIndex(t.to))
	})
	return t.toIdx.Load()
}

// indexedOne says whether e's target is exactly one service match (so a
// toIndex keeps it by service).
func indexedOne(e *entry) bool {
	tg := e.target
	return e.pol.top.Kind != resource.KindMeshHTTPRoute && tg != nil && !tg.all && len(tg.services) == 1 &&
		len(tg.backends) == 0 && len(tg.routes) == 0
}

// buildToIndex indexes a type's to-entries (in position order).
func buildToIndex(to []*entry) *toIndex {
	// Counted first, so that each list is allocated once.
	counts := map[string]int{}
	for _, e := range to {
		if indexedOne(e) {
			counts[e.target.services[0].service]++
		}
	}
	idx := &toIndex{byService: make(map[string]*serviceEntries, len(counts))}
	for _, e := range to {
		if !indexedOne(e) {
			idx.other = append(idx.other, otherEntryOf(e))
			continue
		}
		svc := e.target.services[0].service
		se := idx.byService[svc]
		if se == nil {
			se = &serviceEntries{list: make([]indexedEntry, 0, counts[svc]), plain: true}
			idx.byService[svc] = se
		}
		se.add(e)
	}
	idx.countAll()
	return idx
}

// add appends e (its target one service match) to the list.
func (se *serviceEntries) add(e *entry) {
	se.list = append(se.list, indexedEntry{})
	se.set(len(se.list)-1, e)
}

// set indexes e (its target one service match) at i.
func (se *serviceEntries) set(i int, e *entry) {
	m := &e.target.services[0]
	se.list[i] = indexedEntry{e: e, pol: int32(e.pol.idx), port: int32(m.port), ns: m.ns, zone: m.zone}
	se.plain = se.plain && m.port == 0 && m.ns == "" && m.zone == ""
}

// toSeed makes a spliced type's toIndex from the index of the type it was
// spliced from: after one policy changes among 10,000, the lists of the
// services its entries name are made again, the others kept (their
// policies kept their numbers, so their entries are the same).
type toSeed struct {
	prev *toIndex
	// gone are the policies whose entries left: removed, and moved (they
	// came back as clones, among added).
	gone  map[*policy]bool
	added []*entry
}

// index is the seeded index; it equals buildToIndex of the type's entries
// (TestToIndexCarried).
func (sd *toSeed) index() *toIndex {
	touched := map[string]bool{}
	otherTouched := false
	note := func(e *entry) {
		if indexedOne(e) {
			touched[e.target.services[0].service] = true
		} else {
			otherTouched = true
		}
	}
	for p := range sd.gone {
		for _, e := range p.to {
			note(e)
		}
	}
	for _, e := range sd.added {
		note(e)
	}
	idx := &toIndex{byService: maps.Clone(sd.prev.byService), other: sd.prev.other, all: sd.prev.all}
	// Kept entries are known by their policies' numbers, which they kept.
	gone := make(map[int32]bool, len(sd.gone))
	for p := range sd.gone {
		gone[int32(p.idx)] = true
	}
	for svc := range touched {
		if se := sd.serviceList(svc, gone); se != nil {
			idx.byService[svc] = se
		} else {
			delete(idx.byService, svc)
		}
	}
	if otherTouched {
		idx.other = sd.otherList(gone)
		idx.countAll()
	} else {
		idx.every.Store(sd.prev.every.Load())
	}
	return idx
}

// otherList is the seeded index's other entries: the previous ones but
// those of policies gone (known by their numbers, without reading the
// entries), with the added ones placed by position.
func (sd *toSeed) otherList(gone map[int32]bool) []otherEntry {
	var add []*entry
	for _, e := range sd.added {
		if !indexedOne(e) {
			add = append(add, e)
		}
	}
	slices.SortFunc(add, func(a, b *entry) int { return a.pos - b.pos })
	prev := sd.prev.other
	out := make([]otherEntry, 0, len(prev)+len(add))
	keep := func(os []otherEntry) {
		for j := range os {
			if o := &os[j]; !gone[o.pol] {
				out = append(out, *o)
			}
		}
	}
	// Each added entry goes before the first previous one after it (the
	// previous list is in position order, and kept entries keep their
	// positions): entries are read only where the search looks.
	from := 0
	for _, e := range add {
		at := from + sort.Search(len(prev)-from, func(i int) bool { return prev[from+i].e.pos > e.pos })
		keep(prev[from:at])
		out = append(out, otherEntryOf(e))
		from = at
	}
	keep(prev[from:])
	return out
}

// serviceList is svc's list of the seeded index, nil when empty: the
// previous list's entries but those of policies gone (numbered as in the
// previous index), with the added entries for svc placed by position.
// Kept entries are copied as they were indexed, not indexed again (which
// read each one's target: a miss per entry, a quarter of a proxy's first
// view after one change among 10,000).
func (sd *toSeed) serviceList(svc string, gone map[int32]bool) *serviceEntries {
	var add []*entry
	for _, e := range sd.added {
		if indexedOne(e) && e.target.services[0].service == svc {
			add = append(add, e)
		}
	}
	var old []indexedEntry
	if prev := sd.prev.byService[svc]; prev != nil {
		old = prev.list
	}
	se := &serviceEntries{list: make([]indexedEntry, 0, len(old)+len(add)), plain: true}
	for _, ie := range old {
		if !gone[ie.pol] {
			se.list = append(se.list, ie)
			se.plain = se.plain && ie.port == 0 && ie.ns == "" && ie.zone == ""
		}
	}
	slices.SortFunc(add, func(a, b *entry) int { return a.pos - b.pos })
	for _, e := range add {
		at, _ := slices.BinarySearchFunc(se.list, e.pos, func(ie indexedEntry, pos int) int { return ie.e.pos - pos })
		se.list = slices.Insert(se.list, at, indexedEntry{})
		se.set(at, e)
	}
	if len(se.list) == 0 {
		return nil
	}
	return se
}

// outboundMemo returns the memo of outbound confs computed with the Mesh
// entries identified by key (type and stable signature); prev is the
// previous snapshot's (prevOutboundMemo).
func (s *MeshSnapshot) outboundMemo(key commonKey, prev *resultMemo) *resultMemo {
	if v, ok := s.toMemo.Load(key); ok {
		return v.(*resultMemo)
	}
	v, _ := s.toMemo.LoadOrStore(key, newResultMemo(prev))
	return v.(*resultMemo)
}

// prevOutboundMemo is the previous snapshot's memo for key, or nil.
func (s *MeshSnapshot) prevOutboundMemo(key commonKey) *resultMemo {
	if s.prevToMemo == nil {
		return nil
	}
	if v, ok := s.prevToMemo.Load(key); ok {
		return v.(*resultMemo)
	}
	return nil
}

// routeEntries are the entries naming routes attached to one outbound,
// grouped by route in first-seen (apply) order.
type routeEntries struct {
	routes  []*policy
	entries [][]*entry
}

func (r *routeEntries) add(route *policy, e *entry) {
	for i, have := range r.routes {
		if have == route {
			r.entries[i] = append(r.entries[i], e)
			return
		}
	}
	r.routes = append(r.routes, route)
	r.entries = append(r.entries, []*entry{e})
}

// addRouteEntry attaches e to the outbounds route r sends traffic to, when r
// applies to dp at all.
func (s *MeshSnapshot) addRouteEntry(routed []routeEntries, r *policy, e *entry, dp *dataplane) {
	if !s.selectsDP(r, dp) {
		return
	}
	seen := map[int]bool{}
	for _, re := range r.to {
		if re.target == nil {
			continue
		}
		for _, i := range re.target.outbounds(dp) {
			if !seen[i] {
				seen[i] = true
				routed[i].add(r, e)
			}
		}
	}
}

// outboundPolicy computes one outbound's conf from the Mesh entries
// (common) and those selecting the outbound (specific), and the conf of
// each route's traffic from the Mesh entries and the route's own: as Kuma
// computes a route's rules, entries naming the service do not reach its
// routes (docs/policy.md#routes).
func outboundPolicy(m merger, common, specific []*entry, routed routeEntries) *outboundResult {
	list := mergeByPos(common, specific)
	st := foldEntries(m, list)
	res := &outboundResult{warns: st.warnings()}
	if !st.empty() {
		res.conf, res.blocks = st.conf(), st.appliedBlocks(defaultsOf(list))
	}
	for i, route := range routed.routes {
		rl := mergeByPos(common, routed.entries[i])
		rst := foldEntries(m, rl)
		res.warns = append(res.warns, rst.warnings()...)
		if !rst.empty() {
			res.routes = append(res.routes, routeResult{route: route, conf: rst.conf(), blocks: rst.appliedBlocks(defaultsOf(rl))})
		}
	}
	res.has = res.conf != nil || len(res.routes) > 0
	res.carry = !anyWhen(common) && !anyWhen(specific)
	for _, es := range routed.entries {
		res.carry = res.carry && !anyWhen(es)
	}
	return res
}

// anyWhen says some entry's block has a `when` expression.
func anyWhen(es []*entry) bool {
	for _, e := range es {
		if e.c.when != nil || (e.o != nil && e.o.when != nil) {
			return true
		}
	}
	return false
}

// foldEntries runs both passes of docs/policy.md#defaults-and-overrides over entries given in apply
// order: their defaults from the most specific down, then their overrides
// in the overrides pass's order.
func foldEntries(m merger, es []*entry) foldState {
	var st foldState
	for i := len(es) - 1; i >= 0; i-- {
		st, _ = m.fill(st, es[i].c)
	}
	return m.overrides(st, overridesOf(es))
}

// overridesOf lists the override blocks of es in the overrides pass's order.
func overridesOf(es []*entry) []*contribution {
	var os []*contribution
	for _, e := range es {
		if e.o != nil {
			os = append(os, e.o)
		}
	}
	sortByOrder(os)
	return os
}

// mergeByPos merges two entry lists sorted by position.
func mergeByPos(a, b []*entry) []*entry {
	if len(b) == 0 {
		return a
	}
	if len(a) == 0 {
		return b
	}
	out := make([]*entry, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i].pos <= b[j].pos {
			out = append(out, a[i])
			i++
		} else {
			out = append(out, b[j])
			j++
		}
	}
	out = append(out, a[i:]...)
	return append(out, b[j:]...)
}

// sigOf identifies an entry list by positions (entries of one type).
func sigOf(es []*entry) string {
	if len(es) == 0 {
		return ""
	}
	buf := make([]byte, 0, 2*len(es))
	for _, e := range es {
		buf = binary.AppendUvarint(buf, uint64(e.pos))
	}
	return string(buf)
}

// fromView computes the rules of every inbound. Inbounds selected by the
// same entries share one computation, across Dataplanes too.
func (s *MeshSnapshot) fromView(v *typeView, dp *dataplane, lazy bool) {
	t := v.t
	if len(t.from) == 0 || len(dp.inbounds) == 0 {
		return
	}
	v.inbound = make([][]Rule, len(dp.inbounds))
	v.from = make([]*fromResult, len(dp.inbounds))
	for i, in := range dp.inbounds {
		es := s.inboundEntries(t, dp, in)
		if len(es) == 0 {
			continue
		}
		fr := s.fromRules(t, es)
		if fr.err != nil {
			v.warnings = append(v.warnings, fmt.Sprintf("%s: inbound port %d: %v; its rules are omitted", t.desc.Name, in.port, fr.err))
		}
		v.warnings = append(v.warnings, fr.warns...)
		v.inbound[i], v.from[i] = fr.rendered(lazy), fr
	}
}

func (s *MeshSnapshot) fromRules(t *typeIndex, es []*entry) *fromResult {
	key := t.desc.Name + "\x00" + sigOf(es)
	if v, ok := s.fromMemo.Load(key); ok {
		return v.(*fromResult)
	}
	fr := &fromResult{entries: es}
	if b, err := buildFromRules(s.mergerOf(t), es, maxRulesPerInbound); err != nil {
		fr.err = err
	} else {
		fr.rules, fr.ruleBlocks, fr.leaves, fr.warns = b.rules, b.ruleBlocks, b.leaves, b.warns
	}
	v, _ := s.fromMemo.LoadOrStore(key, fr)
	return v.(*fromResult)
}

// inboundEntries lists, in apply order, the from-entries of the policies
// whose top-level targetRef selects the inbound.
func (s *MeshSnapshot) inboundEntries(t *typeIndex, dp *dataplane, in *inbound) []*entry {
	const unknown, yes, no = 0, 1, 2
	sel := make([]uint8, len(t.policies))
	var es []*entry
	for _, e := range t.from {
		p := e.pol
		if sel[p.idx] == unknown {
			sel[p.idx] = no
			if s.selectsSectionAt(t, p.idx, dp, &in.sec) {
				sel[p.idx] = yes
			}
		}
		if sel[p.idx] == yes {
			es = append(es, e)
		}
	}
	return es
}

func (s *MeshSnapshot) legacyView(v *typeView, k legacyKind, dp *dataplane) {
	t := v.t
	switch k {
	case legacyDataplane:
		if p := legacyForProxy(t, dp); p != nil {
			ap := legacyApplied(p)
			v.proxy = &ap
		}
	case legacyOutbound:
		v.outbound = make([]*OutboundPolicy, len(dp.outbounds))
		for i, o := range dp.outbounds {
			if p := legacyForOutbound(t, dp, o); p != nil {
				ap := legacyApplied(p)
				v.outbound[i] = &OutboundPolicy{Conf: ap.Conf, Origin: ap.Origin}
			}
		}
	case legacyInbound:
		v.inbound = make([][]Rule, len(dp.inbounds))
		for i, in := range dp.inbounds {
			if p := legacyForInbound(t, in); p != nil {
				v.inbound[i] = legacySourceRules(p)
			}
		}
	}
}

// dataplane finds a Dataplane; ns "" or the system namespace mean the
// system namespace.
func (s *MeshSnapshot) dataplane(name, ns string) (*dataplane, error) {
	dp := s.dataplanes[nsName{s.normNS(ns), name}]
	if dp == nil {
		return nil, fmt.Errorf("Dataplane %q in mesh %q: %w", qualified(ns, name), s.mesh, ErrNotFound)
	}
	return s.effective(dp), nil
}

func qualified(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// Rules returns the `_rules` view of a Dataplane (docs/api.md): per policy type,
// the proxy rule, the to-rules per outbound and the from-rules per inbound,
// with warnings. An unknown Dataplane is ErrNotFound.
func (s *MeshSnapshot) Rules(dpName, dpNamespace string) (*RulesResult, error) {
	dp, err := s.dataplane(dpName, dpNamespace)
	if err != nil {
		return nil, err
	}
	res := &RulesResult{Resource: dp.meta, Rules: []TypeRules{}, Warnings: dp.warnings}
	for _, name := range s.typeNames {
		if v := s.view(s.types[name], dp, true); !v.empty() {
			res.Rules = append(res.Rules, v.typeRules(dp))
		}
	}
	return res, nil
}

func (v *typeView) typeRules(dp *dataplane) TypeRules {
	tr := TypeRules{Type: v.t.desc.Name, Warnings: v.warnings, ProxyRule: v.proxy, ToRules: []ToRule{}, FromRules: []FromRules{}}
	for i, op := range v.outbound {
		if op != nil {
			tr.ToRules = append(tr.ToRules, ToRule{Outbound: dp.outbounds[i].ref(), Conf: op.Conf, Origin: op.Origin, Routes: op.Routes, lazy: op.lazy})
		}
	}
	for i, rules := range v.inbound {
		if len(rules) > 0 {
			tr.FromRules = append(tr.FromRules, FromRules{Inbound: dp.inbounds[i].ref(), Rules: rules})
		}
	}
	return tr
}

// Config returns the `_config` view of a Dataplane (docs/api.md): effective
// confs per inbound (as rules, with the MeshTrafficPermission RBAC filter),
// per outbound and proxy-wide.
func (s *MeshSnapshot) Config(dpName, dpNamespace string) (*ConfigResult, error) {
	dp, err := s.dataplane(dpName, dpNamespace)
	if err != nil {
		return nil, err
	}
	res := &ConfigResult{Dataplane: dp.meta, Inbounds: []InboundConfig{}, Outbounds: []OutboundConfig{},
		Proxy: map[string]Applied{}, Warnings: append([]string(nil), dp.warnings...), lineage: s.defs.lineage}
	for _, in := range dp.inbounds {
		res.Inbounds = append(res.Inbounds, InboundConfig{Port: in.port, Tags: in.tags, Policies: map[string]InboundPolicy{},
			RBAC: rbacFilter(s.mesh, nil)})
	}
	for _, o := range dp.outbounds {
		res.Outbounds = append(res.Outbounds, OutboundConfig{Port: o.port, Service: o.service, Tags: o.tags, Policies: map[string]*OutboundPolicy{}})
	}
	for _, name := range s.typeNames {
		v := s.view(s.types[name], dp, false)
		v.addToConfig(res, s.mesh)
	}
	return res, nil
}

func (v *typeView) addToConfig(res *ConfigResult, mesh string) {
	name := v.t.desc.Name
	res.Warnings = append(res.Warnings, v.warnings...)
	if v.proxy != nil {
		res.Proxy[name] = *v.proxy
	}
	for i, op := range v.outbound {
		if op != nil {
			res.Outbounds[i].Policies[name] = op
		}
	}
	for i, rules := range v.inbound {
		if len(rules) > 0 {
			res.Inbounds[i].Policies[name] = InboundPolicy{Rules: rules}
		}
		if name == mtpType && v.from[i] != nil {
			res.Inbounds[i].RBAC = v.from[i].rbacFilter(mesh)
		}
	}
}

// EvaluateInbound returns the conf each inbound policy type gives a client
// of the inbound listening on port (docs/api.md `_evaluate?inbound=`). The
// client's tags are taken as given. Legacy inbound types appear only when the
// client matches the selected policy's sources (docs/policy.md#legacy-policies). With several
// inbounds on one port, the first is evaluated.
func (s *MeshSnapshot) EvaluateInbound(dpName, dpNamespace string, port int, client map[string]string) (*InboundEvaluation, error) {
	dp, err := s.dataplane(dpName, dpNamespace)
	if err != nil {
		return nil, err
	}
	in := dp.inboundByPort(port)
	if in == nil {
		return nil, fmt.Errorf("Dataplane %q has no inbound on port %d: %w", qualified(dpNamespace, dpName), port, ErrNotFound)
	}
	res := &InboundEvaluation{Inbound: port, Client: maps.Clone(client), Policies: map[string]Applied{}}
	if res.Client == nil {
		res.Client = map[string]string{}
	}
	for _, name := range s.typeNames {
		if ap, ok := s.evaluateInbound(s.types[name], dp, in, client); ok {
			res.Policies[name] = ap
		}
	}
	return res, nil
}

func (s *MeshSnapshot) evaluateInbound(t *typeIndex, dp *dataplane, in *inbound, client map[string]string) (Applied, bool) {
	switch legacyKindOf(t.desc) {
	case legacyInbound:
		if p := legacyForInbound(t, in); p != nil && sourcesMatch(p, client) {
			return legacyApplied(p), true
		}
		return Applied{}, false
	case notLegacy:
		if !t.desc.From {
			return Applied{}, false
		}
		var es []*entry
		for _, e := range s.inboundEntries(t, dp, in) {
			if clientMatches(e, client) {
				es = append(es, e)
			}
		}
		return foldEntries(s.mergerOf(t), es).applied(defaultsOf(es))
	}
	return Applied{}, false
}

// clientMatches: the client carries every tag of the entry's subset.
func clientMatches(e *entry, client map[string]string) bool {
	if e.never {
		return false
	}
	for _, t := range e.tags {
		if v, ok := client[t.key]; !ok || v != t.value {
			return false
		}
	}
	return true
}

func (dp *dataplane) inboundByPort(port int) *inbound {
	for _, in := range dp.inbounds {
		if in.port == port {
			return in
		}
	}
	return nil
}

// EvaluateOutbound returns what each outbound policy type gives the
// Dataplane's outbound to service (docs/api.md `_evaluate?outbound=`), matched by
// the outbound's service name; with several outbounds to one service, the
// first is evaluated.
func (s *MeshSnapshot) EvaluateOutbound(dpName, dpNamespace, service string) (*OutboundEvaluation, error) {
	dp, err := s.dataplane(dpName, dpNamespace)
	if err != nil {
		return nil, err
	}
	idx := dp.byService[service]
	if len(idx) == 0 || service == "" {
		return nil, fmt.Errorf("Dataplane %q has no outbound to %q: %w", qualified(dpNamespace, dpName), service, ErrNotFound)
	}
	res := &OutboundEvaluation{Outbound: service, Policies: map[string]OutboundPolicy{}}
	for _, name := range s.typeNames {
		t := s.types[name]
		if !t.desc.To && legacyKindOf(t.desc) != legacyOutbound {
			continue
		}
		v := s.view(t, dp, false)
		if i := idx[0]; i < len(v.outbound) && v.outbound[i] != nil {
			res.Policies[name] = *v.outbound[i]
		}
	}
	return res, nil
}

// MatchedDataplanes lists the Dataplanes a policy applies to (docs/api.md
// `_resources/dataplanes`), sorted by namespace and name: those its
// top-level targetRef (with implicit scope) selects, or for a legacy policy
// those where it is the one selected for some connection or the proxy. A
// policy the engine skipped (unreadable spec) matches none; an unknown one is
// ErrNotFound.
func (s *MeshSnapshot) MatchedDataplanes(policyType, name, namespace string) ([]Meta, error) {
	t := s.types[policyType]
	key := nsName{s.normNS(namespace), name}
	var p *policy
	if t != nil {
		for _, cand := range t.policies {
			if cand.resName == name && s.normNS(cand.resNS) == key.ns {
				p = cand
				break
			}
		}
	}
	out := []Meta{}
	if p == nil {
		if t != nil && t.skipped[key] {
			return out, nil
		}
		return nil, fmt.Errorf("%s %q in mesh %q: %w", policyType, qualified(namespace, name), s.mesh, ErrNotFound)
	}
	for _, dp := range s.dpList {
		if s.applies(t, p, s.effective(dp)) {
			out = append(out, dp.meta)
		}
	}
	return out, nil
}

func (s *MeshSnapshot) applies(t *typeIndex, p *policy, dp *dataplane) bool {
	k := legacyKindOf(t.desc)
	if k == notLegacy {
		return s.selectsDP(p, dp)
	}
	switch k {
	case legacyDataplane:
		return legacyForProxy(t, dp) == p
	case legacyOutbound:
		for _, o := range dp.outbounds {
			if legacyForOutbound(t, dp, o) == p {
				return true
			}
		}
	case legacyInbound:
		for _, in := range dp.inbounds {
			if legacyForInbound(t, in) == p {
				return true
			}
		}
	}
	return false
}

// Dataplanes lists the snapshot's Dataplanes, sorted by namespace and name,
// so a cache can recompute every proxy after a change.
func (s *MeshSnapshot) Dataplanes() []Meta {
	out := make([]Meta, len(s.dpList))
	for i, dp := range s.dpList {
		out[i] = dp.meta
	}
	return out
}
