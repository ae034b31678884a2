package resource

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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
// fan-out and the cold zone's path. Valid input
// is read by parseJSONTokens, which builds the values straight from a
// token stream (encoding/json scans the input twice and decodes through
// reflection: about 1.5× the time). Anything it does not take goes to
// parseJSONStd, so that encoding/json decides and words every refusal as
// before, and decodes what only it accepts (invalid UTF-8, lone surrogate
// escapes: it substitutes U+FFFD). FuzzParseJSONMatchesEncodingJSON holds
// the two to the same values.
func parseJSON(raw []byte) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	if v, ok := parseJSONTokens(raw); ok {
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
func parseJSONTokens(raw []byte) (v any, ok bool) {
	// A bytes.Buffer is parsed in place, without a copy (jsontext.NewDecoder).
	dec := jsontext.NewDecoder(bytes.NewBuffer(raw), jsontext.AllowDuplicateNames(true))
	v, err := tokenValue(dec)
	if err != nil {
		return nil, false
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return nil, false
	}
	return v, true
}

// tokenValue reads the next value from dec.
func tokenValue(dec *jsontext.Decoder) (any, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case '{':
		m := map[string]any{}
		for dec.PeekKind() != '}' {
			name, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			k := name.String()
			if m[k], err = tokenValue(dec); err != nil {
				return nil, err
			}
		}
		_, err := dec.ReadToken()
		return m, err
	case '[':
		a := []any{}
		for dec.PeekKind() != ']' {
			v, err := tokenValue(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.ReadToken()
		return a, err
	case '"':
		return tok.String(), nil
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

// trailingDataError is text after a complete JSON value; offset is counted
// like json.SyntaxError's (the offending byte included).
type trailingDataError struct{ offset int64 }

func (e *trailingDataError) Error() string { return "unexpected data after the JSON value" }
