package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/policyview"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

type fixture struct {
	t     testing.TB
	srv   *httptest.Server
	store *boltstore.Store
}

// Planes of the tests.
var (
	testGlobal = plane.NewGlobal("")
	testZone   = zonePlane("zone-1", plane.EnvKubernetes, false)
)

func zonePlane(name, env string, federated bool) plane.Plane {
	return plane.Plane{Mode: plane.Zone, Zone: name, Environment: env, SystemNamespace: plane.DefaultSystemNamespace, Federated: federated}
}

func newFixture(t testing.TB, p plane.Plane) *fixture {
	t.Helper()
	cfg := api.Config{Plane: p, MaxBodyBytes: 64 << 10, LocalhostIsAdmin: true}
	srv, store := serveAPI(t, cfg)
	f := &fixture{t: t, srv: srv, store: store}
	f.mustDo("PUT", "/meshes/default", `{"type":"Mesh","name":"default"}`, http.StatusCreated)
	return f
}

// serveAPI serves cfg over HTTP on a fresh bbolt store, with the default
// registry when cfg has none and, in zone mode without Snapshots, a running
// policy view; everything stops when the test ends.
func serveAPI(t testing.TB, cfg api.Config) (*httptest.Server, *boltstore.Store) {
	t.Helper()
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg.Store = store
	if cfg.Registry == nil {
		cfg.Registry = resource.NewDefaultRegistry()
	}
	if cfg.Plane.IsZone() && cfg.Snapshots == nil {
		view, err := policyview.New(policyview.Config{Registry: cfg.Registry, Store: store, Plane: cfg.Plane})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = view.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		cfg.Snapshots = view
	}
	h, err := api.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, store
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (f *fixture) do(method, path, body string, hdr ...string) response {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", contentType(body))
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (f *fixture) mustDo(method, path, body string, want int) response {
	f.t.Helper()
	r := f.do(method, path, body)
	if r.status != want {
		f.t.Fatalf("%s %s: status %d, want %d: %s", method, path, r.status, want, r.body)
	}
	return r
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

type apiErr struct {
	Title   string                `json:"title"`
	Details string                `json:"details"`
	Causes  []resource.FieldError `json:"causes"`
}

const timeoutYAML = `type: MeshTimeout
mesh: default
name: t1
spec:
  targetRef:
    kind: Mesh
  to:
    - targetRef:
        kind: Mesh
      default:
        connectionTimeout: %s
`

func TestPutOutcomesAndVersions(t *testing.T) {
	f := newFixture(t, testGlobal)
	r := f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "5s"), http.StatusCreated)
	if got := r.header.Get(api.OutcomeHeader); got != "created" {
		t.Errorf("outcome = %q", got)
	}
	created := decode[map[string]any](t, r.body)
	if created["version"] != float64(1) || created["creationTime"] == "" {
		t.Errorf("created = %v", created)
	}
	r = f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "5s"), http.StatusOK)
	if got := r.header.Get(api.OutcomeHeader); got != "unchanged" {
		t.Errorf("outcome = %q, want unchanged", got)
	}
	r = f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "6s"), http.StatusOK)
	if got := r.header.Get(api.OutcomeHeader); got != "updated" {
		t.Errorf("outcome = %q, want updated", got)
	}
	got := decode[map[string]any](t, f.mustDo("GET", "/meshes/default/meshtimeouts/t1", "", http.StatusOK).body)
	if got["version"] != float64(2) {
		t.Errorf("version = %v, want 2", got["version"])
	}
	if got["labels"].(map[string]any)[resource.LabelOrigin] != "global" {
		t.Errorf("labels = %v", got["labels"])
	}
}

func TestStaleVersionConflicts(t *testing.T) {
	f := newFixture(t, testGlobal)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "5s"), http.StatusCreated)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "6s")+"version: 1\n", http.StatusOK)
	r := f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "7s")+"version: 1\n", http.StatusConflict)
	if e := decode[apiErr](t, r.body); e.Title != "Conflict" {
		t.Errorf("error = %+v", e)
	}
}

