package kds

import (
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// FlowStatus describes one direction of a zone's sync (global -> zone or
// zone -> global), counted by the process that reports it: "sent" counts
// the batches of this direction whether this process sent or received them,
// "acked"/"nacked" the receiver's answers. JSON-serializable.
type FlowStatus struct {
	// RevisionSent is the highest sender store revision carried so far.
	RevisionSent uint64 `json:"revisionSent"`
	// RevisionAcked is the sender revision the receiver has applied and
	// recorded as its resume point.
	RevisionAcked uint64 `json:"revisionAcked"`
	BatchesSent   uint64 `json:"batchesSent"`
	BatchesAcked  uint64 `json:"batchesAcked"`
	BatchesNacked uint64 `json:"batchesNacked"`
	// ResourcesSent counts upserts, RemovalsSent removals.
	ResourcesSent uint64 `json:"resourcesSent"`
	RemovalsSent  uint64 `json:"removalsSent"`
	FullSnapshots uint64 `json:"fullSnapshots"`
	// LastNackError is the receiver's last rejection, summarized.
	LastNackError string     `json:"lastNackError,omitempty"`
	LastNackTime  *time.Time `json:"lastNackTime,omitempty"`
	// Types counts per resource type the batches that carried it.
	Types map[string]*TypeCounters `json:"types,omitempty"`
}

// TypeCounters are the per-type batch counts of a FlowStatus.
type TypeCounters struct {
	BatchesSent   uint64 `json:"batchesSent"`
	BatchesAcked  uint64 `json:"batchesAcked"`
	BatchesNacked uint64 `json:"batchesNacked"`
	// Resources counts the upserts and removals of this type.
	Resources uint64 `json:"resources"`
}

// Lag is how many sender revisions the receiver has not confirmed yet.
func (f FlowStatus) Lag() uint64 {
	if f.RevisionSent > f.RevisionAcked {
		return f.RevisionSent - f.RevisionAcked
	}
	return 0
}

func (f FlowStatus) clone() FlowStatus {
	c := f
	c.LastNackTime = cloneTime(f.LastNackTime)
	if f.Types != nil {
		c.Types = make(map[string]*TypeCounters, len(f.Types))
		for k, v := range f.Types {
			tc := *v
			c.Types[k] = &tc
		}
	}
	return c
}

// ZoneStatus is what the global knows about one zone (docs/kds.md#zone-status), for
// GET /zones and /zones/{name}/_overview. JSON-serializable.
type ZoneStatus struct {
	Zone      string `json:"zone"`
	Connected bool   `json:"connected"`
	// ConnectTime and DisconnectTime are of the latest stream.
	ConnectTime     *time.Time `json:"connectTime,omitempty"`
	DisconnectTime  *time.Time `json:"disconnectTime,omitempty"`
	SoftwareVersion string     `json:"softwareVersion,omitempty"`
	Environment     string     `json:"environment,omitempty"`
	SystemNamespace string     `json:"systemNamespace,omitempty"`
	Features        []string   `json:"features,omitempty"`
	LastHeartbeat   *time.Time `json:"lastHeartbeat,omitempty"`
	// LastError is why the latest stream ended, or its latest refusal.
	LastError string `json:"lastError,omitempty"`
	// Connections counts the streams accepted since the global started.
	Connections  uint64     `json:"connections"`
	GlobalToZone FlowStatus `json:"globalToZone"`
	ZoneToGlobal FlowStatus `json:"zoneToGlobal"`
	// ServedBy names the global replica whose stream this is (HA on etcd;
	// empty with a single global).
	ServedBy string `json:"servedBy,omitempty"`
	// Quota is what the zone stores on the global against its limits.
	Quota *QuotaStatus `json:"quota,omitempty"`
}

// QuotaStatus is a zone's use of its quota on the global.
type QuotaStatus struct {
	Resources    int   `json:"resources"`
	Bytes        int64 `json:"bytes"`
	MaxResources int   `json:"maxResources,omitempty"`
	MaxBytes     int64 `json:"maxBytes,omitempty"`
	// Rejected counts the resources refused for the quota since the zone
	// connected.
	Rejected uint64 `json:"rejected"`
}

func (z ZoneStatus) clone() ZoneStatus {
	c := z
	c.ConnectTime = cloneTime(z.ConnectTime)
	c.DisconnectTime = cloneTime(z.DisconnectTime)
	c.LastHeartbeat = cloneTime(z.LastHeartbeat)
	c.Features = slices.Clone(z.Features)
	c.GlobalToZone = z.GlobalToZone.clone()
	c.ZoneToGlobal = z.ZoneToGlobal.clone()
	if z.Quota != nil {
		q := *z.Quota
		c.Quota = &q
	}
	return c
}

// ClientStatus is a zone's view of its connection to the global.
// JSON-serializable.
type ClientStatus struct {
	Zone      string `json:"zone"`
	Connected bool   `json:"connected"`
	// Global is the global address of the latest attempt (one of several
	// replicas' when the zone was given several).
	Global string `json:"global,omitempty"`
	// ConnectTime and DisconnectTime are of the latest stream.
	ConnectTime    *time.Time `json:"connectTime,omitempty"`
	DisconnectTime *time.Time `json:"disconnectTime,omitempty"`
	// LastError is the latest failure (dial, handshake, stream).
	LastError     string     `json:"lastError,omitempty"`
	LastErrorTime *time.Time `json:"lastErrorTime,omitempty"`
	// Reconnects counts connection attempts after the first.
	Reconnects            uint64     `json:"reconnects"`
	GlobalSoftwareVersion string     `json:"globalSoftwareVersion,omitempty"`
	LastHeartbeat         *time.Time `json:"lastHeartbeat,omitempty"`
	// GlobalToZone.RevisionAcked is the last global revision this zone
	// applied; ZoneToGlobal.RevisionAcked the last zone revision the global
	// acknowledged.
	GlobalToZone FlowStatus `json:"globalToZone"`
	ZoneToGlobal FlowStatus `json:"zoneToGlobal"`
}

func (c ClientStatus) clone() ClientStatus {
	out := c
	out.ConnectTime = cloneTime(c.ConnectTime)
	out.DisconnectTime = cloneTime(c.DisconnectTime)
	out.LastErrorTime = cloneTime(c.LastErrorTime)
	out.LastHeartbeat = cloneTime(c.LastHeartbeat)
	out.GlobalToZone = c.GlobalToZone.clone()
	out.ZoneToGlobal = c.ZoneToGlobal.clone()
	return out
}

func cloneTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}

