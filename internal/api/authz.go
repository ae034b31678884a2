package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Authentication and authorization (docs/api.md). Every request except the open
// ones (GET /, /healthz, /readyz) needs a principal: a user token sent as
// `Authorization: Bearer`, or, with LocalhostIsAdmin, a loopback caller
// (admin, as in Kuma). A principal's groups decide what it may do (viewer:
// read; admin: everything) and its meshes, when set, confine it to those
// meshes' resources. This file is the one place that decides who may call
// what; handlers read the principal from the request context when they need
// it (mesh lists, audit logs).

// UserTokens verifies, issues and revokes user tokens
// (revocation.UserTokens).
type UserTokens interface {
	Verify(token string) (auth.UserClaims, error)
	Issue(req auth.UserTokenRequest) (string, auth.UserClaims, error)
	Revoke(ctx context.Context, id string) error
}

// Principal is an authenticated caller.
type Principal struct {
	Name   string
	Admin  bool
	Viewer bool
	// Meshes confines the principal to these meshes; nil means all.
	Meshes []string
	// Via says how it was authenticated: "token" or "localhost".
	Via string
}

func (p *Principal) String() string {
	if p.Via == "localhost" {
		return "localhost caller (admin)"
	}
	return fmt.Sprintf("user %q", p.Name)
}

// inMesh reports whether the principal may act on mesh m.
func (p *Principal) inMesh(m string) bool { return p.Meshes == nil || slices.Contains(p.Meshes, m) }

type principalKey struct{}

// PrincipalFrom returns the request's principal (nil on open paths).
func PrincipalFrom(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// right is what a request needs.
type right int

const (
	rightOpen  right = iota // anyone
	rightRead               // viewer or admin
	rightWrite              // admin
	rightToken              // admin, unscoped: token issuance and revocation
)

// access classifies a request: the right it needs and the mesh it acts on
// ("" for cluster-wide paths).
func access(r *http.Request) (right, string) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	// Segments are split on the escaped path, as the mux does, so that
	// "/meshes/a%2Fb/..." is about mesh "a/b", never mesh "a".
	parts := strings.Split(strings.TrimPrefix(strings.TrimSuffix(r.URL.EscapedPath(), "/"), "/"), "/")
	for i, p := range parts {
		if u, err := url.PathUnescape(p); err == nil {
			parts[i] = u
		}
	}
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	need := rightWrite
	if read {
		need = rightRead
	}
	switch {
	case path == "" || path == "/healthz" || path == "/readyz":
		if read {
			return rightOpen, ""
		}
	case path == ConsoleLoginPath || path == ConsoleLogoutPath || strings.HasPrefix(path, consoleStaticPrefix):
		// The console's login form and its assets; the token posted to
		// the form is verified there (ConsoleToken).
		return rightOpen, ""
	case parts[0] == "gui":
		// Console pages read, or act through the API handler, which
		// authorizes each API call again (Inner).
		return need, ""
	case parts[0] == "tokens":
		return rightToken, ""
	case parts[0] == "meshes" && len(parts) >= 2:
		return need, parts[1]
	}
	return need, ""
}

// Console paths and its session cookie. A browser cannot send a bearer
// header on navigation, so the console keeps the user token the user gave
// its login form in an HttpOnly, SameSite=Strict cookie, accepted on /gui/
// paths only (the API proper keeps taking headers alone).
const (
	ConsolePrefix       = "/gui/"
	ConsoleLoginPath    = "/gui/login"
	ConsoleLogoutPath   = "/gui/logout"
	consoleStaticPrefix = "/gui/static/"
	ConsoleCookie       = "meridian_token"
)

