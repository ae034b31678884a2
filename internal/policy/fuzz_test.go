package policy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"

	jsonv2 "github.com/go-json-experiment/json"
	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// FuzzSnapshot feeds arbitrary (unvalidated) resources to every entry point:
// nothing may panic, and every result must encode as JSON. Seeds are the
// golden inputs (testdata/fuzz/FuzzSnapshot, rewritten by -update).
func FuzzSnapshot(f *testing.F) {
	f.Add([]byte(`[{"type":"Dataplane","mesh":"default","name":"d","networking":{"address":"a","inbound":[{"port":1,"tags":{"kuma.io/service":"s"}}]}}]`))
	f.Add([]byte(`{"type":"MeshTrafficPermission","mesh":"default","name":"p","spec":{"targetRef":{"kind":"MeshHTTPRoute","name":"p"},"from":[{"targetRef":{"kind":"MeshServiceSubset","name":"a","tags":{"kuma.io/service":"b"}},"default":{"action":"Allow"}}]}}`))
	reg := resource.NewDefaultRegistry()
	f.Fuzz(func(t *testing.T, data []byte) {
		rs := fuzzResources(reg, data)
		s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: rs})
		if err != nil {
			return
		}
		exercise(t, s, rs)
	})
}

// fuzzResources decodes what it can; the engine must cope with resources
// that never passed validation.
func fuzzResources(reg *resource.Registry, data []byte) []*resource.Resource {
	docs, err := resource.SplitDocuments(data)
	if err != nil {
		return nil
	}
	seen := map[resource.Key]bool{}
	var rs []*resource.Resource
	for _, doc := range docs {
		r, err := reg.Decode(doc)
		if err != nil {
			continue
		}
		if d, _ := reg.Lookup(r.Type); d.Scope == resource.ScopeMesh {
			r.Mesh = "default"
		}
		reg.Normalize(r, plane.DefaultSystemNamespace)
		if seen[r.Key()] {
			continue
		}
		seen[r.Key()] = true
		rs = append(rs, r)
	}
	return rs
}

func exercise(t *testing.T, s *MeshSnapshot, rs []*resource.Resource) {
	encode := func(v any, err error) {
		if err != nil {
			return
		}
		if _, err := json.Marshal(v); err != nil {
			t.Fatalf("result does not encode: %v", err)
		}
	}
	for _, m := range s.Dataplanes() {
		encode(s.Rules(m.Name, m.Namespace))
		encode(s.Config(m.Name, m.Namespace))
		dp, _ := s.dataplane(m.Name, m.Namespace)
		for _, in := range dp.inbounds {
			encode(s.EvaluateInbound(m.Name, m.Namespace, in.port, in.tags))
			encode(s.EvaluateInbound(m.Name, m.Namespace, in.port, nil))
		}
		for _, o := range dp.outbounds {
			encode(s.EvaluateOutbound(m.Name, m.Namespace, o.service))
		}
		for _, typ := range s.typeNames {
			encode(s.Explain(m.Name, m.Namespace, typ, ExplainTarget{}))
			for _, in := range dp.inbounds {
				encode(s.Explain(m.Name, m.Namespace, typ, ExplainTarget{Inbound: in.port, Client: in.tags}))
			}
			for _, o := range dp.outbounds {
				encode(s.Explain(m.Name, m.Namespace, typ, ExplainTarget{Outbound: o.service}))
			}
		}
	}
	for _, r := range rs {
		encode(s.MatchedDataplanes(r.Type, r.Name, r.Namespace))
		encode(s.PolicyStatus(r.Type, r.Name, r.Namespace))
	}
}

// FuzzDefaultsOverrides drives TestPropertyDefaultsOverrides* from fuzzer
// input: the bytes seed the generator of policies and clients.
func FuzzDefaultsOverrides(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 42, 1 << 40} {
		f.Add(seed, seed*7+1)
	}
	reg := resource.NewDefaultRegistry()
	f.Fuzz(func(t *testing.T, a, b uint64) {
		r := rand.New(rand.NewPCG(a, b))
		list := "to"
		if a%2 == 1 {
			list = "from"
		}
		rs, entries := doCase(r, list)
		snap := doSnapshot(t, reg, rs)
		if list == "to" {
			checkDOOutbound(t, reg, snap, rs, entries)
			return
		}
		for c := 0; c < 10; c++ {
			checkDOClient(t, reg, snap, rs, entries, nil, randomClient(r))
		}
	})
}

// FuzzFromRules drives the property of TestPropertyMeshTrafficPermission
// from fuzzer input: the bytes seed the generator of policies and clients.
func FuzzFromRules(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 42, 1 << 40} {
		f.Add(seed, seed*7+1)
	}
	reg := resource.NewDefaultRegistry()
	f.Fuzz(func(t *testing.T, a, b uint64) {
		r := rand.New(rand.NewPCG(a, b))
		conf := func() any {
			if r.IntN(2) == 0 {
				return map[string]any{"action": propAction[r.IntN(len(propAction))]}
			}
			return map[string]any{"action": propAction[r.IntN(len(propAction))], "x": fmt.Sprint(r.IntN(3))}
		}
		checkPropCase(t, reg, r, mtpType, conf, 20)
	})
}

