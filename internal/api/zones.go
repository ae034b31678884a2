package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	meridiansync "github.com/meridian-mesh/meridian/internal/sync"
)

// ZoneStatuses is the global's per-zone sync status (internal/sync.Server).
type ZoneStatuses interface {
	Statuses() []meridiansync.ZoneStatus
	Status(zone string) (meridiansync.ZoneStatus, bool)
}

// TokenIssuer issues zone tokens (internal/auth.ZoneTokens).
type TokenIssuer interface {
	Issue(zone string, validFor time.Duration) (string, error)
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
}

// zoneItem is one zone in GET /zones: Kuma's type/name plus the status.
type zoneItem struct {
	Type string `json:"type"`
	Name string `json:"name"`
	meridiansync.ZoneStatus
}

func (s *Server) handleZones(w http.ResponseWriter, r *http.Request) {
	statuses := s.cfg.Zones.Statuses()
	items := make([]zoneItem, 0, len(statuses))
	for _, st := range statuses {
		items = append(items, zoneItem{Type: "Zone", Name: st.Zone, ZoneStatus: st})
	}
	s.writeValue(w, r, http.StatusOK, map[string]any{"total": len(items), "items": items, "next": nil})
}

func (s *Server) handleZoneOverview(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st, ok := s.cfg.Zones.Status(name)
	if !ok {
		s.writeError(w, r, notFound("zone %q has never connected", name))
		return
	}
	s.writeValue(w, r, http.StatusOK, zoneItem{Type: "Zone", Name: name, ZoneStatus: st})
}

type tokenRequest struct {
	Zone     string `json:"zone"`
	ValidFor string `json:"validFor"`
}

func (s *Server) handleZoneToken(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		s.writeError(w, r, fmt.Errorf("read body: %w", err))
		return
	}
	var req tokenRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.writeError(w, r, badRequest(`want {"zone": NAME, "validFor": "24h"}: %v`, err))
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
	token, err := s.cfg.Tokens.Issue(req.Zone, validFor)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeValue(w, r, http.StatusOK, map[string]string{"token": token})
}
