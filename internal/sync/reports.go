package sync

import (
	"slices"
	"strings"
	gosync "sync"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// ZonePolicyStatus is one zone's status of one of the global's policies.
type ZonePolicyStatus struct {
	Zone       string            `json:"zone"`
	Conditions []ReportCondition `json:"conditions"`
}

// ReportCondition is a status condition as a zone reported it.
type ReportCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type reportKey struct{ typ, mesh, name string }

// reports keeps the latest policy status report of every zone (SPEC 3.6.4:
// each global policy's status per zone). A report replaces the zone's
// previous one; it stays after the zone disconnects (its last word). Safe for
// concurrent use.
type reports struct {
	mu     gosync.Mutex
	byZone map[string]map[reportKey][]ReportCondition
}

func (r *reports) set(zone string, rep *syncv1.PolicyStatusReport) {
	m := make(map[reportKey][]ReportCondition, len(rep.GetStatuses()))
	for _, st := range rep.GetStatuses() {
		k := st.GetKey()
		conds := make([]ReportCondition, 0, len(st.GetConditions()))
		for _, c := range st.GetConditions() {
			conds = append(conds, ReportCondition{Type: c.GetType(), Status: c.GetStatus(), Reason: c.GetReason(), Message: c.GetMessage()})
		}
		m[reportKey{k.GetType(), k.GetMesh(), k.GetName()}] = conds
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byZone == nil {
		r.byZone = map[string]map[reportKey][]ReportCondition{}
	}
	r.byZone[zone] = m
}

func (r *reports) get(typ, mesh, name string) []ZonePolicyStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ZonePolicyStatus
	for zone, m := range r.byZone {
		if conds, ok := m[reportKey{typ, mesh, name}]; ok {
			out = append(out, ZonePolicyStatus{Zone: zone, Conditions: conds})
		}
	}
	slices.SortFunc(out, func(a, b ZonePolicyStatus) int { return strings.Compare(a.Zone, b.Zone) })
	return out
}

// PolicyStatuses returns what each zone last reported for the global's
// policy (type, mesh, name), sorted by zone.
func (s *Server) PolicyStatuses(typ, mesh, name string) []ZonePolicyStatus {
	return s.reports.get(typ, mesh, name)
}
