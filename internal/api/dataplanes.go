package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/revocation"
)

// DataplaneTokens issues and revokes the zone's Dataplane tokens
// (docs/dataplane.md#joining). Revoke ends the agent sessions and xDS
// streams of the token and reports how many streams ended.
type DataplaneTokens interface {
	Issue(req auth.DataplaneTokenRequest) (string, auth.DataplaneClaims, error)
	Revoke(ctx context.Context, id string) (int, error)
}

// XDSState reports a Dataplane's data plane state for `_xds`: its agent,
// its xDS connection per type, and the resources it gets.
type XDSState interface {
	XDS(ctx context.Context, mesh, name, namespace string, q XDSQuery) (any, error)
	// ConfigWarnings are `_config` warnings of a Dataplane whose proxy
	// is not given part of its configuration (docs/dataplane.md#not-enforceable);
	// none for a Dataplane no agent runs.
	ConfigWarnings(ctx context.Context, mesh, name, namespace string) ([]string, error)
	// Programmed is a policy's Programmed condition, with the snapshot
	// that says which proxies it selects; false when there is nothing to
	// say (docs/dataplane.md#programmed).
	Programmed(snap *policy.MeshSnapshot, mesh, policyType, name, namespace string) (policy.Condition, bool)
}

// XDSQuery is what `_xds` asks for (docs/api.md#xds).
type XDSQuery struct {
	// Proxy is the kind of proxy to render for: "grpc", "envoy", or ""
	// for the kind the Dataplane's agent runs.
	Proxy string
	// Shadow renders as if the policies labelled kuma.io/effect: shadow
	// were applied; Diff adds a JSON patch from the real configuration
	// to that one (Kuma's shape: {"xds", "diff"}).
	Shadow, Diff bool
}

// registerDataplanes adds the zone's data plane endpoints.
func (s *Server) registerDataplanes() {
	if s.cfg.DataplaneTokens != nil {
		s.mux.HandleFunc("POST /tokens/dataplane", s.handleDataplaneToken)
		s.mux.HandleFunc("DELETE /tokens/dataplane/{id}", s.handleRevokeDataplaneToken)
	}
	if s.cfg.XDS != nil {
		s.mux.HandleFunc("GET /meshes/{mesh}/dataplanes/{name}/_xds", s.limitInspect(s.handleXDS))
	}
}

type dataplaneTokenRequest struct {
	Mesh      string            `json:"mesh"`
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Tags      map[string]string `json:"tags"`
	ValidFor  string            `json:"validFor"`
}

// handleDataplaneToken issues a Dataplane token: POST /tokens/dataplane
// {"mesh", "name"?, "namespace"?, "tags"?, "validFor"} → {"token", "id",
// "expiresAt"}. Admin only (authorize); logged by id, never the token.
func (s *Server) handleDataplaneToken(w http.ResponseWriter, r *http.Request) {
	var req dataplaneTokenRequest
	if err := s.decodeRequest(r, &req, `{"mesh": MESH, "name": NAME, "namespace": NS, "tags": {...}, "validFor": "24h"}`); err != nil {
		s.writeError(w, r, err)
		return
	}
	validFor, err := time.ParseDuration(req.ValidFor)
	if err != nil {
		s.writeError(w, r, fieldError("validFor", "want a duration such as 24h, got %q", req.ValidFor))
		return
	}
	if req.Namespace == s.cfg.Plane.SystemNamespace {
		req.Namespace = ""
	}
	token, claims, err := s.cfg.DataplaneTokens.Issue(auth.DataplaneTokenRequest{Mesh: req.Mesh, Name: req.Name,
		Namespace: req.Namespace, Tags: req.Tags, ValidFor: validFor})
	if errors.Is(err, auth.ErrInvalidDataplaneTokenRequest) {
		s.writeError(w, r, badRequest("%v", err))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.logger.Info("dataplane token issued", "mesh", claims.Mesh, "name", claims.Name, "namespace", claims.Namespace,
		"tags", claims.Tags, "id", claims.ID, "expires", time.Unix(claims.ExpiresAt, 0).UTC(), "by", principalName(r))
	s.writeValue(w, r, http.StatusOK, tokenResponse(token, claims.ID, claims.ExpiresAt))
}

// handleRevokeDataplaneToken revokes a Dataplane token by id: its agents'
// sessions and its workloads' xDS streams end at once.
func (s *Server) handleRevokeDataplaneToken(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n, err := s.cfg.DataplaneTokens.Revoke(r.Context(), id)
	if errors.Is(err, revocation.ErrInvalidID) {
		s.writeError(w, r, fieldError("id", "%v", err))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.logger.Info("dataplane token revoked", "id", id, "streams_ended", n, "by", principalName(r))
	s.writeValue(w, r, http.StatusOK, RevokedResponse{Revoked: id, StreamsEnded: n})
}

// handleXDS shows a Dataplane's data plane state: GET
// /meshes/{mesh}/dataplanes/{name}/_xds (docs/api.md).
func (s *Server) handleXDS(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	q := XDSQuery{Proxy: query.Get("proxy")}
	switch q.Proxy {
	case "", "grpc", "envoy":
	default:
		s.writeError(w, r, fieldError("proxy", "must be grpc or envoy, got %q", q.Proxy))
		return
	}
	if v := query.Get("shadow"); v != "" {
		shadow, err := strconv.ParseBool(v)
		if err != nil {
			s.writeError(w, r, fieldError("shadow", "must be true or false, got %q", v))
			return
		}
		q.Shadow = shadow
	}
	for _, inc := range query["include"] {
		if inc != "diff" {
			s.writeError(w, r, fieldError("include", "must be diff, got %q", inc))
			return
		}
		q.Diff = true
	}
	if q.Diff && !q.Shadow {
		s.writeError(w, r, fieldError("include", "diff goes with shadow=true"))
		return
	}
	v, err := s.cfg.XDS.XDS(r.Context(), r.PathValue("mesh"), r.PathValue("name"), s.namespaceParam(r), q)
	s.writeResult(w, r, v, err)
}
