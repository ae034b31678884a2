package resource

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// jsonParseCases are inputs where encoding/json's behaviour is easy to get
// wrong: the token reader must give the same value or leave the input to
// encoding/json.
var jsonParseCases = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `1.5e300`, `-12.50E-3`, `123456789012345678901234567890`,
	`""`, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u00e9\u20ac\ud83d\ude00"`, `"é€😀"`, `"\u0000"`, `"<&>"`, `"\u2028\u2029"`,
	`{"a":1,"a":2}`, `{"a":{"b":1},"a":[1]}`, `{"":""}`, ` { "a" : [ 1 , 2 ] } `, "\t\r\n{}\n",
	`[1,"x",null,true,{"k":[[]]}]`,
	// Refused by one or both.
	`{"a":1,}`, `[1,]`, `{a:1}`, `'x'`, `01`, `1.`, `.5`, `+1`, `1e`, `NaN`, `"\x"`, "\"a\x01b\"", `{"a"}`,
	`{"a":1}x`, `{"a":1} {"b":2}`, `{"a":1}]`, `[`, `{`, `"`, `tru`, `nul`,
	// Only encoding/json takes these: it substitutes U+FFFD.
	"\"\xff\"", "\"a\xc3\"", `"\ud800"`, `"\udc00x"`, `"\ud800\u0041"`, "{\"\xfe\":1}",
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
}

// checkParseJSON fails when the token reader accepts raw and its value
// differs from encoding/json's, or accepts what encoding/json refuses.
// It checks the reader without an intern table and with the default
// registry's.
func checkParseJSON(t *testing.T, raw []byte) {
	t.Helper()
	std, err := parseJSONStd(raw)
	for _, names := range []internTable{nil, testVocab} {
		fast, ok := parseJSONTokens(raw, names, nil)
		if !ok {
			continue
		}
		if err != nil {
			t.Fatalf("token reader accepted what encoding/json refuses (%v): %q", err, raw)
		}
		if !reflect.DeepEqual(fast, std) {
			t.Fatalf("values differ for %q (intern table: %v):\ntokens: %#v\nstd:    %#v", raw, names != nil, fast, std)
		}
		// With a scratch that has lent and taken back another tree.
		s := &scratch{}
		prev, _ := parseJSONTokens([]byte(`{"a":[{"b":1},[2]],"c":{"d":{}}}`), names, s)
		s.recycle(prev)
		if again, _ := parseJSONTokens(raw, names, s); !reflect.DeepEqual(again, std) {
			t.Fatalf("values differ for %q parsed with a used scratch:\ntokens: %#v\nstd:    %#v", raw, again, std)
		}
	}
}

// testVocab is the default registry's intern table.
var testVocab = NewDefaultRegistry().vocab

