package policy

import (
	"encoding/binary"
	"encoding/json"
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
)

// defTable shares equal contribution and entry definitions between parsed
// policies, as refTable shares targetRefs. A fleet's policies repeat a few
// confs ({idleTimeout: 5s}, {action: Allow}) across thousands of
// resources; each parsed copy was a contributionDef and its compiled patch
// (about 220 bytes) and an entryDef (64), 30 MB of a zone holding 100,000
// MeshTimeouts. A definition is looked up before it is made: one made and
// then dropped for a shared one was garbage in the size classes of the
// structs a build keeps, and left them in half-empty spans.
//
// Definitions are never written once made, so sharing them changes nothing
// but memory; nothing compares them by identity. A snapshot passes its
// table to the snapshot built from it. Safe for concurrent use.
type defTable struct {
	mu       sync.Mutex
	contribs map[string]*contributionDef
	entries  map[entryKey]*entryDef
	// seed keys specSum, the same for every snapshot that shares the table.
	seed maphash.Seed
	// uids numbers the policies parsed by the snapshots sharing the table
	// (and their outbound results, ResultID).
	uids atomic.Uint64
	// lineage tells the snapshots sharing the table from others, whose
	// uids count from zero too (ConfigResult.Lineage): a random number,
	// so that lineages of one process (a mesh reloaded) or of two differ.
	lineage uint64
	// keySeeds key entriesKey, the same for every snapshot that shares
	// the table (their memo keys must agree).
	keySeeds [2]maphash.Seed
}

// entriesKey identifies an entry list of one type, and the routes' entry
// lists with it, by their policies' parses and entry indexes
// (policyDef.uid, shared by the snapshots holding those versions): 128
// bits of two independently seeded hashes of the list, so that a memo of
// 100,000 entries keys by 16 bytes, not by the list. Lists that differ
// share a key with a probability of 2^-128.
type entriesKey [2]uint64

// commonKey keys a type's memo of outbound results: the type and its
// Mesh entries.
type commonKey struct {
	typ string
	key entriesKey
}

func (t *defTable) entriesKey(es []*entry, routed *routeEntries) entriesKey {
	if len(es) == 0 && (routed == nil || len(routed.routes) == 0) {
		return entriesKey{}
	}
	buf := make([]byte, 0, 8*len(es)+16)
	put := func(list []*entry) {
		buf = binary.AppendUvarint(buf, uint64(len(list)))
		for _, e := range list {
			buf = binary.AppendUvarint(buf, e.pol.uid)
			buf = binary.AppendUvarint(buf, uint64(e.index))
		}
	}
	put(es)
	if routed != nil {
		for i, r := range routed.routes {
			buf = binary.AppendUvarint(buf, r.uid)
			put(routed.entries[i])
		}
	}
	return entriesKey{maphash.Bytes(t.keySeeds[0], buf), maphash.Bytes(t.keySeeds[1], buf)}
}

// nextUID is a new policyDef.uid.
func (t *defTable) nextUID() uint64 { return t.uids.Add(1) }

// specSum fingerprints a policy's spec (64 bits of maphash under a seed
// of the process's choosing): a later build tells a resource whose spec
// did not change by it without keeping the spec (parsedPolicy.holds).
func (t *defTable) specSum(spec []byte) uint64 { return maphash.Bytes(t.seed, spec) }

// entryKey is an entryDef's content (kind follows from ref). ref is
// interned (refTable), so equal plain refs are one pointer; entries whose
// ref carries labels, tags or proxy types are not shared.
type entryKey struct {
	index int
	ref   *targetRef
	never bool
	tags  string
}

// maxSharedDefs bounds each map: past it, the map starts afresh (handed-out
// definitions stay valid), so the confs of policies long gone do not
// accumulate over a zone's life.
const maxSharedDefs = 4096

func newDefTable() *defTable {
	return &defTable{contribs: map[string]*contributionDef{}, entries: map[entryKey]*entryDef{}, seed: maphash.MakeSeed(),
		keySeeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, lineage: randomUint64()}
}

