package api_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/revocation"
	"github.com/meridian-mesh/meridian/internal/storage"
)

type fixedClock struct{ now time.Time }

func (c *fixedClock) Now() time.Time { return c.now }

func newUsers(t *testing.T, clock auth.Clock) *revocation.UserTokens {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, err := auth.NewUserTokens(key, clock)
	if err != nil {
		t.Fatal(err)
	}
	list, err := revocation.Open(context.Background(), revocation.Config{Store: &metaStore{}, MetaKey: "revoked", Remember: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return revocation.NewUserTokens(u, list)
}

// metaStore keeps meta values in memory, for a revocation list.
type metaStore struct {
	mu   sync.Mutex
	meta map[string][]byte
}

func (m *metaStore) Meta(_ context.Context, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.meta[key]; ok {
		return v, nil
	}
	return nil, storage.ErrNotFound
}

func (m *metaStore) Apply(_ context.Context, b storage.Batch) (*storage.BatchResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.meta == nil {
		m.meta = map[string][]byte{}
	}
	for k, v := range b.Meta {
		m.meta[k] = v
	}
	return &storage.BatchResult{}, nil
}

func issue(t *testing.T, u *revocation.UserTokens, name string, groups, meshes []string, validFor time.Duration) string {
	t.Helper()
	tok, _, err := u.Issue(auth.UserTokenRequest{Name: name, Groups: groups, Meshes: meshes, ValidFor: validFor})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestAuthorizationMatrix: every kind of route × every kind of caller, with
// localhost-is-admin off, on a global.
func TestAuthorizationMatrix(t *testing.T) {
	clock := &fixedClock{now: time.Now()}
	users := newUsers(t, clock)
	other := newUsers(t, clock)
	srv, _ := serveAPI(t, api.Config{Plane: testGlobal, Users: users, Metrics: http.NotFoundHandler()})

	admin := issue(t, users, "root", []string{auth.GroupAdmin}, nil, time.Hour)
	viewer := issue(t, users, "ro", []string{auth.GroupViewer}, nil, time.Hour)
	scoped := issue(t, users, "team-a", []string{auth.GroupAdmin}, []string{"default"}, time.Hour)
	expired := issue(t, users, "old", []string{auth.GroupAdmin}, nil, time.Second)
	foreign := issue(t, other, "root", []string{auth.GroupAdmin}, nil, time.Hour)

	do := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != "" {
			req.Header.Set("Content-Type", contentType(body))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == 401 && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s %s: 401 without WWW-Authenticate", method, path)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := do("PUT", "/meshes/default", admin, `{"type":"Mesh","name":"default"}`); code != 201 {
		t.Fatalf("admin creates mesh: %d %s", code, body)
	}
	clock.now = clock.now.Add(2 * time.Second) // "expired" is past its validity now

	timeout := `{"type":"MeshTimeout","mesh":"default","name":"t","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}}`
	routes := []struct {
		method, path, body string
		// want per caller: anonymous, viewer, admin, scoped, expired, foreign
		want [6]int
	}{
		{"GET", "/", "", [6]int{200, 200, 200, 200, 200, 200}},
		{"GET", "/healthz", "", [6]int{200, 200, 200, 200, 200, 200}},
		{"GET", "/readyz", "", [6]int{200, 200, 200, 200, 200, 200}},
		{"GET", "/metrics", "", [6]int{401, 404, 404, 403, 401, 401}},
		{"GET", "/meshes", "", [6]int{401, 200, 200, 200, 401, 401}},
		{"GET", "/meshes/default", "", [6]int{401, 200, 200, 200, 401, 401}},
		{"PUT", "/meshes/default/meshtimeouts/t", timeout, [6]int{401, 403, 201, 200, 401, 401}},
		{"GET", "/meshes/default/meshtimeouts", "", [6]int{401, 200, 200, 200, 401, 401}},
		{"GET", "/meshes/default/meshtimeouts/t", "", [6]int{401, 200, 200, 200, 401, 401}},
		{"PUT", "/meshes/other", `{"type":"Mesh","name":"other"}`, [6]int{401, 403, 201, 403, 401, 401}},
		{"GET", "/meshes/other/meshtimeouts", "", [6]int{401, 200, 200, 403, 401, 401}},
		{"GET", "/meshes/default%2Fx/meshtimeouts", "", [6]int{401, 200, 200, 403, 401, 401}},
		{"DELETE", "/meshes/other", "", [6]int{401, 403, 200, 403, 401, 401}},
		{"POST", "/tokens/user", `{"name":"x","groups":["mesh-system:viewer"],"validFor":"1h"}`, [6]int{401, 403, 200, 403, 401, 401}},
		{"GET", "/zones", "", [6]int{401, 200, 200, 403, 401, 401}},
		{"DELETE", "/meshes/default/meshtimeouts/t", "", [6]int{401, 403, 404, 200, 401, 401}},
	}
	callers := []struct{ name, token string }{{"anonymous", ""}, {"viewer", viewer}, {"admin", admin}, {"scoped", scoped}, {"expired", expired}, {"foreign", foreign}}
	// Callers run in column order: for the PUT of t the admin creates (201)
	// and the scoped admin then updates (200); for deletes the unscoped
	// admin goes last, so the scoped admin's delete of t succeeds and the
	// admin's finds nothing.
	for _, rt := range routes {
		order := []int{0, 1, 2, 3, 4, 5}
		if rt.method == "DELETE" {
			order = []int{0, 1, 3, 4, 5, 2} // the unscoped admin deletes last
		}
		for _, i := range order {
			c := callers[i]
			code, body := do(rt.method, rt.path, c.token, rt.body)
			if code != rt.want[i] {
				t.Errorf("%s %s as %s: %d, want %d: %s", rt.method, rt.path, c.name, code, rt.want[i], body)
			}
		}
	}
}

// TestZoneAuthorizationMatrix: the zone's routes (inspect endpoints
// included) × callers, localhost-is-admin off. A = allowed (any status but
// 401/403), U = 401, F = 403.
func TestZoneAuthorizationMatrix(t *testing.T) {
	clock := &fixedClock{now: time.Now()}
	users := newUsers(t, clock)
	other := newUsers(t, clock)
	srv, _ := serveAPI(t, api.Config{Plane: zonePlane("zone-1", plane.EnvUniversal, false), Users: users})
	admin := issue(t, users, "root", []string{auth.GroupAdmin}, nil, time.Hour)
	callers := []struct{ name, token string }{
		{"anonymous", ""},
		{"viewer", issue(t, users, "ro", []string{auth.GroupViewer}, nil, time.Hour)},
		{"admin", admin},
		{"scoped", issue(t, users, "team", []string{auth.GroupAdmin}, []string{"default"}, time.Hour)},
		{"expired", issue(t, users, "old", []string{auth.GroupAdmin}, nil, time.Second)},
		{"foreign", issue(t, other, "root", []string{auth.GroupAdmin}, nil, time.Hour)},
	}
	clock.now = clock.now.Add(2 * time.Second)
	do := func(method, path, token, body string) int {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != "" {
			req.Header.Set("Content-Type", contentType(body))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := do("PUT", "/meshes/default", admin, `{"type":"Mesh","name":"default"}`); code != 201 {
		t.Fatalf("create mesh: %d", code)
	}
	dp := `{"type":"Dataplane","mesh":"default","name":"dp","networking":{"address":"10.0.0.1","inbound":[{"port":80,"tags":{"kuma.io/service":"web"}}]}}`
	routes := []struct {
		method, path, body string
		want               string // per caller, in order: anonymous viewer admin scoped expired foreign
	}{
		{"GET", "/meshes/default/dataplanes/dp/_rules", "", "UAAAUU"},
		{"GET", "/meshes/default/dataplanes/dp/_config", "", "UAAAUU"},
		{"GET", "/meshes/default/dataplanes/dp/_evaluate?inbound=80", "", "UAAAUU"},
		{"GET", "/meshes/default/dataplanes/dp/_explain?type=MeshTimeout", "", "UAAAUU"},
		{"GET", "/meshes/default/meshtimeouts/t/_resources/dataplanes", "", "UAAAUU"},
		{"PUT", "/meshes/default/dataplanes/dp", dp, "UFAAUU"},
		{"GET", "/meshes/other/dataplanes", "", "UAAFUU"},
		{"POST", "/tokens/user", `{"name":"x","groups":["mesh-system:viewer"],"validFor":"1h"}`, "UFAFUU"},
		{"DELETE", "/meshes/default/dataplanes/dp", "", "UFAAUU"},
	}
	for _, rt := range routes {
		for i, c := range callers {
			code := do(rt.method, rt.path, c.token, rt.body)
			got := "A"
			switch code {
			case 401:
				got = "U"
			case 403:
				got = "F"
			}
			if want := string(rt.want[i]); got != want {
				t.Errorf("%s %s as %s: %d (%s), want %s", rt.method, rt.path, c.name, code, got, want)
			}
		}
	}
}
