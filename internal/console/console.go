// Package console is the web console served by both control planes under
// /gui/: server-rendered pages (html/template) with a little plain
// JavaScript that reloads the page's main section when the server says
// something changed (server-sent events fed by the store watch and the zone
// tracker). Every figure on a page comes from the REST API, called
// in-process through api.Server.Inner with the browser's principal, so the
// console shows and does exactly what that user may see and do through the
// API, and there is one home for each rule and computation.
package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// API is what the console needs of the REST API server.
type API interface {
	// Inner serves API calls made in-process for the request's principal.
	Inner() http.Handler
	// ConsoleToken verifies a user token typed into the login form.
	ConsoleToken(token string) (*api.Principal, error)
}

// Config of the console. API, Registry and Logger are required.
type Config struct {
	API API
	// Plane is the control plane the console shows.
	Plane    plane.Plane
	Registry *resource.Registry
	// Changes tells pages of changes worth showing (a store write, a zone
	// connecting or leaving); nil: pages never update by themselves.
	Changes *Feed
	Logger  hclog.Logger
	// Now defaults to time.Now (relative times on pages).
	Now func() time.Time
}

// Console is the http.Handler of /gui/.
type Console struct {
	cfg   Config
	mux   *http.ServeMux
	pages map[string]*template.Template
}

// New checks cfg and builds the handler.
func New(cfg Config) (*Console, error) {
	switch {
	case cfg.API == nil:
		return nil, errors.New("console: API is required")
	case cfg.Registry == nil:
		return nil, errors.New("console: Registry is required")
	case cfg.Logger == nil:
		return nil, errors.New("console: Logger is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Console{cfg: cfg, mux: http.NewServeMux()}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

func (c *Console) global() bool { return c.cfg.Plane.IsGlobal() }

func (c *Console) routes() {
	static, _ := fs.Sub(staticFS, "static")
	c.mux.Handle("GET /gui/static/", http.StripPrefix("/gui/static/", cacheForever(http.FileServerFS(static))))
	c.mux.HandleFunc("GET /gui/login", c.loginPage)
	c.mux.HandleFunc("POST /gui/login", c.login)
	c.mux.HandleFunc("POST /gui/logout", c.logout)
	c.mux.HandleFunc("GET /gui/events", c.events)
	c.mux.HandleFunc("GET /gui/meshes", c.meshesPage)
	c.mux.HandleFunc("GET /gui/policies", c.policiesPage)
	c.mux.HandleFunc("GET /gui/meshes/{mesh}/{plural}/{name}", c.resourcePage)
	if c.global() {
		c.mux.HandleFunc("GET /gui/{$}", c.zonesPage)
		c.mux.HandleFunc("GET /gui/zones", c.zonesPage)
		c.mux.HandleFunc("GET /gui/zones/{name}", c.zonePage)
		c.mux.HandleFunc("GET /gui/tokens", c.tokensPage)
		c.mux.HandleFunc("POST /gui/tokens/zone", c.issueZoneToken)
		c.mux.HandleFunc("POST /gui/tokens/zone/revoke", c.revokeZoneToken)
	} else {
		c.mux.HandleFunc("GET /gui/{$}", c.dataplanesPage)
		c.mux.HandleFunc("GET /gui/dataplanes", c.dataplanesPage)
		c.mux.HandleFunc("GET /gui/meshes/{mesh}/dataplanes/{name}/explain", c.explainPage)
	}
}

// ServeHTTP implements http.Handler. State-changing requests must come from
// a console page (same origin): with localhost-is-admin a browser on the
// machine is admin without any cookie, so another site's form must not be
// able to act through it.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	c.mux.ServeHTTP(w, r)
}

func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

func cacheForever(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// apiError is a non-2xx answer of the API.
type apiError struct {
	Status  int
	Title   string `json:"title"`
	Details string `json:"details"`
	Causes  []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"causes"`
}

func (e *apiError) Error() string {
	msg := fmt.Sprintf("%d %s: %s", e.Status, e.Title, e.Details)
	for _, c := range e.Causes {
		msg += fmt.Sprintf("; %s: %s", c.Field, c.Message)
	}
	return msg
}

// call runs one API request in-process for r's principal and decodes the
// JSON answer into out (nil: discard). The answer is captured by the
// standard library's ResponseRecorder.
func (c *Console) call(r *http.Request, method, path string, body any, out any) error {
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(r.Context(), method, path, rd)
	if err != nil {
		return err
	}
	req.RemoteAddr, req.Host = r.RemoteAddr, r.Host
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	c.cfg.API.Inner().ServeHTTP(rec, req)
	if rec.Code/100 != 2 {
		e := &apiError{Status: rec.Code}
		if json.Unmarshal(rec.Body.Bytes(), e) != nil || e.Title == "" {
			e.Title, e.Details = http.StatusText(rec.Code), strings.TrimSpace(rec.Body.String())
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

func (c *Console) get(r *http.Request, path string, out any) error {
	return c.call(r, http.MethodGet, path, nil, out)
}

// principal is the request's user as pages show it.
type principal struct {
	Name    string
	Admin   bool // may issue and revoke tokens (admin without a mesh restriction)
	Writer  bool
	ViaHost bool
}

func principalOf(r *http.Request) principal {
	p := api.PrincipalFrom(r.Context())
	if p == nil {
		return principal{}
	}
	return principal{Name: p.Name, Admin: p.Admin && p.Meshes == nil, Writer: p.Admin, ViaHost: p.Via == "localhost"}
}
