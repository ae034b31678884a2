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
		s, err := NewMeshSnapshot(Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", Resources: rs})
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
		reg.Normalize(r, resource.DefaultSystemNamespace)
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
			encode(s.Explain(m.Name, m.Namespace, typ, "", 0, nil))
			for _, in := range dp.inbounds {
				encode(s.Explain(m.Name, m.Namespace, typ, "", in.port, in.tags))
			}
			for _, o := range dp.outbounds {
				encode(s.Explain(m.Name, m.Namespace, typ, o.service, 0, nil))
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
