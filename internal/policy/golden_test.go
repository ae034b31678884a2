package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"

	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/resource"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/<case>/golden.json")

// goldenCase is testdata/<case>/input.yaml: resources, requests and, per
// request, the values checked by hand against the documented semantics (expect).
type goldenCase struct {
	Description     string            `json:"description"`
	Notes           []string          `json:"notes"`
	Mesh            string            `json:"mesh"`
	Zone            string            `json:"zone"`
	SystemNamespace string            `json:"systemNamespace"`
	Resources       []json.RawMessage `json:"resources"`
	Requests        []goldenRequest   `json:"requests"`
}

// goldenRequest is one query. Kind is rules, config, evaluateInbound,
// evaluateOutbound, matchedDataplanes, explain (type with service, or port
// and client, or neither for proxy-wide) or status (type, name).
type goldenRequest struct {
	Kind      string            `json:"kind"`
	Dataplane string            `json:"dataplane,omitempty"`
	Namespace string            `json:"namespace,omitempty"`
	Port      int               `json:"port,omitempty"`
	Client    map[string]string `json:"client,omitempty"`
	Service   string            `json:"service,omitempty"`
	Route     string            `json:"route,omitempty"`
	Type      string            `json:"type,omitempty"`
	Name      string            `json:"name,omitempty"`
	Note      string            `json:"note,omitempty"`
	// Expect is checked against the response: objects must contain the
	// listed keys (null = key absent), lists must have the same length and
	// match item by item, and an object under a key named "conf" must be
	// equal, not just contain.
	Expect json.RawMessage `json:"expect,omitempty"`
	// ExpectError is a substring of the expected error.
	ExpectError string `json:"expectError,omitempty"`
}

type goldenFile struct {
	Description string         `json:"description"`
	Notes       []string       `json:"notes,omitempty"`
	Results     []goldenResult `json:"results"`
}

type goldenResult struct {
	Request  goldenRequest `json:"request"`
	Response any           `json:"response,omitempty"`
	Error    string        `json:"error,omitempty"`
}

func TestGolden(t *testing.T) {
	dirs, err := filepath.Glob("testdata/*/input.yaml")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, input := range dirs {
		dir := filepath.Dir(input)
		t.Run(filepath.Base(dir), func(t *testing.T) { runGolden(t, dir) })
	}
}

func runGolden(t *testing.T, dir string) {
	gc, snap := loadCase(t, filepath.Join(dir, "input.yaml"))
	out := goldenFile{Description: gc.Description, Notes: gc.Notes}
	for i, req := range gc.Requests {
		resp, err := runRequest(snap, req)
		res := goldenResult{Request: req}
		res.Request.Expect = nil
		switch {
		case err != nil:
			res.Error = err.Error()
			if req.ExpectError == "" || !strings.Contains(err.Error(), req.ExpectError) {
				t.Errorf("request %d (%s): error %v, want %q", i, req.Kind, err, req.ExpectError)
			}
		case req.ExpectError != "":
			t.Errorf("request %d (%s): no error, want %q", i, req.Kind, req.ExpectError)
		default:
			res.Response = resp
			checkExpect(t, fmt.Sprintf("request %d (%s)", i, req.Kind), resp, req.Expect)
		}
		out.Results = append(out.Results, res)
	}
	compareGolden(t, filepath.Join(dir, "golden.json"), out)
}

func loadCase(t *testing.T, path string) (*goldenCase, *MeshSnapshot) {
	t.Helper()
	gc := readCase(t, path)
	if gc.Mesh == "" {
		gc.Mesh = "default"
	}
	if gc.SystemNamespace == "" {
		gc.SystemNamespace = plane.DefaultSystemNamespace
	}
	snap, err := NewMeshSnapshot(Inputs{
		Registry: resource.NewDefaultRegistry(), Mesh: gc.Mesh, Zone: gc.Zone,
		SystemNamespace: gc.SystemNamespace, Resources: decodeResources(t, gc.Resources, gc.SystemNamespace),
	})
	if err != nil {
		t.Fatal(err)
	}
	return gc, snap
}

