// Package api serves Meridian's REST API (docs/api.md) on both control
// planes. Handlers are thin: decode, validate through internal/resource, call
// the store, encode. Everything the handlers need is declared here as narrow
// interfaces and passed in Config.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// DefaultMaxBodyBytes bounds request bodies; a resource larger than this is a
// 413, never an out-of-memory.
const DefaultMaxBodyBytes = 4 << 20

// Store is what the API needs from storage.
type Store interface {
	Get(ctx context.Context, key resource.Key) (*resource.Resource, error)
	List(ctx context.Context, opts storage.ListOptions) (*storage.ListResult, error)
	Put(ctx context.Context, r *resource.Resource) (*resource.Resource, storage.Outcome, error)
	Delete(ctx context.Context, key resource.Key, version uint64) error
	Apply(ctx context.Context, b storage.Batch) (*storage.BatchResult, error)
}

// Config wires a Server. Registry, Store and Plane are required.
type Config struct {
	Registry *resource.Registry
	Store    Store
	Logger   hclog.Logger
	// Plane is the control plane that serves the API.
	Plane        plane.Plane
	Version      string
	MaxBodyBytes int64
	// Ready reports readiness for /readyz; nil means always ready.
	Ready func() error
	// Console, when set, builds the web console from the API's Inner
	// handler; it is served under ConsolePrefix, after authentication.
	Console func(api *Server) (http.Handler, error)
	// StoreReady, when set and failing, answers every request that needs
	// the store with 503 at once (a replica that lost its etcd quorum: its
	// reads would be refused after the store's timeout, and it must not
	// serve stale state); the open paths (/, /healthz, /readyz) and the
	// console's login and assets still answer.
	StoreReady func() error
	// Snapshots serves the inspect endpoints; required in zone mode.
	Snapshots Snapshots
	// Zones and Tokens serve GET /zones... and POST /tokens/zone (global).
	Zones  ZoneStatuses
	Tokens TokenIssuer
	// ZoneTokenAdmin serves DELETE /tokens/zone/{id} (global).
	ZoneTokenAdmin ZoneTokenAdmin
	// SyncStatus, on a zone, reports its connection to the global in GET /.
	SyncStatus func() any
	// Rejections, on a zone connected to a global, says which of its
	// resources the global rejected (shown as a Synced condition).
	Rejections SyncRejections
	// Metrics, when set, is served at GET /metrics.
	Metrics http.Handler
	// Users verifies the user tokens callers send and issues new ones
	// (POST /tokens/user). Without it only loopback callers (with
	// LocalhostIsAdmin) get in.
	Users UserTokens
	// LocalhostIsAdmin makes every loopback caller without a token an admin
	// (Kuma's default); remote callers always need a token.
	LocalhostIsAdmin bool
	// MaxInspectPerCaller bounds one caller's inspect calls in flight
	// (default DefaultMaxInspectPerCaller); more are answered 429.
	MaxInspectPerCaller int
	// AllowedHosts are the host names (beside loopback IPs and localhost)
	// under which the console is served and loopback callers are admin.
	AllowedHosts []string
	// DataplaneTokens serves POST and DELETE /tokens/dataplane (zone);
	// XDS serves the Dataplanes' `_xds` (zone).
	DataplaneTokens DataplaneTokens
	XDS             XDSState
}

// Server is the HTTP handler. It is safe for concurrent use.
type Server struct {
	cfg    Config
	adm    *admission.Controller
	reg    *resource.Registry
	store  Store
	logger hclog.Logger
	mux    *http.ServeMux
	// console serves /gui/ (nil: no console).
	console http.Handler
	// inspecting counts each caller's inspect calls in flight.
	inspecting callerSlots
}

