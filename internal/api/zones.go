package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// ZoneStatuses is the global's per-zone sync status (internal/kds.Server).
type ZoneStatuses interface {
	Statuses() []kds.ZoneStatus
	Status(zone string) (kds.ZoneStatus, bool)
	// PolicyStatuses is what each zone reported for one of the global's
	// policies.
	PolicyStatuses(typ, mesh, name string) []kds.ZonePolicyStatus
	// RejectedBy lists the zones that rejected one of the global's resources.
	RejectedBy(key resource.Key) []kds.ZoneRejection
	// RejectedIn lists the global's resources a zone rejected.
	RejectedIn(zone string) []kds.RejectedResource
}

// TokenIssuer issues zone tokens (internal/auth.ZoneTokens).
type TokenIssuer interface {
	IssueToken(zone string, validFor time.Duration) (string, auth.Claims, error)
}

// ZoneTokenAdmin revokes zone tokens by id and manages their signing keys,
// ending the live streams concerned (internal/controlplane's zone access).
type ZoneTokenAdmin interface {
	Revoke(ctx context.Context, id string) (streamsEnded int, err error)
	Keys() []auth.KeyInfo
	RotateKey(overlap time.Duration) (newID, oldID string, retireAt time.Time, err error)
	RetireKey(kid string) (streamsEnded int, err error)
}

// maxTokenValidity bounds POST /tokens/zone's validFor.
const maxTokenValidity = 10 * 365 * 24 * time.Hour

func (s *Server) registerGlobal() {
	if s.cfg.Zones != nil {
		s.mux.HandleFunc("GET /zones", s.handleZones)
		s.mux.HandleFunc("GET /zones/{name}/_overview", s.handleZoneOverview)
	}
	if s.cfg.Tokens != nil {
		s.mux.HandleFunc("POST /tokens/zone", s.handleZoneToken)
	}
	if s.cfg.ZoneTokenAdmin != nil {
		s.mux.HandleFunc("DELETE /tokens/zone/{id}", s.handleRevokeZoneToken)
		s.mux.HandleFunc("GET /tokens/zone/signing-keys", s.handleSigningKeys)
		s.mux.HandleFunc("POST /tokens/zone/signing-keys", s.handleRotateSigningKey)
		s.mux.HandleFunc("DELETE /tokens/zone/signing-keys/{kid}", s.handleRetireSigningKey)
	}
}

func (s *Server) handleZones(w http.ResponseWriter, r *http.Request) {
	statuses := s.cfg.Zones.Statuses()
	items := make([]ZoneItem, 0, len(statuses))
	for _, st := range statuses {
		items = append(items, ZoneItem{Type: "Zone", Name: st.Zone, ZoneStatus: st})
	}
	s.writeValue(w, r, http.StatusOK, newList(items))
}

func (s *Server) handleZoneOverview(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st, ok := s.cfg.Zones.Status(name)
	if !ok {
		s.writeError(w, r, notFound("zone %q has never connected", name))
		return
	}
	item := ZoneItem{Type: "Zone", Name: name, ZoneStatus: st}
	for _, rej := range s.cfg.Zones.RejectedIn(name) {
		k := rej.Key
		item.Rejected = append(item.Rejected, RejectedItem{Type: k.Type, Mesh: k.Mesh, Namespace: k.Namespace, Name: k.Name, Message: rej.Message})
	}
	s.writeValue(w, r, http.StatusOK, item)
}

type tokenRequest struct {
	Zone     string `json:"zone"`
	ValidFor string `json:"validFor"`
}