func TestBadRequests(t *testing.T) {
	f := newFixture(t, testGlobal)
	tests := []struct {
		name, method, path, body string
		status                   int
		field                    string
	}{
		{"invalid duration", "PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, `"5 s"`), 400, "spec.to[0].default.connectionTimeout"},
		{"malformed json", "PUT", "/meshes/default/meshtimeouts/t1", `{"type": `, 400, ""},
		{"empty body", "PUT", "/meshes/default/meshtimeouts/t1", ``, 400, ""},
		{"name mismatch", "PUT", "/meshes/default/meshtimeouts/other", fmt.Sprintf(timeoutYAML, "5s"), 400, "name"},
		{"unknown mesh", "PUT", "/meshes/nope/meshtimeouts/t1", strings.Replace(fmt.Sprintf(timeoutYAML, "5s"), "mesh: default", "mesh: nope", 1), 400, "mesh"},
		{"unknown type", "GET", "/meshes/default/meshtimeoutz", "", 404, ""},
		{"unknown resource", "GET", "/meshes/default/meshtimeouts/none", "", 404, ""},
		{"bad size", "GET", "/meshes/default/meshtimeouts?size=x", "", 400, "size"},
		{"oversized body", "PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "5s") + "# " + strings.Repeat("x", 70<<10) + "\n", 413, ""},
		{"zone origin on global", "PUT", "/meshes/default/meshtimeouts/t1", strings.Replace(fmt.Sprintf(timeoutYAML, "5s"), "spec:", "labels:\n  kuma.io/origin: zone\nspec:", 1), 403, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := f.do(tc.method, tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			e := decode[apiErr](t, r.body)
			if e.Title == "" || e.Details == "" || e.Causes == nil {
				t.Errorf("error body missing title/details/causes: %s", r.body)
			}
			if tc.field == "" {
				return
			}
			for _, c := range e.Causes {
				if c.Field == tc.field {
					return
				}
			}
			t.Errorf("causes %+v do not name %q", e.Causes, tc.field)
		})
	}
	// Nothing that was rejected was stored.
	if r := f.do("GET", "/meshes/default/meshtimeouts", ""); !strings.Contains(string(r.body), `"total":0`) {
		t.Errorf("rejected writes were stored: %s", r.body)
	}
}

func TestListPaginationAndFilters(t *testing.T) {
	f := newFixture(t, testGlobal)
	for i := 0; i < 5; i++ {
		body := strings.Replace(fmt.Sprintf(timeoutYAML, "5s"), "name: t1", fmt.Sprintf("name: t%d\nlabels:\n  team: %s", i, []string{"a", "b"}[i%2]), 1)
		f.mustDo("PUT", fmt.Sprintf("/meshes/default/meshtimeouts/t%d", i), body, http.StatusCreated)
	}
	type page struct {
		Total int              `json:"total"`
		Items []map[string]any `json:"items"`
		Next  *string          `json:"next"`
	}
	p := decode[page](t, f.mustDo("GET", "/meshes/default/meshtimeouts?size=2", "", 200).body)
	if p.Total != 5 || len(p.Items) != 2 || p.Next == nil {
		t.Fatalf("page 1 = %+v", p)
	}
	var names []string
	for next := p.Next; ; {
		for _, it := range p.Items {
			names = append(names, it["name"].(string))
		}
		if next == nil {
			break
		}
		p = decode[page](t, f.mustDo("GET", strings.TrimPrefix(*next, f.srv.URL), "", 200).body)
		next = p.Next
	}
	if strings.Join(names, ",") != "t0,t1,t2,t3,t4" {
		t.Errorf("names over pages = %v", names)
	}
	for _, q := range []string{"filter[labels.team]=b", "labels=team=b"} {
		p = decode[page](t, f.mustDo("GET", "/meshes/default/meshtimeouts?"+q, "", 200).body)
		if p.Total != 2 {
			t.Errorf("%s: total = %d, want 2", q, p.Total)
		}
	}
}

func TestYAMLResponses(t *testing.T) {
	f := newFixture(t, testGlobal)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "5s"), http.StatusCreated)
	r := f.do("GET", "/meshes/default/meshtimeouts/t1", "", "Accept", "application/yaml")
	if r.header.Get("Content-Type") != "application/yaml" || !strings.Contains(string(r.body), "name: t1") {
		t.Errorf("yaml response: %s %s", r.header.Get("Content-Type"), r.body)
	}
}