// randomUint64 is 64 random bits, from a new maphash seed (the runtime's
// random source the table's seeds come from).
func randomUint64() uint64 {
	var h maphash.Hash
	h.SetSeed(maphash.MakeSeed())
	return h.Sum64()
}

// entryDef returns a definition equal to d that the caller must not write.
// A nil table shares nothing.
func (t *defTable) entryDef(d entryDef) *entryDef {
	if r := d.ref; t == nil || r.Labels != nil || r.Tags != nil || r.ProxyTypes != nil {
		return &d
	}
	k := entryKey{index: d.index, ref: d.ref, never: d.never}
	if len(d.tags) > 0 {
		var b []byte
		for _, tg := range d.tags {
			b = appendKeyString(appendKeyString(b, tg.key), tg.value)
		}
		k.tags = string(b)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.entries[k]; ok {
		return s
	}
	if len(t.entries) >= maxSharedDefs {
		t.entries = make(map[entryKey]*entryDef)
	}
	p := &d
	t.entries[k] = p
	return p
}

// contributionDef returns a definition of conf as block of entry in list
// that the caller must not write: a shared one when an equal one was made,
// else a new one. Legacy confs (kept decoded) and blocks with a `when` (a
// compiled program) are not shared; nor is anything by a nil table.
func (t *defTable) contributionDef(entry int, list, block string, conf confBlock) *contributionDef {
	if t == nil || block == blockConf || conf.when != nil {
		return newContributionDef(entry, list, block, conf)
	}
	var buf [256]byte
	key, ok := appendContributionKey(buf[:0], entry, list, block, conf)
	if !ok {
		return newContributionDef(entry, list, block, conf)
	}
	t.mu.Lock()
	s, found := t.contribs[string(key)]
	t.mu.Unlock()
	if found {
		return s
	}
	d := newContributionDef(entry, list, block, conf) // compiled outside the lock
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, found := t.contribs[string(key)]; found {
		return s // made meanwhile by another parse
	}
	if len(t.contribs) >= maxSharedDefs {
		t.contribs = make(map[string]*contributionDef)
	}
	t.contribs[string(key)] = d
	return d
}

// appendContributionKey writes everything a definition is made of (its
// where() follows from entry, list and block, its patch from the value);
// ok is false when the value holds something it cannot write.
func appendContributionKey(b []byte, entry int, list, block string, conf confBlock) ([]byte, bool) {
	b = strconv.AppendInt(b, int64(entry), 10)
	b = appendKeyString(b, list)
	b = appendKeyString(b, block)
	b = strconv.AppendBool(b, conf.atomic)
	b = strconv.AppendInt(b, int64(len(conf.unset)), 10)
	for _, path := range conf.unset {
		b = strconv.AppendInt(b, int64(len(path)), 10)
		for _, s := range path {
			b = appendKeyString(b, s)
		}
	}
	if conf.value == nil {
		return append(b, '-'), true // no conf (hasConf false), not JSON null
	}
	return appendValueKey(b, conf.value)
}

// appendValueKey writes a decoded JSON value, tagged by its Go type (a
// json.Number and a string of the same text differ), an object's keys
// sorted.
func appendValueKey(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case nil:
		return append(b, 'n'), true
	case bool:
		if v {
			return append(b, 't'), true
		}
		return append(b, 'f'), true
	case string:
		return appendKeyString(append(b, 's'), v), true
	case json.Number:
		return appendKeyString(append(b, '#'), string(v)), true
	case []any:
		b = append(b, '[')
		for _, e := range v {
			var ok bool
			if b, ok = appendValueKey(b, e); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case map[string]any:
		var arr [16]string
		keys := arr[:0]
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for _, k := range keys {
			var ok bool
			if b, ok = appendValueKey(appendKeyString(b, k), v[k]); !ok {
				return b, false
			}
		}
		return append(b, '}'), true
	}
	return b, false
}

// appendKeyString writes s length-prefixed, so that no string can fake
// the structure around it.
func appendKeyString(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
