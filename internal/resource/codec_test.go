package resource

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSplitDocuments(t *testing.T) {
	cases := []struct {
		name  string
		input string
		want  []string // trimmed documents
	}{
		{"single yaml", "type: Mesh\nname: a\n", []string{"type: Mesh\nname: a"}},
		{"multi yaml", "# header\n---\ntype: Mesh\nname: a\n--- # second\ntype: Mesh\nname: b\n...\n---\n\n# only a comment\n---\n", []string{
			"type: Mesh\nname: a", "# second\ntype: Mesh\nname: b"}},
		{"content on the marker line", "--- {type: Mesh, name: a}\n", []string{"{type: Mesh, name: a}"}},
		{"marker needs a break", "type: Mesh\nname: ---x\n", []string{"type: Mesh\nname: ---x"}},
		{"crlf", "type: Mesh\r\n---\r\ntype: Zone\r\n", []string{"type: Mesh", "type: Zone"}},
		{"json object", ` {"type":"Mesh","name":"a"} `, []string{`{"type":"Mesh","name":"a"}`}},
		{"json stream", "{\"type\":\"Mesh\"}\n{\"type\":\"Zone\"}", []string{`{"type":"Mesh"}`, `{"type":"Zone"}`}},
		{"json array", `[{"type":"Mesh"}, {"type":"Zone"}]`, []string{`{"type":"Mesh"}`, `{"type":"Zone"}`}},
		{"json documents between markers", "{\"type\":\"Mesh\"}\n---\n{\"type\":\"Zone\"}\n", []string{`{"type":"Mesh"}`, `{"type":"Zone"}`}},
		{"byte order mark", "\xef\xbb\xbftype: Mesh\n", []string{"type: Mesh"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := SplitDocuments([]byte(tc.input))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range docs {
				got = append(got, strings.TrimSpace(strings.ReplaceAll(string(d), "\r", "")))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	for input, want := range map[string]string{
		"":                       "no documents: the input is empty",
		" \n\t":                  "no documents: the input is empty",
		"# nothing\n---\n---\n":  "no documents: the input holds only comments and separators",
		"[]":                     "no documents: the JSON array is empty",
		"[{\"a\":1},\n{\"b\":}]": "invalid JSON: line 2, column 6: invalid character '}' looking for beginning of value",
	} {
		if _, err := SplitDocuments([]byte(input)); err == nil || err.Error() != want {
			t.Errorf("SplitDocuments(%q) error = %v, want %q", input, err, want)
		}
	}
}

func decodeOne(t *testing.T, doc string) *Resource {
	t.Helper()
	r, err := NewDefaultRegistry().Decode([]byte(doc))
	if err != nil {
		t.Fatalf("Decode: %v", describeErr(err))
	}
	return r
}

func TestDecodeUniversal(t *testing.T) {
	r := decodeOne(t, `
type: Dataplane
mesh: default
name: web-1
namespace: web-ns
labels: {team: a}
networking:
  address: 10.0.0.1
  inbound: [{port: 80, tags: {kuma.io/service: web}}]
creationTime: "2024-01-02T15:04:05Z"
modificationTime: "2024-01-03T15:04:05.5+02:00"
version: 7
status: {ready: true}
`)
	want := &Resource{
		Type: "Dataplane", Mesh: "default", Name: "web-1", Namespace: "web-ns", Labels: NewLabels(map[string]string{"team": "a"}),
		Spec:         json.RawMessage(`{"networking":{"address":"10.0.0.1","inbound":[{"port":80,"tags":{"kuma.io/service":"web"}}]}}`),
		Status:       json.RawMessage(`{"ready":true}`),
		CreationTime: time.Date(2024, 1, 2, 15, 4, 5, 0, time.UTC), Version: 7,
	}
	want.ModificationTime, _ = time.Parse(time.RFC3339, "2024-01-03T15:04:05.5+02:00")
	if !equalResources(r, want) {
		t.Errorf("got  %+v\nwant %+v", r, want)
	}
	under := decodeOne(t, `{"type":"Dataplane","mesh":"default","name":"web-1","spec":{"networking":{"address":"10.0.0.1"}},"version":"12"}`)
	if string(under.Spec) != `{"networking":{"address":"10.0.0.1"}}` || under.Version != 12 {
		t.Errorf("spec form: %s, version %d", under.Spec, under.Version)
	}
	policy := decodeOne(t, "type: TrafficPermission\nname: p\nsources: []\ndestinations: []\n")
	if string(policy.Spec) != `{"destinations":[],"sources":[]}` || policy.Mesh != "" {
		t.Errorf("legacy policy: %+v", policy)
	}
}

func TestDecodeKubernetes(t *testing.T) {
	cases := []struct {
		doc      string
		wantMesh string
		wantNS   string
	}{
		{"apiVersion: kuma.io/v1alpha1\nkind: TrafficPermission\nmesh: m1\nmetadata: {name: p}\nspec: {}", "m1", ""},
		{"apiVersion: kuma.io/v1alpha1\nkind: MeshTimeout\nmetadata: {name: p, namespace: a-ns, labels: {kuma.io/mesh: m2}}\nspec: {}", "m2", "a-ns"},
		{"apiVersion: kuma.io/v1alpha1\nkind: MeshTimeout\nmetadata: {name: p}\nspec: {}", "default", ""},
		{"apiVersion: kuma.io/v1alpha1\nkind: Mesh\nmetadata: {name: p, uid: x, resourceVersion: '1', annotations: {a: b}}\nspec: {mtls: {}}", "", ""},
	}
	for _, tc := range cases {
		r := decodeOne(t, tc.doc)
		if r.Mesh != tc.wantMesh || r.Namespace != tc.wantNS || r.Name != "p" {
			t.Errorf("%s:\n got mesh %q namespace %q name %q", tc.doc, r.Mesh, r.Namespace, r.Name)
		}
	}
	r := decodeOne(t, "apiVersion: kuma.io/v1alpha1\nkind: Dataplane\nmesh: default\nmetadata: {name: dp}\nspec: {networking: {address: 1.2.3.4}}")
	if string(r.Spec) != `{"networking":{"address":"1.2.3.4"}}` {
		t.Errorf("spec = %s", r.Spec)
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // causes of a *ValidationError
	}{
		{"no type", "name: a\n", []string{"type: must be set"}},
		{"empty type", "type: ''\n", []string{"type: must be set"}},
		{"type not a string", "type: 5\n", []string{"type: must be a string, got number"}},
		{"unknown type", "type: MeshTimout\nname: x\n", []string{`type: unknown resource type "MeshTimout"`}},
		{"unknown top-level field", "type: MeshTimeout\nname: x\nto: []\nmesh: [a]\n", []string{
			"mesh: must be a string, got list", "to: unknown field"}},
		{"spec and top-level fields", "type: Dataplane\nname: x\nnetworking: {}\nspec: {}\n", []string{
			"spec: must not be set together with top-level spec fields (networking)"}},
		{"spec not an object", "type: MeshTimeout\nname: x\nspec: [1]\n", []string{"spec: must be an object, got list"}},
		{"labels", "type: Mesh\nname: x\nlabels: {a: 1, b: [x]}\n", []string{
			`labels["a"]: must be a string, got number`, `labels["b"]: must be a string, got list`}},
		{"read-only fields", "type: Mesh\nname: x\ncreationTime: yesterday\nversion: -1\nmodificationTime: 5\n", []string{
			`creationTime: invalid time "yesterday": must be RFC 3339, e.g. 2024-01-02T15:04:05Z`,
			"modificationTime: must be a string, got number",
			`version: invalid version "-1": must be a non-negative integer`}},
		{"fractional version", `{"type":"Mesh","name":"x","version":1.5}`, []string{`version: invalid version "1.5": must be a non-negative integer`}},
		{"kubernetes", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", []string{
			`apiVersion: unsupported apiVersion "v1": must be kuma.io/v1alpha1`, `kind: unknown resource type "ConfigMap"`}},
		{"kubernetes fields", "apiVersion: kuma.io/v1alpha1\nkind: MeshTimeout\nmetadata: {name: 5, clusterName: x, labels: []}\ntype: x\n", []string{
			"metadata.clusterName: unknown field", "metadata.labels: must be a map of strings, got list",
			"metadata.name: must be a string, got number", "type: unknown field"}},
		{"kubernetes metadata", "apiVersion: kuma.io/v1alpha1\nkind: Mesh\nmetadata: []\n", []string{"metadata: must be an object, got list"}},
		{"kubernetes without kind", "apiVersion: kuma.io/v1alpha1\n", []string{"kind: must be set"}},
		{"kubernetes other kuma version", "apiVersion: kuma.io/v2\nkind: MeshTimeout\nmetadata: {name: x}\nspec: {}\n", []string{
			`apiVersion: unsupported apiVersion "kuma.io/v2": must be kuma.io/v1alpha1`}},
	}
	reg := NewDefaultRegistry()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reg.Decode([]byte(tc.doc))
			if got := causes(t, err); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestDecodeSyntaxErrors(t *testing.T) {
	cases := map[string]string{
		"":                                 "empty document",
		"type: Mesh\n  name: x\n":          "invalid YAML: line 2: mapping values are not allowed in this context",
		"type: Mesh\ntype: Zone\n":         `invalid YAML: unmarshal errors:`,
		"- type: Mesh\n":                   "a document must be an object (a mapping), got list",
		"just text":                        "a document must be an object (a mapping), got string",
		"{\"type\": \"Mesh\",\n \"name\"}": "invalid JSON: line 2, column 8: invalid character '}' after object key",
		`{"type":"Mesh"} trailing`:         "invalid JSON: line 1, column 17: unexpected data after the JSON value",
	}
	reg := NewDefaultRegistry()
	for doc, want := range cases {
		_, err := reg.Decode([]byte(doc))
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Decode(%q) = %v, want prefix %q", doc, err, want)
		}
		var verr *ValidationError
		if errors.As(err, &verr) {
			t.Errorf("Decode(%q): a syntax error must not be a *ValidationError", doc)
		}
	}
	// A flow-style YAML document that is not JSON still decodes.
	if r := decodeOne(t, "{type: Mesh, name: a}"); r.Name != "a" {
		t.Errorf("flow mapping: %+v", r)
	}
}

// equalResources compares resources with times compared as instants.
func equalResources(a, b *Resource) bool {
	ac, bc := *a, *b
	if !ac.CreationTime.Equal(bc.CreationTime) || !ac.ModificationTime.Equal(bc.ModificationTime) {
		return false
	}
	ac.CreationTime, bc.CreationTime = time.Time{}, time.Time{}
	ac.ModificationTime, bc.ModificationTime = time.Time{}, time.Time{}
	return reflect.DeepEqual(ac, bc)
}

// TestRoundTrip: every example decodes, encodes (JSON and YAML) and
// decodes back to the same resource.
func TestRoundTrip(t *testing.T) {
	reg := NewDefaultRegistry()
	files, _ := filepath.Glob("testdata/valid/*.yaml")
	for _, f := range files {
		for i, doc := range readDocs(t, f) {
			r, err := reg.Decode(doc)
			if err != nil {
				t.Fatalf("%s doc %d: %v", f, i+1, err)
			}
			r.CreationTime = time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
			r.ModificationTime = time.Date(2024, 5, 7, 7, 8, 9, 0, time.FixedZone("x", 3600))
			r.Version = 42
			r.Status = json.RawMessage(`{"conditions":[{"status":"True","type":"Accepted"}]}`)
			for name, encode := range map[string]func(*Resource) ([]byte, error){"json": reg.EncodeJSON, "yaml": reg.EncodeYAML} {
				out, err := encode(r)
				if err != nil {
					t.Fatalf("%s doc %d: encode %s: %v", f, i+1, name, err)
				}
				back, err := reg.Decode(out)
				if err != nil {
					t.Fatalf("%s doc %d: decode %s: %v\n%s", f, i+1, name, describeErr(err), out)
				}
				if !equalResources(back, r) {
					t.Errorf("%s doc %d: %s round trip:\n got  %+v\n want %+v\n%s", f, i+1, name, back, r, out)
				}
			}
		}
	}
}

func TestEncodeShape(t *testing.T) {
	reg := NewDefaultRegistry()
	dp := &Resource{Type: "Dataplane", Mesh: "default", Name: "dp", Spec: json.RawMessage(`{"networking":{"address":"1.2.3.4"}}`)}
	out, err := reg.EncodeJSON(dp)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"type":"Dataplane","mesh":"default","name":"dp","networking":{"address":"1.2.3.4"}}`; string(out) != want {
		t.Errorf("EncodeJSON = %s, want %s", out, want)
	}
	y, err := reg.EncodeYAML(dp)
	if err != nil {
		t.Fatal(err)
	}
	if want := "type: Dataplane\nmesh: default\nname: dp\nnetworking:\n  address: 1.2.3.4\n"; string(y) != want {
		t.Errorf("EncodeYAML =\n%s\nwant\n%s", y, want)
	}
	// A spec Decode could not read back from the top level stays under spec.
	odd := &Resource{Type: "Dataplane", Mesh: "default", Name: "dp", Spec: json.RawMessage(`{"networking":{},"extra":1}`)}
	out, _ = reg.EncodeJSON(odd)
	if !strings.Contains(string(out), `"spec":{"extra":1,"networking":{}}`) {
		t.Errorf("odd spec not nested: %s", out)
	}
	policy := &Resource{Type: "MeshTimeout", Mesh: "default", Name: "t", Spec: json.RawMessage(`{"to":[]}`), Version: 3}
	out, _ = reg.EncodeJSON(policy)
	if want := `{"type":"MeshTimeout","mesh":"default","name":"t","spec":{"to":[]},"version":3}`; string(out) != want {
		t.Errorf("EncodeJSON = %s, want %s", out, want)
	}
	y, _ = reg.EncodeYAML(&Resource{Type: "Mesh", Name: "m", Spec: json.RawMessage(`{"skipCreatingInitialPolicies":["yes","1.0"]}`)})
	if want := "type: Mesh\nname: m\nskipCreatingInitialPolicies:\n- \"yes\"\n- \"1.0\"\n"; string(y) != want {
		t.Errorf("YAML quoting:\n%s", y)
	}
	if _, err := reg.EncodeJSON(&Resource{Type: "Mesh", Name: "m", Spec: json.RawMessage(`{`)}); err == nil {
		t.Error("invalid spec encoded")
	}
}