func timePtr(t time.Time) *time.Time { return &t }

// batchSummary is what status and metrics need to know of one batch.
type batchSummary struct {
	revision     uint64
	lastChunk    bool
	fullSnapshot bool
	upserts      int
	removals     int
	perType      map[string]int
}

func summarize(b *syncv1.DeltaBatch) batchSummary {
	s := batchSummary{revision: b.GetRevision(), lastChunk: b.GetLastChunk(), fullSnapshot: b.GetFullSnapshot(),
		upserts: len(b.GetUpserts()), removals: len(b.GetRemovals())}
	if s.upserts+s.removals > 0 {
		s.perType = map[string]int{}
		for _, u := range b.GetUpserts() {
			s.perType[u.GetType()]++
		}
		for _, k := range b.GetRemovals() {
			s.perType[k.GetType()]++
		}
	}
	return s
}

func (s batchSummary) types() []string {
	out := slices.Collect(maps.Keys(s.perType))
	sort.Strings(out)
	return out
}

// flowObserver is told about the batches of one direction: by the sender
// when it sends and when the answer arrives, by the receiver when it has
// answered. Called from the session loop only.
type flowObserver interface {
	batchSent(types []string, s batchSummary)
	batchAnswered(types []string, s batchSummary, nack *syncv1.Nack, rtt time.Duration)
	// snapshotApplied: the receiver applied a full snapshot, receive after
	// its first chunk arrived and apply after its last.
	snapshotApplied(receive, apply time.Duration)
}

// flow records one direction into a FlowStatus guarded by mu (the owner's
// lock) and into the metrics.
type flow struct {
	mu    *sync.Mutex
	st    *FlowStatus
	clock Clock
	m     flowMetrics
}

func (f *flow) batchSent(types []string, s batchSummary) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.st
	st.BatchesSent++
	st.ResourcesSent += uint64(s.upserts)
	st.RemovalsSent += uint64(s.removals)
	if s.fullSnapshot && s.lastChunk {
		st.FullSnapshots++
	}
	st.RevisionSent = max(st.RevisionSent, s.revision)
	for _, t := range types {
		tc := f.typeCounters(t)
		tc.BatchesSent++
		tc.Resources += uint64(s.perType[t])
	}
	f.m.sent(s)
}

func (f *flow) snapshotApplied(receive, apply time.Duration) { f.m.snapshotApplied(receive, apply) }

