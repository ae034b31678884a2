package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/revocation"
)

type userTokenRequest struct {
	Name   string   `json:"name"`
	Groups []string `json:"groups"`
	// Meshes is nil when absent: an empty list is a mistake, not "all".
	Meshes   []string `json:"meshes"`
	ValidFor string   `json:"validFor"`
}

// handleUserToken issues a user token: POST /tokens/user {"name", "groups",
// "meshes"?, "validFor"} → {"token", "id", "expiresAt"}. Admin only (authorize). Issuance is
// logged with the token's id, never the token.
func (s *Server) handleUserToken(w http.ResponseWriter, r *http.Request) {
	var req userTokenRequest
	if err := s.decodeRequest(r, &req, fmt.Sprintf(`{"name": NAME, "groups": [%q|%q], "meshes": [MESH...], "validFor": "24h"}`,
		auth.GroupAdmin, auth.GroupViewer)); err != nil {
		s.writeError(w, r, err)
		return
	}
	validFor, err := time.ParseDuration(req.ValidFor)
	if err != nil {
		s.writeError(w, r, fieldError("validFor", "want a duration such as 24h, got %q", req.ValidFor))
		return
	}
	token, claims, err := s.cfg.Users.Issue(auth.UserTokenRequest{Name: req.Name, Groups: req.Groups, Meshes: req.Meshes, ValidFor: validFor})
	if errors.Is(err, auth.ErrInvalidUserTokenRequest) {
		s.writeError(w, r, badRequest("%v", err))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.logger.Info("user token issued", "name", claims.Name, "groups", claims.Groups, "meshes", claims.Meshes,
		"id", claims.ID, "expires", time.Unix(claims.ExpiresAt, 0).UTC(), "by", principalName(r))
	s.writeValue(w, r, http.StatusOK, tokenResponse(token, claims.ID, claims.ExpiresAt))
}

// handleRevokeUserToken revokes one user token by id (persisted): from then
// on it authenticates nobody.
func (s *Server) handleRevokeUserToken(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	err := s.cfg.Users.Revoke(r.Context(), id)
	if errors.Is(err, revocation.ErrInvalidID) {
		s.writeError(w, r, fieldError("id", "%v", err))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.logger.Info("user token revoked", "id", id, "by", principalName(r))
	s.writeValue(w, r, http.StatusOK, RevokedResponse{Revoked: id})
}