func (s *Server) authenticate(r *http.Request) (*Principal, *Error) {
	h := r.Header.Get("Authorization")
	if c, err := r.Cookie(ConsoleCookie); h == "" && err == nil && c.Value != "" && strings.HasPrefix(r.URL.Path, ConsolePrefix) {
		h = "Bearer " + c.Value
	}
	if h != "" {
		scheme, token, _ := strings.Cut(h, " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return nil, unauthenticated(`the Authorization header must be "Bearer <user token>"`)
		}
		if s.cfg.Users == nil {
			return nil, unauthenticated("this control plane does not accept user tokens")
		}
		claims, err := s.cfg.Users.Verify(token)
		if err != nil {
			return nil, unauthenticated("%v", err)
		}
		p := &Principal{Name: claims.Name, Admin: claims.HasGroup(auth.GroupAdmin), Viewer: claims.HasGroup(auth.GroupViewer), Via: "token"}
		if len(claims.Meshes) > 0 {
			p.Meshes = claims.Meshes
		}
		return p, nil
	}
	if s.cfg.LocalhostIsAdmin && isLoopback(r.RemoteAddr) {
		if !s.hostAllowed(r.Host) {
			// A page that rebound its name to 127.0.0.1 is same-origin with
			// the API but still sends its own name as Host.
			return nil, unauthenticated("loopback callers are admin only when they address the API as a loopback IP, "+
				"localhost or a name in --api-allowed-hosts, not %q; send a user token", r.Host)
		}
		return &Principal{Name: "localhost", Admin: true, Via: "localhost"}, nil
	}
	return nil, unauthenticated("send Authorization: Bearer <user token> (meridianctl --token-file FILE; " +
		"the admin token is the file admin-token in the control plane's data dir)")
}

// hostAllowed reports whether a request's Host names this API as the
// operator does: a loopback IP, localhost, or a name in AllowedHosts. DNS
// rebinding needs a name of the attacker's, which this refuses.
func (s *Server) hostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, a := range s.cfg.AllowedHosts {
		if strings.EqualFold(host, a) {
			return true
		}
	}
	return false
}

// browserChecks refuses the state-changing requests a web page in a
// browser on this machine could send to the localhost principal, who is
// admin without a token: any request the browser marks as coming from
// another site (Sec-Fetch-Site other than same-origin or none, or an Origin
// whose host is not the request's), and an API body that is not JSON or
// YAML (a page can send text/plain or form bodies without a preflight).
// Requests with a bearer token need none of this: a page cannot attach one.
func browserChecks(r *http.Request) *Error {
	if safeMethod(r.Method) {
		return nil
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return forbidden("%s %s from another site (Sec-Fetch-Site: %s) refused: the localhost principal acts only for "+
			"pages of this API's own origin; send a user token", r.Method, r.URL.Path, site)
	}
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return forbidden("%s %s from origin %q refused: the localhost principal acts only for pages of this API's own "+
				"origin; send a user token", r.Method, r.URL.Path, o)
		}
	}
	// A page can POST without a preflight, with any body; PUT and PATCH
	// need a preflight this API never answers, so only their bodies are
	// checked. The console's forms are checked by the console.
	hasBody := r.ContentLength != 0
	if strings.HasPrefix(r.URL.Path, ConsolePrefix) || !(r.Method == http.MethodPost || (hasBody && (r.Method == http.MethodPut || r.Method == http.MethodPatch))) {
		return nil
	}
	if mt := mediaType(r.Header.Get("Content-Type")); !jsonOrYAML(mt) {
		return newError(http.StatusUnsupportedMediaType, "Unsupported Media Type",
			"Content-Type %q refused: send application/json or application/yaml", r.Header.Get("Content-Type"))
	}
	return nil
}

func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

func jsonOrYAML(mt string) bool {
	switch mt {
	case "application/json", "application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml":
		return true
	}
	return strings.HasSuffix(mt, "+json") || strings.HasSuffix(mt, "+yaml")
}

func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// authorize checks p against what r needs: the right its method and path
// need, and admin for every access to a secret type (key material).
func (s *Server) authorize(p *Principal, r *http.Request) *Error {
	if e := authorize(p, r); e != nil {
		return e
	}
	if !p.Admin && s.secretPath(r.URL.Path) {
		return forbidden("%s lacks %s, which reading secrets needs", p, auth.GroupAdmin)
	}
	return nil
}

// secretPath reports whether path names a secret type's resources:
// /meshes/{mesh}/{plural}[/...] or /{plural}[/...].
func (s *Server) secretPath(path string) bool {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	plural := parts[0]
	if plural == "meshes" && len(parts) >= 3 {
		plural = parts[2]
	}
	d, ok := s.reg.LookupPlural(plural)
	return ok && d.Secret
}

