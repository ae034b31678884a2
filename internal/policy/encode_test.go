package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// materialized is r with its lazy origins made Origin values, as a type
// encoding/json encodes by reflection.
func materialized(r *RulesResult) *plainRules {
	out := plainRules(*r)
	out.Rules = slices.Clone(r.Rules)
	for i, tr := range out.Rules {
		if tr.ProxyRule != nil && tr.ProxyRule.lazy.set {
			ap := *tr.ProxyRule
			ap.Origin, ap.lazy = originsOf(ap.lazy.blocks), lazyOrigin{}
			tr.ProxyRule = &ap
		}
		tr.ToRules = slices.Clone(tr.ToRules)
		for j, to := range tr.ToRules {
			if to.lazy.set {
				to.Origin, to.lazy = originsOf(to.lazy.blocks), lazyOrigin{}
			}
			to.Routes = slices.Clone(to.Routes)
			for k, rc := range to.Routes {
				if rc.lazy.set {
					to.Routes[k].Origin, to.Routes[k].lazy = originsOf(rc.lazy.blocks), lazyOrigin{}
				}
			}
			tr.ToRules[j] = to
		}
		tr.FromRules = slices.Clone(tr.FromRules)
		for j, fr := range tr.FromRules {
			fr.Rules = slices.Clone(fr.Rules)
			for k, rule := range fr.Rules {
				if rule.lazy.set {
					fr.Rules[k].Origin, fr.Rules[k].lazy = originsOf(rule.lazy.blocks), lazyOrigin{}
				}
			}
			tr.FromRules[j] = fr
		}
		out.Rules[i] = tr
	}
	return &out
}

// plainRules is RulesResult without its MarshalJSON.
type plainRules RulesResult

// sameJSON reports whether AppendJSON, writing lazy origins from their
// blocks, and encoding/json on the materialized result agree on r.
func sameJSON(t *testing.T, r *RulesResult) {
	t.Helper()
	want, err := json.Marshal(materialized(r))
	if err != nil {
		t.Fatal(err)
	}
	got := r.AppendJSON(nil)
	var w, g any
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("AppendJSON wrote invalid JSON: %v\n%s", err, got)
	}
	if !reflect.DeepEqual(w, g) {
		t.Errorf("AppendJSON differs from encoding/json:\n got %s\nwant %s", got, want)
	}
}

// TestAppendJSONMatchesEncodingJSON checks the hand-written encoder against
// encoding/json on every golden _rules request and the large benchmark case.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*/input.yaml")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, input := range inputs {
		gc, snap := loadCase(t, input)
		for _, req := range gc.Requests {
			if req.Kind != "rules" {
				continue
			}
			if r, err := snap.Rules(req.Dataplane, req.Namespace); err == nil {
				sameJSON(t, r)
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no golden _rules request checked")
	}
	s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: resource.NewDefaultRegistry(), Mesh: "default", Zone: "zone-1",
		Resources: append(hundredPolicies(), benchDataplane("dp", 50, 0))})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Rules("dp", "")
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, r)
}

func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote\back`, "ctl\x00\x1f\t\n", "<&>", "ünï", "bad\xffutf8", "\u2028\u2029"} {
		want, _ := json.Marshal(s)
		var w, g string
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		got := appendString(nil, s)
		if err := json.Unmarshal(got, &g); err != nil || g != w {
			t.Errorf("appendString(%q) = %s (%q), want %s", s, got, g, want)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	f.Add("a\"b\\c\x01\xff")
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		var w, g string
		_ = json.Unmarshal(want, &w)
		if err := json.Unmarshal(appendString(nil, s), &g); err != nil || g != w {
			t.Fatalf("appendString(%q): %q, want %q (%v)", s, g, w, err)
		}
	})
}

// TestOriginJSON: appendOrigin writes byte for byte what encoding/json
// writes for an origin (without HTML escaping, as AppendJSON documents).
func TestOriginJSON(t *testing.T) {
	zero, five := 0, 5
	metas := []Meta{
		{Type: "MeshTimeout", Mesh: "default", Name: "t"},
		{Type: "MeshTimeout", Mesh: "m<1>", Name: `a"b&c`, Namespace: "ns\u2028x",
			Labels: resource.NewLabels(map[string]string{"kuma.io/origin": "global", "z": "é<tag>", "a": ""})},
		{Type: "MeshTimeout", Mesh: "default", Name: "many", Labels: resource.NewLabels(manyLabels(40))},
	}
	for _, m := range metas {
		for _, entry := range []*int{nil, &zero, &five} {
			for _, block := range []string{"", blockOverride} {
				for _, list := range []string{"", "rules"} {
					o := Origin{Meta: m, Entry: entry, Block: block, List: list}
					var want bytes.Buffer
					enc := json.NewEncoder(&want)
					enc.SetEscapeHTML(false)
					if err := enc.Encode(o); err != nil {
						t.Fatal(err)
					}
					got := appendOrigin([]byte("prefix"), o)
					if string(got) != "prefix"+strings.TrimSuffix(want.String(), "\n") {
						t.Errorf("origin:\n got %s\nwant prefix%s", got, want.String())
					}
				}
			}
		}
	}
}

