package policy

import (
	"encoding/json"
	"sort"
	"strconv"
	"sync"
)

// defTable shares equal contribution and entry definitions between parsed
// policies, as refTable shares targetRefs. A fleet's policies repeat a few
// confs ({idleTimeout: 5s}, {action: Allow}) across thousands of
// resources; each parsed copy was a contributionDef and its compiled patch
// (about 220 bytes) and an entryDef (64), 30 MB of a zone holding 100,000
// MeshTimeouts. Definitions are never written once their policy is parsed,
// so sharing them changes nothing but memory; nothing compares them by
// identity. A snapshot passes its table to the snapshot built from it.
// Safe for concurrent use.
type defTable struct {
	mu       sync.Mutex
	contribs map[string]*contributionDef
	entries  map[entryKey]*entryDef
	buf      []byte // the contribution key being built; under mu
}

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
	return &defTable{contribs: map[string]*contributionDef{}, entries: map[entryKey]*entryDef{}}
}

// shareDefs replaces p's definitions with equal shared ones. It runs once
// per parsed policy, after finishContributions.
func (t *defTable) shareDefs(p *policy) {
	for _, list := range [][]*entry{p.to, p.from} {
		for _, e := range list {
			e.entryDef = t.entry(e.entryDef)
			t.contribution(e.c)
			t.contribution(e.o)
		}
	}
	t.contribution(p.proxy)
	t.contribution(p.proxyOver)
}

// entry returns a definition equal to d that the caller must not write.
func (t *defTable) entry(d *entryDef) *entryDef {
	if r := d.ref; r.Labels != nil || r.Tags != nil || r.ProxyTypes != nil {
		return d
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
	t.entries[k] = d
	return d
}

// contribution points c at a shared definition equal to its own. Legacy
// confs (kept decoded) and blocks with a `when` (a compiled program) are
// not shared.
func (t *defTable) contribution(c *contribution) {
	if c == nil || c.conf != nil || c.when != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := appendContributionKey(t.buf[:0], c.contributionDef)
	t.buf = b
	if !ok {
		return
	}
	if s, ok := t.contribs[string(b)]; ok {
		c.contributionDef = s
		return
	}
	if len(t.contribs) >= maxSharedDefs {
		t.contribs = make(map[string]*contributionDef)
	}
	t.contribs[string(b)] = c.contributionDef
}

// appendContributionKey writes every field of d that output or a fold
// reads; ok is false when the patch holds a value it cannot write.
func appendContributionKey(b []byte, d *contributionDef) ([]byte, bool) {
	b = strconv.AppendInt(b, int64(d.entry), 10)
	b = appendKeyString(b, d.list)
	b = appendKeyString(b, d.block)
	b = appendKeyString(b, d.at)
	b = strconv.AppendBool(b, d.hasConf)
	b = strconv.AppendBool(b, d.atomic)
	b = strconv.AppendInt(b, int64(len(d.unset)), 10)
	for _, path := range d.unset {
		b = strconv.AppendInt(b, int64(len(path)), 10)
		for _, s := range path {
			b = appendKeyString(b, s)
		}
	}
	return appendPatchKey(b, d.patch)
}

func appendPatchKey(b []byte, p *patch) ([]byte, bool) {
	if p == nil {
		return append(b, '0'), true
	}
	if !p.isObj {
		return appendValueKey(append(b, 'v'), p.value)
	}
	b = append(b, '{')
	for _, f := range p.fields {
		var ok bool
		if b, ok = appendPatchKey(appendKeyString(b, f.key), f.patch); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// appendValueKey writes a decoded JSON value, tagged by its Go type (a
// json.Number and a string of the same text differ).
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
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = append(b, '(')
		for _, k := range keys {
			var ok bool
			if b, ok = appendValueKey(appendKeyString(b, k), v[k]); !ok {
				return b, false
			}
		}
		return append(b, ')'), true
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
