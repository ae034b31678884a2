package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Regression tests for the REST API's admission findings (admission rules).
func TestSecurityFindings(t *testing.T) {
	g := newFixture(t, testGlobal)
	ms := `{"type":"MeshService","mesh":"default","name":"payments","labels":{"kuma.io/zone":"zone-1","k8s.kuma.io/namespace":"pay"},"spec":{"selector":{"dataplaneTags":{"app":"x"}},"ports":[{"port":80}]}}`
	resp := g.do("PUT", "/meshes/default/meshservices/payments", ms)
	if resp.status != http.StatusForbidden || !strings.Contains(string(resp.body), "kuma.io/zone") {
		t.Errorf("global accepts zone labels: %d %s", resp.status, resp.body)
	}
	for _, two := range []string{
		"type: Mesh\nname: a\n---\ntype: Mesh\nname: b\n",
		`{"type":"Mesh","name":"a"} {"type":"Mesh","name":"b"}`,
		`[{"type":"Mesh","name":"a"},{"type":"Mesh","name":"b"}]`,
	} {
		if resp := g.do("PUT", "/meshes/a", two); resp.status != http.StatusBadRequest || !strings.Contains(string(resp.body), "2 documents") {
			t.Errorf("multi-document PUT %q: %d %s", two, resp.status, resp.body)
		}
	}
	long := strings.Repeat("x", 40<<10)
	for _, m := range []string{"GET", "DELETE"} {
		if resp := g.do(m, "/meshes/default/meshtimeouts/"+long, ""); resp.status != http.StatusBadRequest {
			t.Errorf("%s of a 40 KiB name: %d %.200s", m, resp.status, resp.body)
		}
		if resp := g.do(m, "/meshes/"+long, ""); resp.status != http.StatusBadRequest {
			t.Errorf("%s of a 40 KiB mesh: %d %.200s", m, resp.status, resp.body)
		}
	}
	withStatus := `{"type":"MeshTimeout","mesh":"default","name":"t","status":{"forged":true},"spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}}`
	g.mustDo("PUT", "/meshes/default/meshtimeouts/t", withStatus, http.StatusCreated)
	if resp := g.mustDo("GET", "/meshes/default/meshtimeouts/t", "", http.StatusOK); strings.Contains(string(resp.body), "forged") {
		t.Errorf("client status stored: %s", resp.body)
	}
}

// TestYAMLListIsValidAndEquivalent: the streamed YAML list decodes to the
// same document as the JSON one.
func TestYAMLListIsValidAndEquivalent(t *testing.T) {
	g := newFixture(t, testGlobal)
	for i := 0; i < 3; i++ {
		g.mustDo("PUT", fmt.Sprintf("/meshes/default/meshtimeouts/t%d", i), fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":"t%d","labels":{"a":"b"},"spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s","http":{"requestTimeout":"2s"}}}]}}`, i), http.StatusCreated)
	}
	for _, path := range []string{"/meshes/default/meshtimeouts?size=2", "/meshes/default/meshretries"} {
		j := g.mustDo("GET", path, "", http.StatusOK)
		y := g.do("GET", path, "", "Accept", "application/yaml")
		if y.status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, y.status, y.body)
		}
		var fromJSON, fromYAML any
		if err := json.Unmarshal(j.body, &fromJSON); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(y.body, &fromYAML); err != nil {
			t.Fatalf("%s: invalid YAML: %v\n%s", path, err, y.body)
		}
		if !reflect.DeepEqual(fromJSON, fromYAML) {
			t.Errorf("%s: YAML %v differs from JSON %v", path, fromYAML, fromJSON)
		}
	}
}

type fakeRejections map[resource.Key]string

func (f fakeRejections) Rejected(k resource.Key) (string, bool) { msg, ok := f[k]; return msg, ok }

// TestSyncedConditionOnTheZone: a zone policy the global rejected shows a
// Synced False condition where it was written, beside the engine's ones.
func TestSyncedConditionOnTheZone(t *testing.T) {
	rej := fakeRejections{{Type: "MeshTimeout", Mesh: "default", Name: "t"}: "mesh \"default\" does not exist on the global"}
	srv, store := serveAPI(t, api.Config{Plane: zonePlane("zone-1", plane.EnvUniversal, false), LocalhostIsAdmin: true, Rejections: rej})
	f := &fixture{t: t, srv: srv, store: store}
	f.mustDo("PUT", "/meshes/default", `{"type":"Mesh","name":"default"}`, http.StatusCreated)
	f.mustDo("PUT", "/meshes/default/meshtimeouts/t", `{"type":"MeshTimeout","mesh":"default","name":"t","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}}`, http.StatusCreated)
	resp := f.mustDo("GET", "/meshes/default/meshtimeouts/t", "", http.StatusOK)
	if !strings.Contains(string(resp.body), `"type":"Synced","status":"False","reason":"Rejected","message":"rejected by the global control plane: mesh \"default\" does not exist on the global"`) {
		t.Errorf("no Synced condition: %s", resp.body)
	}
}