func (s *Server) handleZoneToken(w http.ResponseWriter, r *http.Request) {
	var req tokenRequest
	if err := s.decodeRequest(r, &req, `{"zone": NAME, "validFor": "24h"}`); err != nil {
		s.writeError(w, r, err)
		return
	}
	verr := &resource.ValidationError{}
	if !resource.IsDNSLabel(req.Zone) {
		verr.Add("zone", "must be a zone name (lowercase RFC 1123 label), got %q", req.Zone)
	}
	validFor := 24 * time.Hour
	if req.ValidFor != "" {
		d, err := time.ParseDuration(req.ValidFor)
		if err != nil || d <= 0 || d > maxTokenValidity {
			verr.Add("validFor", "must be a positive duration up to %s, got %q", maxTokenValidity, req.ValidFor)
		}
		validFor = d
	}
	if err := verr.OrNil(); err != nil {
		s.writeError(w, r, err)
		return
	}
	token, claims, err := s.cfg.Tokens.IssueToken(req.Zone, validFor)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.logger.Info("zone token issued", "zone", claims.Zone, "id", claims.ID,
		"expires", time.Unix(claims.ExpiresAt, 0).UTC(), "by", principalName(r))
	s.writeValue(w, r, http.StatusOK, tokenResponse(token, claims.ID, claims.ExpiresAt))
}

// handleRevokeZoneToken revokes one zone token by id (persisted); the
// zone's live streams with it end at once.
func (s *Server) handleRevokeZoneToken(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ended, err := s.cfg.ZoneTokenAdmin.Revoke(r.Context(), id)
	if errors.Is(err, storage.ErrInvalid) {
		s.writeError(w, r, fieldError("id", "%v", err))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.logger.Info("zone token revocation requested", "id", id, "streams_ended", ended, "by", principalName(r))
	s.writeValue(w, r, http.StatusOK, RevokedResponse{Revoked: id, StreamsEnded: ended})
}

func (s *Server) handleSigningKeys(w http.ResponseWriter, r *http.Request) {
	keys := s.cfg.ZoneTokenAdmin.Keys()
	s.writeValue(w, r, http.StatusOK, newList(keys))
}

// handleRotateSigningKey: POST {"overlap": "24h"} makes a new signing key;
// tokens of the old one verify until the overlap ends.
func (s *Server) handleRotateSigningKey(w http.ResponseWriter, r *http.Request) {
	body, err := s.readBody(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req := struct {
		Overlap string `json:"overlap"`
	}{Overlap: "24h"}
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			s.writeError(w, r, badRequest(`want {"overlap": "24h"}: %v`, err))
			return
		}
	}
	overlap, err := time.ParseDuration(req.Overlap)
	if err != nil || overlap < 0 || overlap > maxTokenValidity {
		s.writeError(w, r, fieldError("overlap", "want a duration from 0s to %s, got %q", maxTokenValidity, req.Overlap))
		return
	}
	newID, oldID, retireAt, err := s.cfg.ZoneTokenAdmin.RotateKey(overlap)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.logger.Info("zone token signing key rotation requested", "new", newID, "previous", oldID, "by", principalName(r))
	s.writeValue(w, r, http.StatusOK, map[string]any{"kid": newID, "previous": oldID,
		"previousRetiresAt": retireAt.UTC().Format(time.RFC3339)})
}

func (s *Server) handleRetireSigningKey(w http.ResponseWriter, r *http.Request) {
	kid := r.PathValue("kid")
	ended, err := s.cfg.ZoneTokenAdmin.RetireKey(kid)
	switch {
	case errors.Is(err, auth.ErrUnknownKey):
		s.writeError(w, r, notFound("%v", err))
		return
	case errors.Is(err, auth.ErrKeyInUse):
		s.writeError(w, r, conflict("%v", err))
		return
	case err != nil:
		s.writeError(w, r, err)
		return
	}
	s.writeValue(w, r, http.StatusOK, map[string]any{"retired": kid, "streamsEnded": ended})
}

// decodeRequest reads a JSON request body into v, refusing unknown fields; a
// body that does not decode is a 400 saying what is wanted.
func (s *Server) decodeRequest(r *http.Request, v any, want string) error {
	body, err := s.readBody(r)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("want %s: %v", want, err)
	}
	return nil
}

func principalName(r *http.Request) string {
	if p := PrincipalFrom(r.Context()); p != nil {
		return p.String()
	}
	return "-"
}
