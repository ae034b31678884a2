package kds

import (
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

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

// reports keeps the latest policy status report of every zone (docs/policy.md#status:
// each global policy's status per zone). A report replaces the zone's
// previous one; it stays after the zone disconnects (its last word). Safe for
// concurrent use.
//
// The layout is compact because the global holds zones × policies
// statuses (a million with 100 zones and 10,000 policies), nearly all one
// of a few condition lists: per zone, the report's distinct lists once,
// and per policy a map slot of its name and the index of its list; a
// policy's name is one string shared by every zone reporting it. Kept as
// decoded, a status was about 330 bytes.
type reports struct {
	mu     sync.Mutex
	byZone map[string]*zoneReport
	// names holds one copy of every policy name the reports carry. It may
	// keep names no report carries any more until it is rebuilt (compact).
	names map[string]string
}

type typeMesh struct{ typ, mesh string }

// zoneReport is one zone's latest report; never written once made.
type zoneReport struct {
	conds  [][]ReportCondition            // distinct condition lists
	byName map[typeMesh]map[string]uint32 // policy name -> index in conds
	n      int                            // statuses
}

// assemble starts a report of zone, which replaces the zone's previous one
// once done. known says whether the global holds the policy a status is
// about; the statuses of others are dropped (a zone reports only the
// global's policies it received).
func (r *reports) assemble(zone string, known func(typ, mesh, name string) bool) reportAssembly {
	return &zoneReportAssembly{r: r, zone: zone, known: known,
		zr: &zoneReport{byName: map[typeMesh]map[string]uint32{}}, lists: map[conditionsKey]uint32{}}
}

// Bounds of what the global keeps of one status: a few conditions with
// short fields (the engine's own are well within them).
const (
	maxReportConditions  = 4
	maxConditionField    = 64
	maxConditionMessage  = 512
	maxReportedNameBytes = 253
)

// zoneReportAssembly is a zoneReport being built; owned by one session.
type zoneReportAssembly struct {
	r     *reports
	zone  string
	known func(typ, mesh, name string) bool
	zr    *zoneReport
	lists map[conditionsKey]uint32 // indexes of zr.conds by value
}

func (a *zoneReportAssembly) add(statuses []*syncv1.PolicyStatus) {
	r, zr := a.r, a.zr
	r.mu.Lock() // for names
	defer r.mu.Unlock()
	if r.names == nil {
		r.names = map[string]string{}
	}
	for _, st := range statuses {
		k := st.GetKey()
		if len(k.GetName()) > maxReportedNameBytes || len(k.GetMesh()) > maxReportedNameBytes ||
			len(k.GetType()) > maxConditionField || (a.known != nil && !a.known(k.GetType(), k.GetMesh(), k.GetName())) {
			continue
		}
		tm := typeMesh{k.GetType(), k.GetMesh()}
		byName := zr.byName[tm]
		if byName == nil {
			byName = make(map[string]uint32)
			zr.byName[tm] = byName
		}
		name := r.name(k.GetName())
		if _, dup := byName[name]; !dup {
			zr.n++
		}
		byName[name] = zr.list(a.lists, st.GetConditions())
	}
}

func (a *zoneReportAssembly) done() {
	r := a.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byZone == nil {
		r.byZone = map[string]*zoneReport{}
	}
	r.byZone[a.zone] = a.zr
	r.compact()
}

// name returns the shared copy of a policy name.
func (r *reports) name(s string) string {
	if v, ok := r.names[s]; ok {
		return v
	}
	r.names[s] = s
	return s
}

// compact rebuilds names once it holds more than twice the statuses of the
// largest report (names of policies deleted long ago), so its size stays
// in proportion to what the reports carry.
func (r *reports) compact() {
	most := 0
	for _, zr := range r.byZone {
		most = max(most, zr.n)
	}
	if len(r.names) <= 2*most+1024 {
		return
	}
	names := make(map[string]string, most)
	for _, zr := range r.byZone {
		for _, byName := range zr.byName {
			for n := range byName {
				names[n] = n
			}
		}
	}
	r.names = names
}

// conditionsKey is a list of at most two conditions (the usual Accepted and
// Enforced); longer lists are not shared.
type conditionsKey struct {
	n    int
	list [2]ReportCondition
}

// list returns the index of cs among the report's condition lists, adding
// it unless an equal one is there. A list found allocates nothing: with
// 100 zones reporting at once, a copy per status was 128 MB of garbage.
func (zr *zoneReport) list(lists map[conditionsKey]uint32, cs []*syncv1.Condition) uint32 {
	conv := func(c *syncv1.Condition) ReportCondition {
		return ReportCondition{Type: cut(c.GetType(), maxConditionField), Status: cut(c.GetStatus(), maxConditionField),
			Reason: cut(c.GetReason(), maxConditionField), Message: cut(c.GetMessage(), maxConditionMessage)}
	}
	if len(cs) > maxReportConditions {
		cs = cs[:maxReportConditions]
	}
	if len(cs) > 2 {
		out := make([]ReportCondition, 0, len(cs))
		for _, c := range cs {
			out = append(out, conv(c))
		}
		zr.conds = append(zr.conds, out)
		return uint32(len(zr.conds) - 1)
	}
	k := conditionsKey{n: len(cs)}
	for i, c := range cs {
		k.list[i] = conv(c)
	}
	if i, ok := lists[k]; ok {
		return i
	}
	zr.conds = append(zr.conds, slices.Clone(k.list[:k.n]))
	i := uint32(len(zr.conds) - 1)
	lists[k] = i
	return i
}

// get lists every zone's status of one policy. The conditions are shared:
// callers must not change them.
func (r *reports) get(typ, mesh, name string) []ZonePolicyStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ZonePolicyStatus
	for zone, zr := range r.byZone {
		if i, ok := zr.byName[typeMesh{typ, mesh}][name]; ok {
			out = append(out, ZonePolicyStatus{Zone: zone, Conditions: zr.conds[i]})
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

// cut shortens s to at most n bytes, on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len("…")
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}