// TestFuzzSeedsUpToDate keeps testdata/fuzz/FuzzSnapshot in line with the
// golden inputs; -update rewrites it.
func TestFuzzSeedsUpToDate(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/*/input.yaml")
	dir := filepath.Join("testdata", "fuzz", "FuzzSnapshot")
	for _, in := range inputs {
		data, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		var gc goldenCase
		if err := yaml.Unmarshal(data, &gc); err != nil {
			t.Fatal(err)
		}
		docs, _ := json.Marshal(gc.Resources)
		seed := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", docs)
		path := filepath.Join(dir, filepath.Base(filepath.Dir(in)))
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(seed), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		have, err := os.ReadFile(path)
		if err != nil || !reflect.DeepEqual(strings.TrimSpace(string(have)), strings.TrimSpace(seed)) {
			t.Errorf("%s is missing or stale: run go test -run TestFuzzSeedsUpToDate -update", path)
		}
	}
}

// FuzzReadSpecMatchesUnmarshal: readSpec, the strict v2 decoder with
// encoding/json behind it, reads every spec as encoding/json's Unmarshal
// does (readSpecStd): the same fields and decoded values, and a refusal
// where Unmarshal refuses. Seeds: the spec of every golden input, and
// specs that the strict decoder refuses and hands to Unmarshal.
func FuzzReadSpecMatchesUnmarshal(f *testing.F) {
	for _, seed := range []string{
		`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"b","labels":{"a":"b"}},"default":{"connectionTimeout":"2s","n":1.50}}]}`,
		`{"targetRef":{"Kind":"Mesh"}}`,
		`{"to":[null,{"default":null}],"unset":["a.b"],"strategy":{"default":"atomic"},"when":{"override":"x > 1"}}`,
		`{"to":{}}`,
		`{"targetRef":{"tags":{"a":null}}}`,
		`{"unset":[null]}`,
		`{"rules":[{"matches":[{"spiffeID":{"type":"Exact","value":"spiffe://a"}},null,{"spiffeID":null}],"default":{}}]}`,
		`{"sources":[{"match":{"kuma.io/service":"*"}}],"destinations":[null],"conf":{"a":[1,2]}}`,
		`{"targetRef":{"kind":"Mesh","KIND":"MeshService"}}`,
		`{"to":[{"rules":[{"default":{}}],"hostnames":["a"]}]}`,
		`[]`, `null`, `"x"`, `{"default":"\xff"}`,
	} {
		f.Add([]byte(seed))
	}
	for _, spec := range goldenSpecs(f) {
		f.Add([]byte(spec))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, gotErr := readSpec(raw)
		want, wantErr := readSpecStd(raw)
		if len(raw) == 0 {
			want, wantErr = &rawSpec{}, nil
		}
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("readSpec(%q): error %v, Unmarshal's %v", raw, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("readSpec(%q) =\n%#v\nUnmarshal:\n%#v", raw, got, want)
		}
	})
}

// goldenSpecs are the policy specs of every golden input, as stored.
func goldenSpecs(tb testing.TB) []json.RawMessage {
	tb.Helper()
	inputs, err := filepath.Glob(filepath.Join("testdata", "*", "input.yaml"))
	if err != nil || len(inputs) == 0 {
		tb.Fatalf("golden inputs: %v (%d)", err, len(inputs))
	}
	reg := resource.NewDefaultRegistry()
	var specs []json.RawMessage
	for _, in := range inputs {
		for _, doc := range readCase(tb, in).Resources {
			r, err := reg.Decode(doc)
			if err != nil {
				tb.Fatalf("%s: %v", in, err)
			}
			if d, _ := reg.Lookup(r.Type); d.Shape != resource.ShapeNone && len(r.Spec) > 0 {
				reg.Normalize(r, plane.DefaultSystemNamespace)
				specs = append(specs, r.Spec)
			}
		}
	}
	return specs
}

// TestReadSpecStrictReadsTheGoldenSpecs: the golden inputs' specs (Kuma's
// policy shapes, the documented examples) are read by the strict decoder, not
// handed to encoding/json, so the fast read is the one policies get.
func TestReadSpecStrictReadsTheGoldenSpecs(t *testing.T) {
	specs := goldenSpecs(t)
	for _, spec := range specs {
		if err := jsonv2.Unmarshal(spec, &rawSpec{}, strictSpec); err != nil {
			t.Errorf("strict read of %s: %v", spec, err)
		}
	}
	t.Logf("%d specs", len(specs))
}