// forReader is res as the request's principal may read it: inline private
// keys redacted for anyone but an admin.
func (s *Server) forReader(r *http.Request, res *resource.Resource) *resource.Resource {
	if p := PrincipalFrom(r.Context()); p != nil && p.Admin {
		return res
	}
	d, ok := s.reg.Lookup(res.Type)
	if !ok || !d.KeyMaterial {
		return res
	}
	redacted, changed := resource.RedactKeyMaterial(res.Spec)
	if !changed {
		return res
	}
	c := *res
	c.Spec = redacted
	return &c
}

func authorize(p *Principal, r *http.Request) *Error {
	need, mesh := access(r)
	switch need {
	case rightToken:
		if !p.Admin || p.Meshes != nil {
			return forbidden("%s lacks %s without a mesh restriction, which %s %s needs", p, auth.GroupAdmin, r.Method, r.URL.Path)
		}
		return nil
	case rightWrite:
		if !p.Admin {
			return forbidden("%s lacks %s, which %s %s needs (a viewer may only read)", p, auth.GroupAdmin, r.Method, r.URL.Path)
		}
	case rightRead:
		if !p.Admin && !p.Viewer {
			return forbidden("%s has neither %s nor %s", p, auth.GroupViewer, auth.GroupAdmin)
		}
	}
	if p.Meshes == nil {
		return nil
	}
	if mesh == "" {
		if r.URL.Path == "/meshes" && need == rightRead {
			return nil // the list is filtered to the principal's meshes
		}
		if strings.HasPrefix(r.URL.Path, ConsolePrefix) {
			return nil // each API call the page makes is authorized on its own (Inner)
		}
		return forbidden("%s is confined to meshes %s; %s %s is not mesh-scoped", p, strings.Join(p.Meshes, ", "), r.Method, r.URL.Path)
	}
	if !p.inMesh(mesh) {
		return forbidden("%s is confined to meshes %s, not %q", p, strings.Join(p.Meshes, ", "), mesh)
	}
	return nil
}

func unauthenticated(format string, args ...any) *Error {
	return newError(http.StatusUnauthorized, "Unauthenticated", format, args...)
}

// authenticated wraps the mux: it authenticates, authorizes and puts the
// principal in the request context.
func (s *Server) authenticated(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if need, _ := access(r); need == rightOpen {
		return r, true
	}
	p, e := s.authenticate(r)
	if e != nil {
		s.logger.Debug("request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", e.Details)
		if strings.HasPrefix(r.URL.Path, ConsolePrefix) && r.Method == http.MethodGet {
			// A browser without a session goes to the login form.
			http.Redirect(w, r, ConsoleLoginPath+"?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return nil, false
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="meridian"`)
		s.writeError(w, r, e)
		return nil, false
	}
	if p.Via == "localhost" {
		if e := browserChecks(r); e != nil {
			s.logger.Warn("request refused", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", e.Details)
			s.writeError(w, r, e)
			return nil, false
		}
	}
	if e := s.authorize(p, r); e != nil {
		s.logger.Debug("request forbidden", "method", r.Method, "path", r.URL.Path, "principal", p.Name, "reason", e.Details)
		s.writeError(w, r, e)
		return nil, false
	}
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, p)), true
}

// Inner is the API as the console calls it in-process: the request carries
// the browser's principal (set by ServeHTTP on the /gui/ request), and every
// call is authorized again as if it came over the network, so the console
// can never do what its user may not.
func (s *Server) Inner() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := PrincipalFrom(r.Context())
		if p == nil {
			s.writeError(w, r, unauthenticated("console call without a principal"))
			return
		}
		if e := s.authorize(p, r); e != nil {
			s.writeError(w, r, e)
			return
		}
		s.mux.ServeHTTP(w, r)
	})
}

// ConsoleToken verifies a user token typed into the console's login form.
func (s *Server) ConsoleToken(token string) (*Principal, error) {
	r := &http.Request{Header: http.Header{"Authorization": {"Bearer " + token}}, URL: &url.URL{Path: ConsoleLoginPath}}
	p, e := s.authenticate(r)
	if e != nil {
		return nil, e
	}
	return p, nil
}
