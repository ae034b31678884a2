package resource

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// ParseJSON decodes one JSON value into generic values (map[string]any,
// []any, string, bool, nil, and json.Number for numbers, so they stay
// exact); empty input is nil. It is the one generic JSON decoder of the
// project: the registry's validation and normalization, the policy
// engine's confs and the sync rewrites all read specs through it.
func ParseJSON(raw []byte) (any, error) { return parseJSON(raw) }

// parseJSON is ParseJSON. Every spec a control plane validates, normalizes,
// receives or computes with is decoded here, so it is on the write path, the
// fan-out and the cold zone's path. Valid input is read by parseJSONTokens,
// which builds the values straight from a token stream (encoding/json scans
// the input twice and decodes through reflection: about 1.5× the time).
// Anything it does not take goes to parseJSONStd, so that encoding/json
// decides and words every refusal as before, and decodes what only it
// accepts (invalid UTF-8, lone surrogate escapes: it substitutes U+FFFD).
// FuzzParseJSONMatchesEncodingJSON holds the two to the same values.
func parseJSON(raw []byte) (any, error) { return parseJSONWith(raw, nil) }

// parseJSONWith is parseJSON with names: the registry's methods pass the
// vocabulary of its schemas, so that the names and enum values every spec
// repeats are not allocated again for each spec.
func parseJSONWith(raw []byte, names internTable) (any, error) {
	return parseJSONScratch(raw, names, nil)
}

// parseJSONScratch is parseJSONWith taking the tree's maps and arrays, and
// its decoder, from s (nil: allocated afresh). Only a caller that drops the
// tree before it returns s may pass one (see scratch).
func parseJSONScratch(raw []byte, names internTable, s *scratch) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	if v, ok := parseJSONTokens(raw, names, s); ok {
		return v, nil
	}
	return parseJSONStd(raw)
}

// parseJSONStd is parseJSON by encoding/json.
func parseJSONStd(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		rest := bytes.TrimLeft(raw[dec.InputOffset():], " \t\r\n")
		return nil, fmt.Errorf("invalid JSON: %w", &trailingDataError{offset: int64(len(raw)-len(rest)) + 1})
	}
	return v, nil
}

// parseJSONTokens decodes raw when it is exactly one valid JSON value in
// valid UTF-8; ok is false otherwise. Duplicate names are allowed and the
// last one wins, as encoding/json decodes them into a map.
func parseJSONTokens(raw []byte, names internTable, s *scratch) (v any, ok bool) {
	// A bytes.Buffer is parsed in place, without a copy (jsontext.NewDecoder).
	dec := s.decoder(bytes.NewBuffer(raw))
	v, err := tokenValue(dec, names, s)
	if err != nil {
		return nil, false
	}
	if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return v, true
}