// readCase reads a golden input, refusing unknown keys.
func readCase(tb testing.TB, path string) *goldenCase {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var gc goldenCase
	if err := yaml.UnmarshalStrict(data, &gc); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return &gc
}

// decodeResources decodes and validates test resources the way the zone API
// would, so that inputs stay realistic.
func decodeResources(t *testing.T, docs []json.RawMessage, sysNS string) []*resource.Resource {
	t.Helper()
	reg := resource.NewDefaultRegistry()
	if sysNS == "" {
		sysNS = plane.DefaultSystemNamespace
	}
	opts := plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvKubernetes, SystemNamespace: sysNS}
	out := make([]*resource.Resource, 0, len(docs))
	for i, doc := range docs {
		r, err := reg.Decode(doc)
		if err != nil {
			t.Fatalf("resources[%d]: %v", i, err)
		}
		reg.Normalize(r, sysNS)
		if err := reg.Validate(r, opts); err != nil {
			var verr *resource.ValidationError
			if errors.As(err, &verr) {
				t.Fatalf("resources[%d] %s: %+v", i, r.Key(), verr.Causes)
			}
			t.Fatalf("resources[%d] %s: %v", i, r.Key(), err)
		}
		out = append(out, r)
	}
	return out
}

func runRequest(s *MeshSnapshot, req goldenRequest) (any, error) {
	switch req.Kind {
	case "rules":
		return s.Rules(req.Dataplane, req.Namespace)
	case "config":
		return s.Config(req.Dataplane, req.Namespace)
	case "evaluateInbound":
		return s.EvaluateInbound(req.Dataplane, req.Namespace, req.Port, req.Client)
	case "evaluateOutbound":
		return s.EvaluateOutbound(req.Dataplane, req.Namespace, req.Service)
	case "matchedDataplanes":
		return s.MatchedDataplanes(req.Type, req.Name, req.Namespace)
	case "explain":
		return s.Explain(req.Dataplane, req.Namespace, req.Type, ExplainTarget{Outbound: req.Service, Route: req.Route, Inbound: req.Port, Client: req.Client})
	case "status":
		return s.PolicyStatus(req.Type, req.Name, req.Namespace)
	}
	return nil, fmt.Errorf("unknown request kind %q", req.Kind)
}

func compareGolden(t *testing.T, path string, out goldenFile) {
	t.Helper()
	got, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the computed output (run with -update and review the diff):\n%s", path, firstDiff(string(want), string(got)))
	}
}

func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n  want: %s\n  got:  %s", i+1, w, g)
		}
	}
	return ""
}

// checkExpect compares resp (marshalled to JSON) with the hand-written
// expectation.
func checkExpect(t *testing.T, what string, resp any, expect json.RawMessage) {
	t.Helper()
	if len(expect) == 0 {
		return
	}
	raw, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(expect, &want); err != nil {
		t.Fatal(err)
	}
	for _, p := range matchExpect("", got, want, false) {
		t.Errorf("%s: %s", what, p)
	}
}

func matchExpect(path string, got, want any, exact bool) []string {
	if exact {
		if !reflect.DeepEqual(got, want) {
			return []string{fmt.Sprintf("%s = %s, want %s", path, compact(got), compact(want))}
		}
		return nil
	}
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s = %s, want an object", path, compact(got))}
		}
		var probs []string
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			gv, present := g[k]
			if w[k] == nil {
				if present && gv != nil {
					probs = append(probs, fmt.Sprintf("%s.%s = %s, want absent", path, k, compact(gv)))
				}
				continue
			}
			if !present {
				probs = append(probs, fmt.Sprintf("%s.%s is absent, want %s", path, k, compact(w[k])))
				continue
			}
			probs = append(probs, matchExpect(path+"."+k, gv, w[k], k == "conf")...)
		}
		return probs
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s = %s, want %d items like %s", path, compact(got), len(w), compact(want))}
		}
		var probs []string
		for i := range w {
			probs = append(probs, matchExpect(fmt.Sprintf("%s[%d]", path, i), g[i], w[i], false)...)
		}
		return probs
	}
	if !reflect.DeepEqual(got, want) {
		return []string{fmt.Sprintf("%s = %s, want %s", path, compact(got), compact(want))}
	}
	return nil
}

func compact(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
