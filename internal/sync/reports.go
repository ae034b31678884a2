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

// set replaces zone's report. Equal condition lists share one copy, and
// type and mesh names one string: a zone reports each of the global's
// policies with one of a few condition lists, and each decoded status
// carried its own copy of every string. At 100,000 policies that was about
// 330 bytes per policy and zone on the global (100 MB for 3 zones); what
// is kept per status now is the key's name and a map slot.
func (r *reports) set(zone string, rep *syncv1.PolicyStatusReport) {
	m := make(map[reportKey][]ReportCondition, len(rep.GetStatuses()))
	in := reportInterner{strs: map[string]string{}, conds: map[conditionsKey][]ReportCondition{}}
	for _, st := range rep.GetStatuses() {
		k := st.GetKey()
		m[reportKey{in.str(k.GetType()), in.str(k.GetMesh()), k.GetName()}] = in.conditions(st.GetConditions())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byZone == nil {
		r.byZone = map[string]map[reportKey][]ReportCondition{}
	}
	r.byZone[zone] = m
}

// reportInterner shares what the statuses of one report repeat. It lives
// for one report, so it needs no bound beyond the report's own size.
type reportInterner struct {
	strs  map[string]string
	conds map[conditionsKey][]ReportCondition
}

// conditionsKey is a list of at most two conditions (the usual Accepted and
// Enforced); longer lists are not shared.
type conditionsKey struct {
	n    int
	list [2]ReportCondition
}

func (in reportInterner) str(s string) string {
	if v, ok := in.strs[s]; ok {
		return v
	}
	in.strs[s] = s
	return s
}

// conditions returns the report's conditions as kept; callers must not
// change the list (it may be shared).
func (in reportInterner) conditions(cs []*syncv1.Condition) []ReportCondition {
	out := make([]ReportCondition, 0, len(cs))
	for _, c := range cs {
		out = append(out, ReportCondition{Type: c.GetType(), Status: c.GetStatus(), Reason: c.GetReason(), Message: c.GetMessage()})
	}
	if len(out) > 2 {
		return out
	}
	k := conditionsKey{n: len(out)}
	copy(k.list[:], out)
	if shared, ok := in.conds[k]; ok {
		return shared
	}
	in.conds[k] = out
	return out
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