// tokenValue reads the next value from dec, taking maps and arrays from s.
func tokenValue(dec *jsontext.Decoder, names internTable, s *scratch) (any, error) {
	switch dec.PeekKind() {
	case '"':
		raw, err := dec.ReadValue()
		if err != nil {
			return nil, err
		}
		return names.value(raw)
	case '{':
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		m := s.object()
		for dec.PeekKind() != '}' {
			raw, err := dec.ReadValue() // the name
			if err != nil {
				return nil, err
			}
			k, err := names.str(raw)
			if err != nil {
				return nil, err
			}
			if m[k], err = tokenValue(dec, names, s); err != nil {
				return nil, err
			}
		}
		_, err := dec.ReadToken()
		return m, err
	case '[':
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		a := s.array()
		for dec.PeekKind() != ']' {
			v, err := tokenValue(dec, names, s)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.ReadToken()
		return a, err
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case '0':
		return json.Number(tok.String()), nil // a number token's String is its literal
	case 't':
		return true, nil
	case 'f':
		return false, nil
	case 'n':
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok.Kind())
}

// internTable maps a string specs repeat (a schema's field names and enum
// values, the target kinds) to one shared copy, and to that copy already
// held in an interface, so that decoding it allocates nothing. Built once
// by NewRegistry and only read afterwards: safe for concurrent use. A nil
// table interns nothing.
type internTable map[string]interned

type interned struct {
	str   string
	boxed any
}

func (t internTable) add(s string) {
	if _, ok := t[s]; !ok {
		t[s] = interned{str: s, boxed: s}
	}
}

// decode unquotes a JSON string the decoder has read (so it is valid and in
// valid UTF-8): the table's entry when it holds the string, else an entry
// without a boxed copy. One without escapes is its bytes between the quotes.
func (t internTable) decode(raw jsontext.Value) (interned, error) {
	body := raw[1 : len(raw)-1]
	if bytes.IndexByte(body, '\\') >= 0 {
		b, err := jsontext.AppendUnquote(nil, raw)
		return interned{str: string(b)}, err
	}
	if e, ok := t[string(body)]; ok { // the conversion does not allocate
		return e, nil
	}
	return interned{str: string(body)}, nil
}

// str is decode for an object name.
func (t internTable) str(raw jsontext.Value) (string, error) {
	e, err := t.decode(raw)
	return e.str, err
}

// value is decode as a JSON value: the table's boxed copy when there is one.
func (t internTable) value(raw jsontext.Value) (any, error) {
	e, err := t.decode(raw)
	if err != nil {
		return nil, err
	}
	if e.boxed != nil {
		return e.boxed, nil
	}
	return e.str, nil
}

// addSchema adds every field name and enum value of s and the schemas
// below it.
func (t internTable) addSchema(s *Schema) {
	if s == nil {
		return
	}
	for name, f := range s.fields {
		t.add(name)
		t.addSchema(f)
	}
	for _, e := range s.enum {
		t.add(e)
	}
	t.addSchema(s.elem)
}

// trailingDataError is text after a complete JSON value; offset is counted
// like json.SyntaxError's (the offending byte included).
type trailingDataError struct{ offset int64 }

func (e *trailingDataError) Error() string { return "unexpected data after the JSON value" }

// CanonicalJSON encodes a decoded value in the canonical stored form
// (canonicalJSON); the sync rewrites re-encode specs with it.
func CanonicalJSON(v any) ([]byte, error) { return canonicalJSON(v) }

// canonicalJSON encodes a decoded value compactly, keys sorted, without
// HTML escaping (specs carry Envoy configs with '<' and '&'): the stored
// form of every spec, so equal specs have equal bytes. The bytes are
// encoding/json's (canonicalJSONStd); appendCanonical writes them without
// reflection for what parseJSON produces, and leaves anything else to
// encoding/json. FuzzCanonicalJSONMatchesEncodingJSON holds the two to the
// same bytes.
func canonicalJSON(v any) ([]byte, error) {
	var scratch [512]byte
	if out, ok := appendCanonical(scratch[:0], v); ok {
		return bytes.Clone(out), nil // exactly sized: specs are held by the thousand
	}
	return canonicalJSONStd(v)
}

// canonicalJSONStd is canonicalJSON by encoding/json.
func canonicalJSONStd(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// appendCanonical appends v as encoding/json with SetEscapeHTML(false)
// writes it; ok is false for a value it does not handle (another Go type,
// a number that is not a JSON number, invalid UTF-8, U+2028/U+2029, which
// encoding/json escapes and jsontext.AppendQuote does not).
func appendCanonical(dst []byte, v any) (out []byte, ok bool) {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), true
	case bool:
		return strconv.AppendBool(dst, v), true
	case string:
		return appendCanonicalString(dst, v)
	case json.Number:
		if !isJSONNumber(v) {
			return dst, false
		}
		return append(dst, v...), true
	case json.RawMessage:
		// encoding/json compacts a RawMessage; Compact appends to dst, and
		// only when v is valid.
		buf := bytes.NewBuffer(dst)
		if err := json.Compact(buf, v); err != nil {
			return dst, false
		}
		return buf.Bytes(), true
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			if dst, ok = appendCanonical(dst, e); !ok {
				return dst, false
			}
		}
		return append(dst, ']'), true
	case map[string]any:
		var small [16]string // a spec's objects have a few keys: no allocation
		keys := small[:0]
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			if dst, ok = appendCanonicalString(dst, k); !ok {
				return dst, false
			}
			dst = append(dst, ':')
			if dst, ok = appendCanonical(dst, v[k]); !ok {
				return dst, false
			}
		}
		return append(dst, '}'), true
	}
	return dst, false
}

func appendCanonicalString(dst []byte, s string) ([]byte, bool) {
	if strings.Contains(s, "\u2028") || strings.Contains(s, "\u2029") {
		return dst, false
	}
	out, err := jsontext.AppendQuote(dst, s)
	return out, err == nil
}

// isJSONNumber reports whether n is one JSON number and nothing else, as
// encoding/json requires of a json.Number it encodes.
func isJSONNumber(n json.Number) bool {
	isDigit := func(c byte) bool { return '0' <= c && c <= '9' }
	return n != "" && (n[0] == '-' || isDigit(n[0])) && isDigit(n[len(n)-1]) && jsontext.Value(n).IsValid()
}
