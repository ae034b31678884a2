package api

import (
	"encoding/json"
	"net/http"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Policy status (SPEC 3.6.4). A zone serves every policy with the status
// its policy engine computes (status.conditions: Accepted, Enforced); it is
// derived, never stored, so a client-supplied status never shows. Reads
// never wait for it: they show the statuses the view last computed, which
// follow policy and Dataplane changes within about StatusDebounce plus a
// rebuild (policyview.StatusSnapshot). A policy written after that
// computation has no status until the next one.

// statusSource gives policy statuses of one mesh; nil serves none.
type statusSource struct {
	snap *policy.MeshSnapshot
}

// policyStatuses returns the status source for resources of typeName in
// mesh: the zone's snapshot for policy types, nothing otherwise.
func (s *Server) policyStatuses(r *http.Request, typeName, mesh string) (statusSource, error) {
	if s.cfg.Mode != ModeZone || mesh == "" {
		return statusSource{}, nil
	}
	d, ok := s.reg.Lookup(typeName)
	if !ok || !d.IsPolicy() {
		return statusSource{}, nil
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