// TestAnonymousIndexShowsLittle: GET / is open; an anonymous caller of a
// zone learns the product, version and mode, not the global's address or
// the last sync error.
func TestAnonymousIndexShowsLittle(t *testing.T) {
	users := newUsers(t, nil)
	sync := func() any { return map[string]string{"global": "10.0.0.1:5685", "lastError": "dial: refused"} }
	srv, _ := serveAPI(t, api.Config{Plane: zonePlane("zone-1", plane.EnvUniversal, true), Users: users, SyncStatus: sync})
	get := func(token string) map[string]any {
		req, _ := http.NewRequest("GET", srv.URL+"/", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return body
	}
	anon := get("")
	if len(anon) != 3 || anon["mode"] != "zone" || anon["product"] != "Meridian" {
		t.Errorf("anonymous GET /: %v, want product, version and mode only", anon)
	}
	viewer := issue(t, users, "v", []string{auth.GroupViewer}, nil, time.Hour)
	if full := get(viewer); full["sync"] == nil || full["zone"] != "zone-1" {
		t.Errorf("a viewer's GET /: %v, want the zone and its sync state", full)
	}
}

// TestBadNamespaceParameter: a namespace that cannot be one (a NUL byte, an
// upper-case or over-long name) is a 400 on every path, never a 500.
func TestBadNamespaceParameter(t *testing.T) {
	f := newFixture(t, testZone)
	for _, ns := range []string{"a%00b", "Web", strings.Repeat("a", 64), "a.b"} {
		for _, path := range []string{"/meshes/default/meshtimeouts", "/meshes/default/meshtimeouts/x",
			"/meshes/default/dataplanes/web-1/_rules", "/meshes/default/meshtimeouts/x/_resources/dataplanes"} {
			r := f.do("GET", path+"?namespace="+ns, "")
			if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "namespace") {
				t.Errorf("GET %s?namespace=%s: %d %s", path, ns, r.status, r.body)
			}
		}
	}
}

// TestCostlyWhenRefused: a `when` with a regular expression that compiles
// to a large program is refused at write time, naming the field.
func TestCostlyWhenRefused(t *testing.T) {
	f := newFixture(t, testZone)
	body := `{"type":"MeshTimeout","mesh":"default","name":"slow","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},` +
		`"default":{"idleTimeout":"5s"},"when":{"default":"self.idleTimeout.matches('[a-z]{500}[0-9]{500}')"}}]}}`
	r := f.do("PUT", "/meshes/default/meshtimeouts/slow", body)
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "spec.to[0].when.default") ||
		!strings.Contains(string(r.body), "instructions") {
		t.Errorf("PUT with a costly regex: %d %s", r.status, r.body)
	}
}

// TestAppendedListsAreBounded: the MeshProxyPatches of a mesh together are
// at most admission.MaxAppendedBytes, so no proxy's configuration (and
// _rules) carries megabytes of patches; an update within the bound works.
func TestAppendedListsAreBounded(t *testing.T) {
	srv, _ := serveAPI(t, api.Config{Plane: testZone, LocalhostIsAdmin: true})
	f := &fixture{t: t, srv: srv}
	f.mustDo("PUT", "/meshes/default", `{"type":"Mesh","name":"default"}`, http.StatusCreated)
	patch := func(name string, size int) string {
		return fmt.Sprintf(`{"type":"MeshProxyPatch","mesh":"default","name":%q,"spec":{"targetRef":{"kind":"Mesh"},"default":{"appendModifications":[{"cluster":{"operation":"Add","value":%q}}]}}}`,
			name, strings.Repeat("x", size))
	}
	if r := f.do("PUT", "/meshes/default/meshproxypatches/a", patch("a", 600<<10)); r.status != http.StatusCreated {
		t.Fatalf("first patch: %d %s", r.status, r.body)
	}
	r := f.do("PUT", "/meshes/default/meshproxypatches/b", patch("b", 600<<10))
	if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(r.body), "MeshProxyPatch policies of mesh") {
		t.Errorf("second patch: %d %s, want 413", r.status, r.body)
	}
	if r := f.do("PUT", "/meshes/default/meshproxypatches/a", patch("a", 900<<10)); r.status != http.StatusOK {
		t.Errorf("growing the first patch within the bound: %d %s", r.status, r.body)
	}
}

// blockingSnapshots holds every inspect call until released.
type blockingSnapshots struct{ release chan struct{} }

func (b blockingSnapshots) Snapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return nil, fmt.Errorf("mesh %q: %w", mesh, policy.ErrNotFound)
}

func (b blockingSnapshots) StatusSnapshot(context.Context, string) (*policy.MeshSnapshot, error) {
	return nil, policy.ErrNotFound
}

// TestInspectCallsPerCallerAreBounded: a caller with
// DefaultMaxInspectPerCaller inspect calls in flight gets 429 for one more;
// another caller is not held up by it.
func TestInspectCallsPerCallerAreBounded(t *testing.T) {
	users := newUsers(t, nil)
	snaps := blockingSnapshots{release: make(chan struct{})}
	srv, _ := serveAPI(t, api.Config{Plane: zonePlane("zone-1", plane.EnvUniversal, false), Users: users, Snapshots: snaps})
	viewer := issue(t, users, "v", []string{auth.GroupViewer}, nil, time.Hour)
	other := issue(t, users, "w", []string{auth.GroupViewer}, nil, time.Hour)
	get := func(token string) int {
		req, _ := http.NewRequest("GET", srv.URL+"/meshes/default/dataplanes/web-1/_config", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	for range api.DefaultMaxInspectPerCaller {
		wg.Go(func() { get(viewer) })
	}
	time.Sleep(300 * time.Millisecond) // in flight
	if code := get(viewer); code != http.StatusTooManyRequests {
		t.Errorf("one call more: %d, want 429", code)
	}
	done := make(chan int)
	go func() { done <- get(other) }()
	time.Sleep(100 * time.Millisecond)
	close(snaps.release)
	if code := <-done; code == http.StatusTooManyRequests {
		t.Error("another caller was refused")
	}
	wg.Wait()
}
