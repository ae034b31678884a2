package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Policy status (docs/policy.md#status). A zone serves every policy with the status
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
	snap     *policy.MeshSnapshot
	zones    ZoneStatuses
	rejected SyncRejections
	// xds gives a zone's Programmed conditions (nil: no data plane).
	xds  XDSState
	mesh string
}

// SyncRejections says whether the global rejected one of this zone's
// resources, and why (internal/kds.Client).
type SyncRejections interface {
	Rejected(key resource.Key) (string, bool)
}

// Synced condition reasons (a resource a peer rejects is visible
// where it was written).
const (
	condSynced            = "Synced"
	reasonRejectedByPeer  = "Rejected"
	conditionStatusFalse  = "False"
	syncedRejectedMessage = "rejected by %s: %s"
)

// policyStatuses returns the status source for resources of typeName in
// mesh: the zone's snapshot for policy types, nothing otherwise.
func (s *Server) policyStatuses(r *http.Request, typeName, mesh string) (statusSource, error) {
	d, ok := s.reg.Lookup(typeName)
	if !ok || !d.IsPolicy() || mesh == "" {
		return statusSource{}, nil
	}
	if s.cfg.Plane.IsGlobal() {
		return statusSource{zones: s.cfg.Zones}, nil
	}
	snap, err := s.cfg.Snapshots.StatusSnapshot(r.Context(), mesh)
	if err != nil {
		return statusSource{}, err
	}
	return statusSource{snap: snap, rejected: s.cfg.Rejections, xds: s.cfg.XDS, mesh: mesh}, nil
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
	var conds []policy.Condition
	if st, err := src.snap.PolicyStatus(res.Type, res.Name, res.Namespace); err == nil {
		conds = append(conds, st.Conditions...)
	}
	if src.xds != nil {
		if c, ok := src.xds.Programmed(src.snap, src.mesh, res.Type, res.Name, res.Namespace); ok {
			conds = append(conds, c)
		}
	}
	if src.rejected != nil {
		if msg, ok := src.rejected.Rejected(res.Key()); ok {
			conds = append(conds, policy.Condition{Type: condSynced, Status: conditionStatusFalse, Reason: reasonRejectedByPeer,
				Message: fmt.Sprintf(syncedRejectedMessage, "the global control plane", msg)})
		}
	}
	if conds == nil {
		return &out // written after the statuses were computed: no verdict yet
	}
	if b, err := json.Marshal(policy.PolicyStatus{Conditions: conds}); err == nil {
		out.Status = b
	}
	return &out
}

// attachZones shows, on the global, each zone's status of a global policy
// under status.zones (as the zones last reported it, docs/policy.md#status).
func (src statusSource) attachZones(res *resource.Resource) *resource.Resource {
	if res.Labels.Get(resource.LabelOrigin) != resource.OriginGlobal {
		return res
	}
	out := *res
	out.Status = nil
	zones := src.zones.PolicyStatuses(res.Type, res.Mesh, res.Name)
	if zones == nil {
		zones = []kds.ZonePolicyStatus{}
	}
	for _, rej := range src.zones.RejectedBy(res.Key()) {
		i := slices.IndexFunc(zones, func(z kds.ZonePolicyStatus) bool { return z.Zone == rej.Zone })
		if i < 0 {
			zones = append(zones, kds.ZonePolicyStatus{Zone: rej.Zone})
			i = len(zones) - 1
		}
		zones[i].Conditions = append(slices.Clone(zones[i].Conditions), kds.ReportCondition{Type: condSynced,
			Status: conditionStatusFalse, Reason: reasonRejectedByPeer, Message: fmt.Sprintf(syncedRejectedMessage, "zone "+rej.Zone, rej.Message)})
	}
	if b, err := json.Marshal(map[string]any{"zones": zones}); err == nil {
		out.Status = b
	}
	return &out
}