// New checks cfg and builds the handler.
func New(cfg Config) (*Server, error) {
	if cfg.Registry == nil {
		return nil, errors.New("api: Registry is required")
	}
	if cfg.Store == nil {
		return nil, errors.New("api: Store is required")
	}
	if err := cfg.Plane.Check(); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if cfg.Plane.IsZone() && cfg.Snapshots == nil {
		return nil, errors.New("api: Snapshots is required in zone mode")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxInspectPerCaller <= 0 {
		cfg.MaxInspectPerCaller = DefaultMaxInspectPerCaller
	}
	adm, err := admission.New(admission.Config{Registry: cfg.Registry, Plane: cfg.Plane})
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, adm: adm, reg: cfg.Registry, store: cfg.Store, logger: cfg.Logger, mux: http.NewServeMux()}
	s.routes()
	if cfg.Console != nil {
		h, err := cfg.Console(s)
		if err != nil {
			return nil, err
		}
		s.console = h
	}
	return s, nil
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /{$}", s.handleIndex)
	s.mux.HandleFunc("GET /healthz", s.handleHealth)
	s.mux.HandleFunc("GET /readyz", s.handleReady)

	s.mux.HandleFunc("GET /meshes", s.handleListGlobalScoped("Mesh"))
	s.mux.HandleFunc("GET /meshes/{mesh}", s.handleGetMesh)
	s.mux.HandleFunc("PUT /meshes/{mesh}", s.handlePutMesh)
	s.mux.HandleFunc("DELETE /meshes/{mesh}", s.handleDeleteMesh)

	s.mux.HandleFunc("GET /meshes/{mesh}/{plural}", s.handleList)
	s.mux.HandleFunc("GET /meshes/{mesh}/{plural}/{name}", s.handleGet)
	s.mux.HandleFunc("PUT /meshes/{mesh}/{plural}/{name}", s.handlePut)
	s.mux.HandleFunc("DELETE /meshes/{mesh}/{plural}/{name}", s.handleDelete)

	if s.cfg.Users != nil {
		s.mux.HandleFunc("POST /tokens/user", s.handleUserToken)
		s.mux.HandleFunc("DELETE /tokens/user/{id}", s.handleRevokeUserToken)
	}

	if s.cfg.Plane.IsZone() {
		s.registerInspect()
		s.registerDataplanes()
	} else {
		s.registerGlobal()
	}
	if s.cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", s.cfg.Metrics)
	}

	// Other global-scoped types (zones, zoneinsights).
	s.mux.HandleFunc("GET /{plural}", s.handleListGlobalScopedPlural)
	s.mux.HandleFunc("GET /{plural}/{name}", s.handleGetGlobalScoped)
	s.mux.HandleFunc("PUT /{plural}/{name}", s.handlePutGlobalScoped)
	s.mux.HandleFunc("DELETE /{plural}/{name}", s.handleDeleteGlobalScoped)
}

// Handle registers an extra handler (inspect, zones, tokens) on the same mux.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r, ok := s.authenticated(w, r)
	if !ok {
		return
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	}
	if ns := r.URL.Query().Get("namespace"); ns != "" && !resource.IsDNSLabel(ns) {
		s.writeError(w, r, fieldError("namespace", "must be a namespace name (lowercase RFC 1123 label of at most 63 characters), got %q", ns))
		return
	}
	if s.cfg.StoreReady != nil {
		if need, _ := access(r); need != rightOpen {
			if err := s.cfg.StoreReady(); err != nil {
				w.Header().Set("Retry-After", "1")
				what := "reads (they could be stale)"
				if !safeMethod(r.Method) {
					what = "writes"
				}
				s.writeError(w, r, newError(http.StatusServiceUnavailable, "Service Unavailable", "not serving %s: %v", what, err))
				return
			}
		}
	}
	if s.console != nil && (r.URL.Path == "/gui" || strings.HasPrefix(r.URL.Path, ConsolePrefix)) {
		if !s.hostAllowed(r.Host) {
			s.writeError(w, r, forbidden("the console is served under a loopback IP, localhost or a name in "+
				"--api-allowed-hosts, not %q", r.Host))
			return
		}
		// The console's own router: its paths overlap the API's
		// /{plural}/{name} patterns, so it is not in the mux.
		if r.URL.Path == "/gui" {
			http.Redirect(w, r, ConsolePrefix, http.StatusMovedPermanently)
			return
		}
		s.console.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// handleIndex answers GET /, which is open: anonymous callers learn the
// product, version and mode; an authenticated caller also the zone, its
// environment and its connection to the global (an address and errors an
// outsider has no use for).
func (s *Server) handleIndex(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Console != nil && strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, ConsolePrefix, http.StatusSeeOther) // a browser: the console
		return
	}
	body := map[string]any{
		"product": "Meridian",
		"version": s.cfg.Version,
		"mode":    string(s.cfg.Plane.Mode),
	}
	if p, e := s.authenticate(r); e == nil && p != nil && s.cfg.Plane.IsZone() {
		body["zone"] = s.cfg.Plane.Zone
		body["environment"] = s.cfg.Plane.Environment
		if s.cfg.SyncStatus != nil {
			body["sync"] = s.cfg.SyncStatus()
		}
	}
	s.writeValue(w, r, http.StatusOK, body)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	s.writeValue(w, r, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			s.writeError(w, r, newError(http.StatusServiceUnavailable, "Service Unavailable", "%v", err))
			return
		}
	}
	s.writeValue(w, r, http.StatusOK, map[string]string{"status": "ready"})
}

// wantsYAML reports whether the client asked for YAML in Accept.
func wantsYAML(r *http.Request) bool {
	a := r.Header.Get("Accept")
	return strings.Contains(a, "yaml")
}

// writeValue writes any JSON-able value, as YAML when asked.
func (s *Server) writeValue(w http.ResponseWriter, r *http.Request, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSONBytes(w, r, status, b)
}

func (s *Server) writeJSONBytes(w http.ResponseWriter, r *http.Request, status int, b []byte) {
	if wantsYAML(r) {
		y, err := jsonToYAML(b)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/yaml")
		w.WriteHeader(status)
		_, _ = w.Write(y)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	_, _ = w.Write([]byte("\n"))
}
