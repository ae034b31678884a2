package api

import (
	"encoding/json"
	"net/http"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
	meridiansync "github.com/meridian-mesh/meridian/internal/sync"
)

// Policy status (SPEC 3.6.4). A zone serves every policy with the status
// its policy engine computes (status.conditions: Accepted, Enforced); it is
// derived, never stored, so a client-supplied status never shows. Reads
// never wait for it: they show the statuses the view last computed, which
// follow policy and Dataplane changes within about StatusDebounce plus a
// rebuild (policyview.StatusSnapshot). A policy written after that
// computation has no status until the next one.

// statusSource gives policy statuses of one mesh; the zero value serves
// none. A zone serves its engine's statuses (snap); the global serves what
// each zone reported for its policies (zones).
type statusSource struct {
	snap  *policy.MeshSnapshot
	zones ZoneStatuses
}

// policyStatuses returns the status source for resources of typeName in
// mesh: the zone's snapshot for policy types, nothing otherwise.
func (s *Server) policyStatuses(r *http.Request, typeName, mesh string) (statusSource, error) {
	d, ok := s.reg.Lookup(typeName)
	if !ok || !d.IsPolicy() || mesh == "" {
		return statusSource{}, nil
	}
	if s.cfg.Mode == ModeGlobal {
		return statusSource{zones: s.cfg.Zones}, nil
	}
	snap, err := s.cfg.Snapshots.StatusSnapshot(r.Context(), mesh)
	if err != nil {
		return statusSource{}, err
	}
	return statusSource{snap: snap}, nil
}

// attach returns res with its computed status (a copy; stored resources
// are immutable), or res unchanged when there is nothing to attach.
func (src statusSource) attach(res *resource.Resource) *resource.Resource {
	if src.zones != nil {
		return src.attachZones(res)
	}
	if src.snap == nil {
		return res
	}
	out := *res
	out.Status = nil // what a client sent is never shown as the engine's verdict
	st, err := src.snap.PolicyStatus(res.Type, res.Name, res.Namespace)
	if err != nil {
		return &out // written after the snapshot was taken: no verdict yet
	}
	if b, err := json.Marshal(st); err == nil {
		out.Status = b
	}
	return &out
}

// attachZones shows, on the global, each zone's status of a global policy
// under status.zones (as the zones last reported it, SPEC 3.6.4).
func (src statusSource) attachZones(res *resource.Resource) *resource.Resource {
	if res.Labels[resource.LabelOrigin] != resource.OriginGlobal {
		return res
	}
	out := *res
	out.Status = nil
	zones := src.zones.PolicyStatuses(res.Type, res.Mesh, res.Name)
	if zones == nil {
		zones = []meridiansync.ZonePolicyStatus{}
	}
	if b, err := json.Marshal(map[string]any{"zones": zones}); err == nil {
		out.Status = b
	}
	return &out
}