func TestZoneRefusesEditsOfGlobalResources(t *testing.T) {
	f := newFixture(t, testZone)
	// What sync would have written: a policy from the global.
	_, err := f.store.Create(context.Background(), &resource.Resource{
		Type: "MeshTimeout", Mesh: "default", Name: "from-global",
		Labels: resource.NewLabels(map[string]string{resource.LabelOrigin: "global"}),
		Spec:   []byte(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1h"}}]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(fmt.Sprintf(timeoutYAML, "5s"), "name: t1", "name: from-global", 1)
	r := f.mustDo("PUT", "/meshes/default/meshtimeouts/from-global", body, http.StatusConflict)
	if !strings.Contains(string(r.body), `origin \"global\"`) {
		t.Errorf("409 does not name the origin: %s", r.body)
	}
	f.mustDo("DELETE", "/meshes/default/meshtimeouts/from-global", "", http.StatusConflict)

	// A zone cannot claim another zone's resources.
	body = strings.Replace(fmt.Sprintf(timeoutYAML, "5s"), "spec:", "labels:\n  kuma.io/zone: zone-2\nspec:", 1)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", body, http.StatusForbidden)

	// Its own resources get origin and zone labels.
	got := decode[map[string]any](t, f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "5s"), http.StatusCreated).body)
	labels := got["labels"].(map[string]any)
	if labels[resource.LabelOrigin] != "zone" || labels[resource.LabelZone] != "zone-1" {
		t.Errorf("labels = %v", labels)
	}
}

func TestDeleteMeshRemovesItsResources(t *testing.T) {
	f := newFixture(t, testGlobal)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t1", fmt.Sprintf(timeoutYAML, "5s"), http.StatusCreated)
	f.mustDo("DELETE", "/meshes/default", "", http.StatusOK)
	f.mustDo("GET", "/meshes/default", "", http.StatusNotFound)
	f.mustDo("PUT", "/meshes/default", `{"type":"Mesh","name":"default"}`, http.StatusCreated)
	f.mustDo("GET", "/meshes/default/meshtimeouts/t1", "", http.StatusNotFound)
}

func TestIndexAndHealth(t *testing.T) {
	f := newFixture(t, testZone)
	idx := decode[map[string]any](t, f.mustDo("GET", "/", "", 200).body)
	if idx["mode"] != "zone" || idx["zone"] != "zone-1" || idx["product"] != "Meridian" {
		t.Errorf("index = %v", idx)
	}
	f.mustDo("GET", "/healthz", "", 200)
	f.mustDo("GET", "/readyz", "", 200)
}

// TestSystemNamespaceInBodyAndURL: metadata.namespace:
// kuma-system (Kubernetes shape) or namespace: kuma-system (Universal shape)
// with ?namespace=kuma-system, as meridianctl sends it, is the system
// namespace on the global and on a Kubernetes zone; a real mismatch names
// both values as the caller sent them.
func TestSystemNamespaceInBodyAndURL(t *testing.T) {
	universal := `{"type":"MeshTimeout","mesh":"default","name":"t1","namespace":"kuma-system","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}]}}`
	kube := "apiVersion: kuma.io/v1alpha1\nkind: MeshTimeout\nmetadata:\n  name: t1\n  namespace: kuma-system\n  labels:\n    kuma.io/mesh: default\nspec:\n  targetRef:\n    kind: Mesh\n  to:\n    - targetRef:\n        kind: Mesh\n      default:\n        idleTimeout: 5s\n"
	for _, p := range []plane.Plane{testGlobal, testZone} {
		mode := p.Mode
		for _, tc := range []struct {
			name, query, body string
			want              int
			msg               string
		}{
			{"universal shape, URL names it", "?namespace=kuma-system", universal, http.StatusCreated, ""},
			{"kubernetes shape, URL names it", "?namespace=kuma-system", kube, http.StatusCreated, ""},
			{"universal shape, no namespace in URL", "", universal, http.StatusCreated, ""},
			{"kubernetes shape, no namespace in URL", "", kube, http.StatusCreated, ""},
			{"body system, URL another", "?namespace=web", universal, http.StatusBadRequest, `\"kuma-system\" in the body does not match \"web\" in the URL`},
			{"body another, URL system", "?namespace=kuma-system", strings.Replace(universal, `"namespace":"kuma-system"`, `"namespace":"web"`, 1), http.StatusBadRequest, `\"web\" in the body does not match \"kuma-system\" in the URL`},
		} {
			t.Run(string(mode)+"/"+tc.name, func(t *testing.T) {
				f := newFixture(t, p)
				r := f.do("PUT", "/meshes/default/meshtimeouts/t1"+tc.query, tc.body)
				if r.status != tc.want || !strings.Contains(string(r.body), tc.msg) {
					t.Fatalf("status %d, want %d with %s: %s", r.status, tc.want, tc.msg, r.body)
				}
				if tc.want != http.StatusCreated {
					return
				}
				got := decode[map[string]any](t, f.mustDo("GET", "/meshes/default/meshtimeouts/t1?namespace=kuma-system", "", http.StatusOK).body)
				if got["name"] != "t1" {
					t.Fatalf("stored as %v", got)
				}
			})
		}
	}
}

// TestDryRun: ?dryRun=true runs every check of a PUT and stores nothing.
func TestDryRun(t *testing.T) {
	f := newFixture(t, testGlobal)
	body := `{"type":"MeshTimeout","mesh":"default","name":"t","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}]}}`
	r := f.mustDo("PUT", "/meshes/default/meshtimeouts/t?dryRun=true", body, http.StatusCreated)
	if got := r.header.Get(api.OutcomeHeader); got != "created (dry run)" {
		t.Errorf("outcome %q", got)
	}
	f.mustDo("GET", "/meshes/default/meshtimeouts/t", "", http.StatusNotFound)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t?dryRun=true", strings.Replace(body, "5s", "soon", 1), http.StatusBadRequest)
	f.mustDo("PUT", "/meshes/nope/meshtimeouts/t?dryRun=true", strings.Replace(body, `"default","name"`, `"nope","name"`, 1), http.StatusBadRequest)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t", body, http.StatusCreated)
	r = f.mustDo("PUT", "/meshes/default/meshtimeouts/t?dryRun=1", strings.Replace(body, "5s", "6s", 1), http.StatusOK)
	if got := r.header.Get(api.OutcomeHeader); got != "updated (dry run)" {
		t.Errorf("outcome %q", got)
	}
	if got := string(f.mustDo("GET", "/meshes/default/meshtimeouts/t", "", http.StatusOK).body); !strings.Contains(got, `"5s"`) {
		t.Errorf("a dry run changed the stored resource: %s", got)
	}
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t?dryRun=maybe", body, http.StatusBadRequest)
}

// contentType is what a client states for a test's body: JSON or YAML.
func contentType(body string) string {
	if b := strings.TrimSpace(body); strings.HasPrefix(b, "{") || strings.HasPrefix(b, "[") {
		return "application/json"
	}
	return "application/yaml"
}
