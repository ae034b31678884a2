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
	b = append(b, `{"resource":`...)
	b = appendMeta(b, r.Resource)
	b = append(b, `,"rules":`...)
	b = appendList(b, r.Rules, appendTypeRules)
	if len(r.Warnings) > 0 {
		b = append(b, `,"warnings":`...)
		b = appendList(b, r.Warnings, appendString)
	}
	return append(b, '}')
}

// WriteJSON writes what AppendJSON appends, to w as it goes: a proxy's
// rules are written one policy type at a time, so a large response is
// never held whole.
func (r *RulesResult) WriteJSON(w io.Writer) error {
	b := make([]byte, 0, 32<<10)
	b = append(b, `{"resource":`...)
	b = appendMeta(b, r.Resource)
	b = append(b, `,"rules":[`...)
	for i, t := range r.Rules {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendTypeRules(b, t)
		if len(b) >= 32<<10 {
			if _, err := w.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	b = append(b, ']')
	if len(r.Warnings) > 0 {
		b = append(b, `,"warnings":`...)
		b = appendList(b, r.Warnings, appendString)
	}
	b = append(b, '}')
	_, err := w.Write(b)
	return err
}

func appendTypeRules(b []byte, t TypeRules) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, t.Type)
	b = append(b, `,"warnings":`...)
	b = appendList(b, t.Warnings, appendString)
	b = append(b, `,"proxyRule":`...)
	if t.ProxyRule == nil {
		b = append(b, "null"...)
	} else {
		b = appendApplied(b, *t.ProxyRule)
	}
	b = append(b, `,"toRules":`...)
	b = appendList(b, t.ToRules, appendToRule)
	b = append(b, `,"fromRules":`...)
	b = appendList(b, t.FromRules, appendFromRules)
	return append(b, '}')
}

func appendApplied(b []byte, a Applied) []byte {
	b = append(b, `{"conf":`...)
	b = appendRaw(b, a.Conf)
	b = append(b, `,"origin":`...)
	b = appendList(b, a.Origin, appendOrigin)
	return append(b, '}')
}

func appendToRule(b []byte, t ToRule) []byte {
	b = append(b, `{"outbound":{"port":`...)
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
	b = append(b, `,"origin":`...)
	b = appendList(b, t.Origin, appendOrigin)
	if len(t.Routes) > 0 {
		b = append(b, `,"routes":`...)
		b = appendList(b, t.Routes, appendRouteConf)
	}
	return append(b, '}')
}

func appendRouteConf(b []byte, r RouteConf) []byte {
	b = append(b, `{"route":`...)
	b = appendMeta(b, r.Route)
	b = append(b, `,"conf":`...)
	b = appendRaw(b, r.Conf)
	b = append(b, `,"origin":`...)
	b = appendList(b, r.Origin, appendOrigin)
	return append(b, '}')
}

func appendFromRules(b []byte, f FromRules) []byte {
	b = append(b, `{"inbound":{"port":`...)
	b = strconv.AppendInt(b, int64(f.Inbound.Port), 10)
	b = append(b, `,"tags":`...)
	b = appendStringMap(b, f.Inbound.Tags)
	b = append(b, `},"rules":`...)
	b = appendList(b, f.Rules, appendRule)
	return append(b, '}')
}

func appendRule(b []byte, r Rule) []byte {
	b = append(b, `{"matchers":`...)
	b = appendList(b, r.Matchers, appendMatcher)
	b = append(b, `,"conf":`...)
	b = appendRaw(b, r.Conf)
	b = append(b, `,"origin":`...)
	b = appendList(b, r.Origin, appendOrigin)
	return append(b, '}')
}

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
	b = appendMeta(b, o.Meta)
	b = b[:len(b)-1] // reopen Meta's object for the origin's fields
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

func appendMeta(b []byte, m Meta) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, m.Type)
	b = append(b, `,"mesh":`...)
	b = appendString(b, m.Mesh)
	b = append(b, `,"name":`...)
	b = appendString(b, m.Name)
	b = append(b, `,"namespace":`...)
	b = appendString(b, m.Namespace)
	b = append(b, `,"labels":`...)
	b = appendLabels(b, m.Labels)
	return append(b, '}')
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
	start := 0 // s[start:i] is pending, copied as it is
	for i := 0; i < len(s); {
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