// TestParseJSONInternsTheVocabulary: names and values of the registry's
// vocabulary decode to the table's shared strings, written plainly or with
// escapes, and cost fewer allocations than without the table.
func TestParseJSONInternsTheVocabulary(t *testing.T) {
	for _, w := range []string{"targetRef", "kind", "Mesh", "MeshService", "MeshSubset", "MeshServiceSubset", "idleTimeout", "MeshTimeout", "default"} {
		if _, ok := testVocab[w]; !ok {
			t.Fatalf("%q is not in the default registry's vocabulary", w)
		}
	}
	spec := []byte(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},` +
		`"default":{"idleTimeout":"5s","connectionTimeout":"1s"}}]}`)
	escaped := []byte(`{"t\u0061rgetRef":{"kind":"Me\u0073h"}}`)
	for _, raw := range [][]byte{spec, escaped} {
		got, ok := parseJSONTokens(raw, testVocab, nil)
		want, err := parseJSONStd(raw)
		if !ok || err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: got %#v (ok %v), encoding/json %#v (%v)", raw, got, ok, want, err)
		}
	}
	without := testing.AllocsPerRun(100, func() { parseJSONTokens(spec, nil, nil) })
	with := testing.AllocsPerRun(100, func() { parseJSONTokens(spec, testVocab, nil) })
	if with >= without-10 {
		t.Fatalf("allocations per parse: %v with the table, %v without; want at least 10 fewer", with, without)
	}
}

func TestParseJSONMatchesEncodingJSON(t *testing.T) {
	accepted := 0
	for _, c := range jsonParseCases {
		checkParseJSON(t, []byte(c))
		if _, ok := parseJSONTokens([]byte(c), nil, nil); ok {
			accepted++
		}
	}
	if accepted < 20 {
		t.Fatalf("the token reader took only %d of the valid cases: the fast path is not used", accepted)
	}
	// parseJSON itself: the token reader's answer or encoding/json's, with
	// encoding/json's errors.
	for _, c := range jsonParseCases {
		if strings.TrimSpace(c) == "" {
			continue
		}
		got, gotErr := parseJSON([]byte(c))
		want, wantErr := parseJSONStd([]byte(c))
		if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Errorf("parseJSON(%.40q) error %v, encoding/json %v", c, gotErr, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("parseJSON(%.40q) = %#v, encoding/json %#v", c, got, want)
		}
	}
	if v, err := parseJSON([]byte(" \n")); v != nil || err != nil {
		t.Errorf("parseJSON(blank) = %v, %v; want nil, nil", v, err)
	}
}

// FuzzParseJSONMatchesEncodingJSON: on any input the token reader gives
// encoding/json's value or leaves the input to it. Seeds: the cases above
// and every testdata document's spec.
func FuzzParseJSONMatchesEncodingJSON(f *testing.F) {
	for _, c := range jsonParseCases {
		f.Add([]byte(c))
	}
	reg := NewDefaultRegistry()
	files, _ := filepath.Glob("testdata/*/*.yaml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		docs, err := SplitDocuments(data)
		if err != nil {
			continue
		}
		for _, doc := range docs {
			if r, err := reg.Decode(doc); err == nil && len(r.Spec) > 0 {
				f.Add([]byte(r.Spec))
			}
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkParseJSON(t, raw) })
}

// BenchmarkParseJSON decodes a MeshTimeout's spec: the token reader with
// the registry's intern table (what Decode, Normalize and Validate use) and
// without it (ParseJSON), against encoding/json (parseJSONStd, what
// parseJSON was).
func BenchmarkParseJSON(b *testing.B) {
	spec := []byte(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},` +
		`"default":{"connectionTimeout":"5s","idleTimeout":"1h","http":{"requestTimeout":"15s","streamIdleTimeout":"30m"}}}],` +
		`"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"20s","maxConnections":1024}}]}`)
	for _, parse := range []struct {
		name string
		fn   func([]byte) (any, error)
	}{
		{"tokens-vocabulary", func(raw []byte) (any, error) { return parseJSONWith(raw, testVocab) }},
		{"tokens", parseJSON},
		{"encoding-json", parseJSONStd},
	} {
		b.Run(parse.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parse.fn(spec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// checkCanonicalJSON fails when appendCanonical writes other bytes than
// encoding/json for v, or takes a value encoding/json refuses.
func checkCanonicalJSON(t *testing.T, v any) {
	t.Helper()
	fast, ok := appendCanonical(nil, v)
	std, err := canonicalJSONStd(v)
	if !ok {
		return
	}
	if err != nil {
		t.Fatalf("appendCanonical wrote %q for a value encoding/json refuses (%v): %#v", fast, err, v)
	}
	if !bytes.Equal(fast, std) {
		t.Fatalf("canonical bytes differ for %#v:\nfast: %s\nstd:  %s", v, fast, std)
	}
}

func TestCanonicalJSONMatchesEncodingJSON(t *testing.T) {
	values := []any{
		nil, true, false, "", "<&>", "a\"b\\c\b\f\n\r\t\x00\x01\x1f\x7f", "é€😀", "\u2028", "x\u2029", "\xff", "a\xc3",
		json.Number("0"), json.Number("-1.5e+10"), json.Number(""), json.Number("01"), json.Number(" 1"),
		json.Number(`"1"`), json.Number("1 "), json.Number("NaN"),
		json.RawMessage(`{ "b" : [1, 2], "a" : "<\u2028>" }`), json.RawMessage(`{"a":`), json.RawMessage("\"\u2028\""),
		[]any{}, map[string]any{}, []any{nil, "x", json.Number("2")},
		map[string]any{"b": 1.5, "a": "x"}, map[string]any{"z": []any{map[string]any{"\u2028": 1}}},
		map[string]string{"a": "b"}, 42, 1.5, []string{"a"},
	}
	taken := 0
	for _, v := range values {
		checkCanonicalJSON(t, v)
		if _, ok := appendCanonical(nil, v); ok {
			taken++
		}
	}
	for _, c := range jsonParseCases {
		if v, err := parseJSONStd([]byte(c)); err == nil {
			checkCanonicalJSON(t, v)
			if _, ok := appendCanonical(nil, v); ok {
				taken++
			}
		}
	}
	if taken < 30 {
		t.Fatalf("appendCanonical took only %d values: the fast path is not used", taken)
	}
	// canonicalJSON itself gives encoding/json's bytes and errors.
	for _, v := range values {
		got, gotErr := canonicalJSON(v)
		want, wantErr := canonicalJSONStd(v)
		if !bytes.Equal(got, want) || (gotErr == nil) != (wantErr == nil) {
			t.Errorf("canonicalJSON(%#v) = %s, %v; encoding/json %s, %v", v, got, gotErr, want, wantErr)
		}
	}
}

// FuzzCanonicalJSONMatchesEncodingJSON: for whatever parseJSON decodes,
// appendCanonical writes encoding/json's bytes or leaves the value to it.
func FuzzCanonicalJSONMatchesEncodingJSON(f *testing.F) {
	for _, c := range jsonParseCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if v, err := parseJSON(raw); err == nil {
			checkCanonicalJSON(t, v)
			checkCanonicalJSON(t, json.RawMessage(raw))
		}
	})
}

// BenchmarkCanonicalJSON encodes a decoded MeshTimeout spec.
func BenchmarkCanonicalJSON(b *testing.B) {
	v, err := parseJSON([]byte(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},` +
		`"default":{"connectionTimeout":"5s","idleTimeout":"1h","http":{"requestTimeout":"15s","streamIdleTimeout":"30m"}}}],` +
		`"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"20s","maxConnections":1024}}]}`))
	if err != nil {
		b.Fatal(err)
	}
	for _, enc := range []struct {
		name string
		fn   func(any) ([]byte, error)
	}{{"append", canonicalJSON}, {"encoding-json", canonicalJSONStd}} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := enc.fn(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
