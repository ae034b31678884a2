package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/revocation"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

// TestTemplatesParse: every page template parses with the layout (a
// template error would otherwise only show when the process starts).
func TestTemplatesParse(t *testing.T) {
	zone, _ := plane.NewZone("zone-1", plane.EnvKubernetes, "", false)
	for _, p := range []plane.Plane{plane.NewGlobal(""), zone} {
		mode := p.Mode
		c, err := New(Config{API: fakeAPI{}, Plane: p, Registry: resource.NewDefaultRegistry(), Logger: hclog.NewNullLogger()})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		for _, name := range []string{"zones", "zone", "tokens", "meshes", "policies", "resource", "dataplanes", "dataplane", "explain", "login", "error"} {
			if c.pages[name] == nil {
				t.Errorf("%s: no page %s", mode, name)
			}
		}
	}
}

// testServer is a real API server (bbolt store, user tokens) with the
// console, as a global without zones, and a viewer's and an admin's tokens.
func testServer(t *testing.T) (http.Handler, string, string) {
	t.Helper()
	dir := t.TempDir()
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(dir, "meridian.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	tokens, err := auth.LoadOrCreateUserTokens(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := revocation.Open(context.Background(), revocation.Config{Store: store, MetaKey: revocation.MetaUserTokens, Remember: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	users := revocation.NewUserTokens(tokens, revoked)
	ring, err := auth.LoadZoneKeyRing(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := resource.NewDefaultRegistry()
	// The console is addressed as example.com (httptest's Host), a name the
	// operator configured.
	srv, err := api.New(api.Config{Registry: reg, Store: store, Plane: plane.NewGlobal(""), Users: users, LocalhostIsAdmin: true, Tokens: ring,
		AllowedHosts: []string{"example.com"},
		Console: func(s *api.Server) (http.Handler, error) {
			return New(Config{API: s, Plane: plane.NewGlobal(""), Registry: reg, Logger: hclog.NewNullLogger()})
		}})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(group string) string {
		tok, _, err := users.Issue(auth.UserTokenRequest{Name: "u-" + strings.Split(group, ":")[1], Groups: []string{group}, ValidFor: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	return srv, issue(auth.GroupViewer), issue(auth.GroupAdmin)
}

func do(h http.Handler, method, target, remote string, body url.Values, hdr map[string]string) *httptest.ResponseRecorder {
	var req *http.Request
	if body != nil {
		req = httptest.NewRequest(method, target, strings.NewReader(body.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, target, nil)
	}
	req.RemoteAddr = remote
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

const (
	remote = "192.0.2.10:5555" // not loopback: needs a token
	local  = "127.0.0.1:5555"  // loopback: admin (localhost-is-admin)
)

func TestSignInAndCookie(t *testing.T) {
	h, viewer, _ := testServer(t)
	rec := do(h, "GET", "/gui/zones", remote, nil, nil)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/gui/login?next=%2Fgui%2Fzones" {
		t.Fatalf("anonymous remote browser: %d to %q, want a redirect to the login form", rec.Code, rec.Header().Get("Location"))
	}
	same := map[string]string{"Sec-Fetch-Site": "same-origin"}
	rec = do(h, "POST", "/gui/login", remote, url.Values{"token": {"not-a-token"}, "next": {"/gui/zones"}}, same)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "role=\"alert\"") {
		t.Fatalf("bad token: %d %s", rec.Code, rec.Body.String())
	}
	rec = do(h, "POST", "/gui/login", remote, url.Values{"token": {viewer}, "next": {"//evil.example/x"}}, same)
	cookie := rec.Result().Cookies()
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/gui/" || len(cookie) != 1 {
		t.Fatalf("sign in: %d to %q with %d cookies (an off-site next must land on /gui/)", rec.Code, rec.Header().Get("Location"), len(cookie))
	}
	c := cookie[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/gui/" {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/gui/", c)
	}
	withCookie := map[string]string{"Cookie": c.Name + "=" + c.Value}
	if rec := do(h, "GET", "/gui/zones", remote, nil, withCookie); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "viewer") {
		t.Fatalf("zones page with the cookie: %d", rec.Code)
	}
	// The cookie is a console session, not an API credential.
	if rec := do(h, "GET", "/meshes", remote, nil, withCookie); rec.Code != http.StatusUnauthorized {
		t.Errorf("API call with only the console cookie: %d, want 401", rec.Code)
	}
	// A viewer's token page has no actions, and the API refuses them anyway.
	rec = do(h, "GET", "/gui/tokens", remote, nil, withCookie)
	if strings.Contains(rec.Body.String(), `id="issue-token"`) {
		t.Error("a viewer sees the token form")
	}
	post := map[string]string{"Cookie": c.Name + "=" + c.Value, "Sec-Fetch-Site": "same-origin"}
	if rec := do(h, "POST", "/gui/tokens/zone", remote, url.Values{"zone": {"z"}, "validFor": {"1h"}}, post); rec.Code != http.StatusForbidden {
		t.Errorf("a viewer issuing a zone token: %d, want 403", rec.Code)
	}
}

// TestCrossOriginRefused: with localhost-is-admin a browser on the machine
// is admin without a cookie, so a form posted from another site must not
// act through it.
func TestCrossOriginRefused(t *testing.T) {
	h, _, _ := testServer(t)
	form := url.Values{"zone": {"zone-1"}, "validFor": {"1h"}}
	tests := []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"no origin at all", nil, http.StatusForbidden},
		{"another site", map[string]string{"Origin": "https://evil.example"}, http.StatusForbidden},
		{"cross-site fetch metadata", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://example.com"}, http.StatusForbidden},
		{"same origin", map[string]string{"Origin": "http://example.com"}, http.StatusOK},
		{"same-origin fetch metadata", map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusOK},
	}
	for _, tc := range tests {
		rec := do(h, "POST", "/gui/tokens/zone", local, form, tc.hdr)
		if rec.Code != tc.want {
			t.Errorf("%s: %d, want %d (%s)", tc.name, rec.Code, tc.want, rec.Body.String())
		}
		if tc.want == http.StatusOK && !strings.Contains(rec.Body.String(), `id="issued-token"`) {
			t.Errorf("%s: no token shown", tc.name)
		}
	}
}

func TestBrowserAtRootGoesToConsole(t *testing.T) {
	h, _, _ := testServer(t)
	if rec := do(h, "GET", "/", remote, nil, map[string]string{"Accept": "text/html,application/xhtml+xml"}); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/gui/" {
		t.Errorf("browser at /: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	if rec := do(h, "GET", "/", remote, nil, map[string]string{"Accept": "application/json"}); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "Meridian") {
		t.Errorf("API client at /: %d %s", rec.Code, rec.Body.String())
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/gui/zones?x=1": "/gui/zones?x=1", "": "/gui/", "https://evil/": "/gui/", "//evil/gui/": "/gui/",
		"/gui/\\evil": "/gui/", "/meshes": "/gui/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPager(t *testing.T) {
	tests := []struct {
		url         string
		total, size int
		prev, next  string
		offset      int
	}{
		{"/gui/dataplanes?mesh=m", 60, 25, "", "/gui/dataplanes?mesh=m&offset=25", 0},
		{"/gui/dataplanes?mesh=m&offset=25", 60, 25, "/gui/dataplanes?mesh=m&offset=0", "/gui/dataplanes?mesh=m&offset=50", 25},
		{"/gui/dataplanes?offset=50", 60, 25, "/gui/dataplanes?offset=25", "", 50},
		{"/gui/policies?offset=-5", 10, 50, "", "", 0},
		{"/gui/policies?offset=999", 10, 50, "/gui/policies?offset=0", "", 10},
	}
	for _, tc := range tests {
		p := newPager(httptest.NewRequest("GET", tc.url, nil), tc.total, tc.size)
		if p.Prev != tc.prev || p.Next != tc.next || p.Offset != tc.offset {
			t.Errorf("%s: prev %q next %q offset %d; want %q %q %d", tc.url, p.Prev, p.Next, p.Offset, tc.prev, tc.next, tc.offset)
		}
	}
}
