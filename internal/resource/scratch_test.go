package resource

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"
)

// TestScratchTreesMatchFreshOnes: a scratch that has lent and taken back
// the trees of every other case parses each case to the value a fresh parse
// gives: recycled maps and arrays carry nothing over.
func TestScratchTreesMatchFreshOnes(t *testing.T) {
	s := &scratch{}
	cases := append([]string{
		`{"a":{"b":[1,2,{"c":"d"}],"e":{}},"f":[]}`,
		`{"a":1,"a":{"x":[true,null]}}`, // a duplicate name: the last wins
		`[{"k":"v"},{"k":"w","l":[[]]}]`,
	}, jsonParseCases...)
	for round := range 3 {
		for _, c := range cases {
			fresh, ok := parseJSONTokens([]byte(c), testVocab, nil)
			if !ok {
				continue
			}
			got, ok := parseJSONTokens([]byte(c), testVocab, s)
			if !ok || !reflect.DeepEqual(got, fresh) {
				t.Fatalf("round %d, %.60q: scratch parse %#v (ok %v), fresh %#v", round, c, got, ok, fresh)
			}
			s.recycle(got)
		}
	}
	if len(s.maps) == 0 || len(s.arrs) == 0 {
		t.Fatalf("nothing was recycled (%d maps, %d arrays)", len(s.maps), len(s.arrs))
	}
	for _, m := range s.maps {
		if len(m) != 0 {
			t.Fatalf("a recycled map still holds %v", m)
		}
	}
}

// TestRecycleKeepsBoundedMemory: outsized maps and arrays are left to the
// collector, and a scratch keeps at most scratchKeep of each.
func TestRecycleKeepsBoundedMemory(t *testing.T) {
	s := &scratch{}
	big := map[string]any{}
	for i := range scratchBigMap + 1 {
		big[fmt.Sprint(i)] = i
	}
	s.recycle(big)
	s.recycle(make([]any, 0, scratchBigArray+1))
	if len(s.maps) != 0 || len(s.arrs) != 0 {
		t.Fatalf("kept outsized values: %d maps, %d arrays", len(s.maps), len(s.arrs))
	}
	many := make([]any, 0, scratchBigArray)
	for range scratchBigArray {
		many = append(many, map[string]any{"k": []any{"v"}})
	}
	for range 4 {
		s.recycle(append([]any(nil), many...))
	}
	if len(s.maps) > scratchKeep || len(s.arrs) > scratchKeep {
		t.Fatalf("kept %d maps and %d arrays, at most %d each", len(s.maps), len(s.arrs), scratchKeep)
	}
	var nilMap map[string]any
	s.recycle(nilMap)
	if m := s.object(); m == nil {
		t.Fatal("a nil map was lent out")
	}
}

// TestPooledRegistryMatchesFreshOne: decoding, normalizing and validating
// every document of testdata through one registry, in sequence and from
// eight goroutines at once, gives the resources and errors a fresh registry
// (an empty pool) gives each document. Run with -race, it also checks that
// no tree is shared between callers.
func TestPooledRegistryMatchesFreshOne(t *testing.T) {
	files, _ := filepath.Glob("testdata/*/*.yaml")
	var docs [][]byte
	for _, f := range files {
		docs = append(docs, readDocs(t, f)...)
	}
	if len(docs) < 50 {
		t.Fatalf("only %d documents in testdata", len(docs))
	}
	want := make([]string, len(docs))
	for i, doc := range docs {
		want[i] = decodeNormalizeValidate(NewDefaultRegistry(), doc)
	}
	shared := NewDefaultRegistry()
	for i, doc := range docs {
		if got := decodeNormalizeValidate(shared, doc); got != want[i] {
			t.Fatalf("doc %d in sequence:\ngot  %s\nwant %s", i, got, want[i])
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for w := range 8 {
		wg.Go(func() {
			for round := range 5 {
				for i := range docs {
					j := (i + w*7 + round) % len(docs)
					if got := decodeNormalizeValidate(shared, docs[j]); got != want[j] {
						errs <- fmt.Sprintf("doc %d concurrently:\ngot  %s\nwant %s", j, got, want[j])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// decodeNormalizeValidate is the API's write path over one document, as
// text: the resource stored (or the decode error) and the validation error.
func decodeNormalizeValidate(reg *Registry, doc []byte) string {
	r, err := reg.Decode(doc)
	if err != nil {
		return "decode: " + err.Error()
	}
	reg.Normalize(r, plane.DefaultSystemNamespace)
	verr := reg.Validate(r, kubernetesZone())
	out, _ := json.Marshal(r)
	return fmt.Sprintf("%s; validate: %v", out, verr)
}
