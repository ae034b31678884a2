package policy

import (
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// AppendJSON appends r encoded as JSON, equivalent to json.Marshal(r). It
// exists because a large _rules response (1,000 outbounds × several policy
// types) spent most of its time in encoding/json's reflection and in the
// re-compaction of every json.RawMessage conf; this writes each byte once.
// The output is compact JSON; '<', '>' and '&' are not HTML-escaped.
func (r *RulesResult) AppendJSON(b []byte) []byte {
	e := &rulesEncoder{b: b}
	e.result(r)
	return e.b
}

// MarshalJSON is AppendJSON, for encoding/json and its kin: a RulesResult's
// origins exist only in its encoding.
func (r *RulesResult) MarshalJSON() ([]byte, error) { return r.AppendJSON(nil), nil }

// WriteJSON writes what AppendJSON appends, to w as it goes: the encoding
// is handed to w in pieces of about 32 KiB, so a large response is never
// held whole (a proxy's origins alone can be megabytes: every entry that
// matched each target).
func (r *RulesResult) WriteJSON(w io.Writer) error {
	e := &rulesEncoder{b: make([]byte, 0, 2*flushAt), w: w}
	e.result(r)
	e.flush()
	return e.err
}

// flushAt is the size at which a streaming encoder hands its buffer on.
const flushAt = 32 << 10

// rulesEncoder writes a RulesResult. Origin lists shared by several
// targets (the memoized confs of outbounds with the same entries, of
// inbounds with the same rules) are encoded once per response and copied.
type rulesEncoder struct {
	b      []byte
	w      io.Writer // nil: append only
	err    error
	shared map[originsKey][]byte
	// touched keeps touchOrigins' reads.
	touched byte
}

// originsKey identifies an origin list by its backing array: of Origin
// values, or of the blocks a lazy origin is written from.
type originsKey struct {
	first *Origin
	block **contribution
	n     int
}

// minSharedOrigins is the length from which an origin list's encoding is
// kept for the rest of the response.
const minSharedOrigins = 16

// maybeFlush hands the buffer to the writer once it is large enough.
func (e *rulesEncoder) maybeFlush() {
	if e.w != nil && len(e.b) >= flushAt {
		e.flush()
	}
}

// flush hands the buffer to the writer. After a failed write the rest is
// dropped as it is encoded (the reader is gone).
func (e *rulesEncoder) flush() {
	if e.w == nil || len(e.b) == 0 {
		return
	}
	if e.err == nil {
		_, e.err = e.w.Write(e.b)
	}
	e.b = e.b[:0]
}

func (e *rulesEncoder) result(r *RulesResult) {
	e.b = append(e.b, `{"resource":`...)
	e.b = appendMeta(e.b, r.Resource)
	e.b = append(e.b, `,"rules":`...)
	if r.Rules == nil {
		e.b = append(e.b, "null"...)
	} else {
		e.b = append(e.b, '[')
		for i, t := range r.Rules {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.typeRules(t)
		}
		e.b = append(e.b, ']')
	}
	if len(r.Warnings) > 0 {
		e.b = append(e.b, `,"warnings":`...)
		e.b = appendList(e.b, r.Warnings, appendString)
	}
	e.b = append(e.b, '}')
}

func (e *rulesEncoder) typeRules(t TypeRules) {
	e.b = append(e.b, `{"type":`...)
	e.b = appendString(e.b, t.Type)
	e.b = append(e.b, `,"warnings":`...)
	e.b = appendList(e.b, t.Warnings, appendString)
	e.b = append(e.b, `,"proxyRule":`...)
	if t.ProxyRule == nil {
		e.b = append(e.b, "null"...)
	} else {
		e.b = append(e.b, `{"conf":`...)
		e.b = appendRaw(e.b, t.ProxyRule.Conf)
		e.b = append(e.b, `,"origin":`...)
		e.origins(t.ProxyRule.Origin, t.ProxyRule.lazy)
		e.b = append(e.b, '}')
	}
	e.b = append(e.b, `,"toRules":`...)
	if t.ToRules == nil {
		e.b = append(e.b, "null"...)
	} else {
		e.b = append(e.b, '[')
		for i, tr := range t.ToRules {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.toRule(tr)
			e.maybeFlush()
		}
		e.b = append(e.b, ']')
	}
	e.b = append(e.b, `,"fromRules":`...)
	if t.FromRules == nil {
		e.b = append(e.b, "null"...)
	} else {
		e.b = append(e.b, '[')
		for i, f := range t.FromRules {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.fromRules(f)
		}
		e.b = append(e.b, ']')
	}
	e.b = append(e.b, '}')
	e.maybeFlush()
}

func (e *rulesEncoder) toRule(t ToRule) {
	b := append(e.b, `{"outbound":{"port":`...)
	b = strconv.AppendInt(b, int64(t.Outbound.Port), 10)
	if t.Outbound.Address != "" {
		b = append(b, `,"address":`...)
		b = appendString(b, t.Outbound.Address)
	}
	b = append(b, `,"service":`...)
	b = appendString(b, t.Outbound.Service)
	b = append(b, `,"tags":`...)
	b = appendStringMap(b, t.Outbound.Tags)
	b = append(b, `},"conf":`...)
	b = appendRaw(b, t.Conf)
	e.b = append(b, `,"origin":`...)
	e.origins(t.Origin, t.lazy)
	if len(t.Routes) > 0 {
		e.b = append(e.b, `,"routes":[`...)
		for i, r := range t.Routes {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.b = append(e.b, `{"route":`...)
			e.b = appendMeta(e.b, r.Route)
			e.b = append(e.b, `,"conf":`...)
			e.b = appendRaw(e.b, r.Conf)
			e.b = append(e.b, `,"origin":`...)
			e.origins(r.Origin, r.lazy)
			e.b = append(e.b, '}')
		}
		e.b = append(e.b, ']')
	}
	e.b = append(e.b, '}')
}

func (e *rulesEncoder) fromRules(f FromRules) {
	e.b = append(e.b, `{"inbound":{"port":`...)
	e.b = strconv.AppendInt(e.b, int64(f.Inbound.Port), 10)
	e.b = append(e.b, `,"tags":`...)
	e.b = appendStringMap(e.b, f.Inbound.Tags)
	e.b = append(e.b, `},"rules":`...)
	if f.Rules == nil {
		e.b = append(e.b, "null"...)
	} else {
		e.b = append(e.b, '[')
		for i, r := range f.Rules {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.b = append(e.b, `{"matchers":`...)
			e.b = appendList(e.b, r.Matchers, appendMatcher)
			e.b = append(e.b, `,"conf":`...)
			e.b = appendRaw(e.b, r.Conf)
			e.b = append(e.b, `,"origin":`...)
			e.origins(r.Origin, r.lazy)
			e.b = append(e.b, '}')
			e.maybeFlush()
		}
		e.b = append(e.b, ']')
	}
	e.b = append(e.b, '}')
}

// origins writes an origin list, from its Origin values or (lazy) its
// blocks. A long list is written in place, flushed as it goes, the first
// time it appears; where it appears again it is encoded once more, kept,
// and copied from then on. A response whose only long list is the
// 100,000 origins of one outbound thus never holds their 20 MB encoding
// whole, and one whose 1,000 outbounds share a list encodes it twice.
// Appending (no writer), the first encoding is kept where it was written.
func (e *rulesEncoder) origins(os []Origin, lazy lazyOrigin) {
	n := len(os)
	if lazy.set {
		n = len(lazy.blocks)
	}
	if n < minSharedOrigins {
		e.originList(os, lazy)
		return
	}
	key := originsKey{n: n}
	if lazy.set {
		key.block = &lazy.blocks[0]
	} else {
		key.first = &os[0]
	}
	enc, seen := e.shared[key]
	if !seen {
		if e.shared == nil {
			e.shared = map[originsKey][]byte{}
		}
		start := len(e.b)
		e.originList(os, lazy)
		if e.w == nil {
			enc = e.b[start:len(e.b):len(e.b)] // never written over: appending only
		}
		e.shared[key] = enc
		return
	}
	if enc == nil {
		enc = (&rulesEncoder{b: make([]byte, 0, 128*n)}).encodedOrigins(os, lazy)
		e.shared[key] = enc
	}
	if e.w != nil && len(enc) >= flushAt {
		e.flush()
		if e.err == nil {
			_, e.err = e.w.Write(enc)
		}
		return
	}
	e.b = append(e.b, enc...)
	e.maybeFlush()
}

// encodedOrigins returns e's buffer with the list appended.
func (e *rulesEncoder) encodedOrigins(os []Origin, lazy lazyOrigin) []byte {
	e.originList(os, lazy)
	return e.b
}

// originList writes an origin list as a JSON array (null for a nil list of
// values), handing the buffer on every flushEvery origins.
func (e *rulesEncoder) originList(os []Origin, lazy lazyOrigin) {
	if !lazy.set && os == nil {
		e.b = append(e.b, "null"...)
		return
	}
	n := len(os)
	if lazy.set {
		n = len(lazy.blocks)
	}
	b := append(e.b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		if lazy.set && i%flushEvery == 0 {
			e.touched += touchOrigins(lazy.blocks[i:min(i+flushEvery, n)])
		}
		if lazy.set {
			b = appendBlockOrigin(b, lazy.blocks[i])
		} else {
			b = appendOrigin(b, os[i])
		}
		if i%flushEvery == flushEvery-1 {
			e.b = b
			e.maybeFlush()
			b = e.b
		}
	}
	e.b = append(b, ']')
}

// touchOrigins reads, in a short loop, the memory that writing the
// origins of blocks reads. A zone's policies lie wherever its heap put
// them as they arrived, and writing an origin waited on a cache miss for
// each pointer it followed (block, policy, name, labels), one after the
// other; a short loop lets the processor run ahead across iterations, so
// the misses of many blocks overlap. The sum only keeps the reads.
func touchOrigins(blocks []*contribution) (sum byte) {
	for _, c := range blocks {
		p := c.pol
		if p == nil {
			continue
		}
		sum += firstByte(p.resName) + firstByte(p.resNS)
		for k, v := range p.labels.All() {
			sum += firstByte(k) + firstByte(v)
		}
	}
	return sum
}

func firstByte(s string) byte {
	if s == "" {
		return 0
	}
	return s[0]
}

// flushEvery is how many origins originList writes between checks of its
// buffer's size (an origin is some 100 to 300 bytes).
const flushEvery = 64

func appendMatcher(b []byte, m Matcher) []byte {
	b = append(b, `{"key":`...)
	b = appendString(b, m.Key)
	b = append(b, `,"value":`...)
	b = appendString(b, m.Value)
	b = append(b, `,"not":`...)
	b = strconv.AppendBool(b, m.Not)
	return append(b, '}')
}

// appendOrigin writes the fields in json.Marshal's order: Meta's
// (embedded), then the origin's own, omitted when empty. An origin's Meta
// is written afresh each time: caching its JSON per policy cost 20 MB of a
// zone's heap at 100,000 policies, and writing it is a few appends and a
// sort of a handful of label keys.
func appendOrigin(b []byte, o Origin) []byte {
	m := o.Meta
	b = appendMetaFields(b, m.Type, m.Mesh, m.Name, m.Namespace, m.Labels)
	if o.Entry != nil {
		b = append(b, `,"entry":`...)
		b = strconv.AppendInt(b, int64(*o.Entry), 10)
	}
	if o.Block != "" {
		b = append(b, `,"block":`...)
		b = appendString(b, o.Block)
	}
	if o.List != "" {
		b = append(b, `,"list":`...)
		b = appendString(b, o.List)
	}
	return append(b, '}')
}

// appendBlockOrigin writes the origin of a block: what appendOrigin
// writes for originsOf's Origin value, without making it.
func appendBlockOrigin(b []byte, c *contribution) []byte {
	p := c.pol
	if p == nil {
		return appendOrigin(b, Origin{})
	}
	b = appendMetaFields(b, p.desc.Name, p.mesh, p.resName, p.resNS, p.labels)
	if c.entry >= 0 {
		b = append(b, `,"entry":`...)
		b = strconv.AppendInt(b, int64(c.entry), 10)
	}
	if c.block == blockOverride {
		b = append(b, `,"block":"override"`...)
	}
	if c.list == "rules" {
		b = append(b, `,"list":"rules"`...)
	}
	return append(b, '}')
}

func appendMeta(b []byte, m Meta) []byte {
	return append(appendMetaFields(b, m.Type, m.Mesh, m.Name, m.Namespace, m.Labels), '}')
}

// appendMetaFields writes a Meta's fields in json.Marshal's order as an
// object left open, for an origin's own fields to follow.
func appendMetaFields(b []byte, typ, mesh, name, namespace string, labels resource.Labels) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, typ)
	b = append(b, `,"mesh":`...)
	b = appendString(b, mesh)
	b = append(b, `,"name":`...)
	b = appendString(b, name)
	b = append(b, `,"namespace":`...)
	b = appendString(b, namespace)
	b = append(b, `,"labels":`...)
	return appendLabels(b, labels)
}