// manyLabels has more labels than appendStringMap sorts in place.
func manyLabels(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("k%d", (i*7)%n)] = fmt.Sprint(i)
	}
	return m
}

// TestStreamedEncodingsMatch: the API streams inspect results: RulesResult
// through WriteJSON, every other result through the v2 encoder with v1
// semantics. Both must write what AppendJSON and encoding/json write, on
// every golden request.
func TestStreamedEncodingsMatch(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*/input.yaml")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	same := func(name string, v any) {
		t.Helper()
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := jsonv2.MarshalWrite(&got, v, jsonv1.DefaultOptionsV1()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("%s: streamed encoding differs:\n got %s\nwant %s", name, got.Bytes(), want)
		}
		checked++
	}
	for _, input := range inputs {
		gc, snap := loadCase(t, input)
		for _, dp := range snap.dpList {
			if r, err := snap.Rules(dp.res.Name, dp.ns); err == nil {
				var got bytes.Buffer
				if err := r.WriteJSON(&got); err != nil {
					t.Fatal(err)
				}
				if want := r.AppendJSON(nil); !bytes.Equal(got.Bytes(), want) {
					t.Errorf("%s %s: WriteJSON differs from AppendJSON", input, dp.res.Name)
				}
			}
			if c, err := snap.Config(dp.res.Name, dp.ns); err == nil {
				same(input+" _config "+dp.res.Name, c)
			}
		}
		for _, req := range gc.Requests {
			if req.Kind == "rules" || req.Kind == "config" {
				continue
			}
			if v, err := runRequest(snap, req); err == nil {
				same(input+" "+req.Kind, v)
			}
		}
	}
	if checked == 0 {
		t.Fatal("nothing checked")
	}
}

// writeSizes records the size of every Write.
type writeSizes struct {
	bytes.Buffer
	sizes []int
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return w.Buffer.Write(p)
}

// TestWriteJSONStreamsLongOrigins: a long origin list is handed to the
// writer in pieces as it is encoded (a proxy matched by 100,000 policies
// has a 20 MB list), and a list several targets share is written the same
// wherever it appears, in both encodings.
func TestWriteJSONStreamsLongOrigins(t *testing.T) {
	rs := timeouts(3000)
	rs = append(rs, benchDataplane("one", 1, 0), benchDataplane("shared", 3, 0))
	s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: resource.NewDefaultRegistry(), Mesh: "default", Zone: "zone-1", Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	for _, dp := range []string{"one", "shared"} {
		r, err := s.Rules(dp, "")
		if err != nil {
			t.Fatal(err)
		}
		sameJSON(t, r)
		var w writeSizes
		if err := r.WriteJSON(&w); err != nil {
			t.Fatal(err)
		}
		if want := r.AppendJSON(nil); !bytes.Equal(w.Bytes(), want) {
			t.Fatalf("%s: WriteJSON differs from AppendJSON", dp)
		}
		if len(w.sizes) < w.Len()/(2*flushAt) {
			t.Errorf("%s: %d bytes in %d writes", dp, w.Len(), len(w.sizes))
		}
		if dp == "one" {
			if m := slices.Max(w.sizes); m >= 2*flushAt {
				t.Errorf("%s: a write of %d bytes, want pieces under %d", dp, m, 2*flushAt)
			}
		}
	}
}