func (f *flow) batchAnswered(types []string, s batchSummary, nack *syncv1.Nack, rtt time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.st
	if s.lastChunk && s.revision > 0 {
		if s.fullSnapshot {
			st.RevisionAcked = s.revision
		} else {
			st.RevisionAcked = max(st.RevisionAcked, s.revision)
		}
	}
	if nack == nil {
		st.BatchesAcked++
	} else {
		st.BatchesNacked++
		st.LastNackError = nackSummary(nack)
		st.LastNackTime = timePtr(f.clock.Now())
	}
	for _, t := range types {
		if nack == nil {
			f.typeCounters(t).BatchesAcked++
		} else {
			f.typeCounters(t).BatchesNacked++
		}
	}
	f.m.answered(nack != nil, rtt)
}

func (f *flow) typeCounters(t string) *TypeCounters {
	if f.st.Types == nil {
		f.st.Types = map[string]*TypeCounters{}
	}
	tc := f.st.Types[t]
	if tc == nil {
		tc = &TypeCounters{}
		f.st.Types[t] = tc
	}
	return tc
}

// tracker keeps the global's per-zone status. Sessions write through
// their flows and the methods below; the API reads copies. Safe for
// concurrent use.
type tracker struct {
	mu      sync.Mutex
	clock   Clock
	metrics *Metrics
	zones   map[string]*zoneEntry
	nextID  uint64
	// changed is closed (and replaced) when a zone connects or
	// disconnects: the console's live pages wait on it.
	changed chan struct{}
}

// notifyLocked wakes the waiters of Changed; t.mu is held.
func (t *tracker) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

func (t *tracker) changes() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

type zoneEntry struct {
	st      ZoneStatus
	session uint64 // id of the stream that owns the zone now; 0 = none
}

func newTracker(clock Clock, m *Metrics) *tracker {
	return &tracker{clock: clock, metrics: m, zones: map[string]*zoneEntry{}, changed: make(chan struct{})}
}

// connected records an accepted stream and returns its id and the flows
// its session reports to.
func (t *tracker) connected(zone string, hs *syncv1.Handshake, env string, zoneRevApplied uint64) (id uint64, g2z, z2g *flow) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(zone)
	t.nextID++
	e.session = t.nextID
	now := t.clock.Now()
	st := &e.st
	st.Connected, st.ConnectTime, st.Connections = true, timePtr(now), st.Connections+1
	st.SoftwareVersion, st.Environment, st.SystemNamespace = hs.GetSoftwareVersion(), env, hs.GetSystemNamespace()
	st.Features = slices.Clone(hs.GetFeatures())
	st.LastHeartbeat = timePtr(now)
	st.GlobalToZone.RevisionAcked = hs.GetResumeRevision()
	st.ZoneToGlobal.RevisionAcked = zoneRevApplied
	t.metrics.connected(zone, true)
	if st.Connections > 1 {
		t.metrics.reconnected(zone)
	}
	t.notifyLocked()
	return e.session,
		&flow{mu: &t.mu, st: &st.GlobalToZone, clock: t.clock, m: t.metrics.flow(DirectionGlobalToZone, zone)},
		&flow{mu: &t.mu, st: &st.ZoneToGlobal, clock: t.clock, m: t.metrics.flow(DirectionZoneToGlobal, zone)}
}

// disconnected records the end of stream id (unless a newer stream of the
// same zone has taken over).
func (t *tracker) disconnected(zone string, id uint64, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.zones[zone]
	if e == nil || e.session != id {
		return
	}
	e.session = 0
	e.st.Connected = false
	e.st.DisconnectTime = timePtr(t.clock.Now())
	e.st.LastError = reason
	t.metrics.connected(zone, false)
	t.notifyLocked()
}

// refused records a refused handshake for a zone already known (unknown
// names are only logged: an unauthenticated caller must not grow the map).
func (t *tracker) heartbeat(zone string, id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.zones[zone]; e != nil && e.session == id {
		e.st.LastHeartbeat = timePtr(t.clock.Now())
	}
}

// quota records a zone's use of its quota.
func (t *tracker) quota(zone string, q QuotaStatus) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entry(zone).st.Quota = &q
}

func (t *tracker) entry(zone string) *zoneEntry {
	e := t.zones[zone]
	if e == nil {
		e = &zoneEntry{st: ZoneStatus{Zone: zone}}
		t.zones[zone] = e
	}
	return e
}

func (t *tracker) status(zone string) (ZoneStatus, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.zones[zone]
	if e == nil {
		return ZoneStatus{}, false
	}
	return e.st.clone(), true
}

func (t *tracker) statuses() []ZoneStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]ZoneStatus, 0, len(t.zones))
	for _, e := range t.zones {
		out = append(out, e.st.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Zone < out[j].Zone })
	return out
}