// appendList writes a JSON array, or null for a nil slice (as encoding/json).
func appendList[T any](b []byte, items []T, each func([]byte, T) []byte) []byte {
	if items == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = each(b, it)
	}
	return append(b, ']')
}

// appendLabels writes labels as an object (in their key order).
func appendLabels(b []byte, l resource.Labels) []byte {
	b = append(b, '{')
	i := 0
	for k, v := range l.All() {
		if i > 0 {
			b = append(b, ',')
		}
		i++
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, v)
	}
	return append(b, '}')
}

// appendStringMap writes an object with sorted keys, or null for nil.
// Labels are few: up to 16 are read once into an array and sorted in place
// (an insertion sort), without allocating or looking each key up again.
func appendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	var small [16][2]string
	kvs := small[:0]
	if len(m) > len(small) {
		kvs = make([][2]string, 0, len(m))
	}
	for k, v := range m {
		kvs = append(kvs, [2]string{k, v})
	}
	if len(kvs) > len(small) {
		slices.SortFunc(kvs, func(x, y [2]string) int { return strings.Compare(x[0], y[0]) })
	} else {
		for i := 1; i < len(kvs); i++ {
			for j := i; j > 0 && kvs[j][0] < kvs[j-1][0]; j-- {
				kvs[j], kvs[j-1] = kvs[j-1], kvs[j]
			}
		}
	}
	b = append(b, '{')
	for i, kv := range kvs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, kv[0])
		b = append(b, ':')
		b = appendString(b, kv[1])
	}
	return append(b, '}')
}

// appendRaw writes a conf; confs are canonical compact JSON built by this
// package, nil is null.
func appendRaw(b []byte, raw json.RawMessage) []byte {
	if raw == nil {
		return append(b, "null"...)
	}
	return append(b, raw...)
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 replaced by U+FFFD (as encoding/json).
// Runs that need no escape are copied whole.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < utf8.RuneSelf && s[i] != '"' && s[i] != '\\' {
		i++
	}
	if i == len(s) { // names, labels, most values: nothing to escape
		b = append(b, s...)
		return append(b, '"')
	}
	start := 0 // s[start:i] is pending, copied as it is
	for i < len(s) {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			} else {
				b = append(b, '\\', c)
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
