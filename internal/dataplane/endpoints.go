package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/xds"
)

// Endpoints keeps every service's endpoints of every mesh as the zone's
// proxies reach them (docs/dataplane.md#endpoints): this zone's from its
// Dataplanes' inbounds (healthy when ready and, for an agent's Dataplane,
// while the agent is connected), the other zones' from their endpoint
// summaries (ZoneEndpoints, relayed by the global). It writes this zone's
// summaries, one per mesh and service, for the other zones: compact
// endpoints, never whole Dataplanes.
type Endpoints struct {
	cfg EndpointsConfig

	// state is the follower's (Run's goroutine), and presence the
	// channel of the agents' next coming or going.
	state    *endpointState
	presence <-chan struct{}

	mu     sync.Mutex
	byMesh map[string]map[string][]xds.Endpoint
	next   chan struct{}
}

// EndpointsConfig wires Endpoints. Store and Plane (a zone) are required.
type EndpointsConfig struct {
	Store storage.Store
	Plane plane.Plane
	// Live says whether an agent-registered Dataplane's agent is
	// connected; Presence signals when that changes.
	Live     func(nodeID string) bool
	Presence func() <-chan struct{}
	Logger   hclog.Logger
	// Settle is how long changes settle before the endpoints are
	// recomputed; 0 means 20 ms. MaxSettle is the longest the window
	// grows to while changes come back to back; 0 means 320 ms.
	Settle, MaxSettle time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// NewEndpoints checks cfg.
func NewEndpoints(cfg EndpointsConfig) (*Endpoints, error) {
	if cfg.Store == nil || !cfg.Plane.IsZone() {
		return nil, errors.New("dataplane endpoints: Store and a zone Plane are required")
	}
	if cfg.Live == nil {
		cfg.Live = func(string) bool { return true }
	}
	if cfg.Presence == nil {
		cfg.Presence = func() <-chan struct{} { return nil }
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 20 * time.Millisecond
	}
	if cfg.MaxSettle <= 0 {
		cfg.MaxSettle = 320 * time.Millisecond
	}
	cfg.MaxSettle = max(cfg.MaxSettle, cfg.Settle)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Endpoints{cfg: cfg, state: newEndpointState(), byMesh: map[string]map[string][]xds.Endpoint{}, next: make(chan struct{})}, nil
}

// Of returns mesh's endpoints by service; callers must not change them.
func (e *Endpoints) Of(mesh string) map[string][]xds.Endpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byMesh[mesh]
}

// Changed returns a channel closed at the next change of any endpoints.
func (e *Endpoints) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.next
}

// Run follows the store and the agents until ctx ends.
func (e *Endpoints) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		rev, err := e.cfg.Store.Revision(ctx)
		if err != nil {
			return err
		}
		e.presence = e.cfg.Presence() // before refresh asks who is connected
		e.refresh(ctx)
		events, err := e.cfg.Store.Watch(ctx, rev)
		if err != nil {
			return err
		}
		e.follow(ctx, events)
	}
	return nil
}

// follow applies the store's changes and the agents' comings and goings,
// and flushes them a settling window after the first of a batch. The
// window grows while changes come back to back (a rolling restart, a
// thousand agents joining), since every flush that changes a service
// pushes endpoints to every proxy calling it: doubling from Settle up to
// MaxSettle, back to Settle once a window passes without changes.
func (e *Endpoints) follow(ctx context.Context, events <-chan storage.Event) {
	window := e.cfg.Settle
	var flushed time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.presence:
			e.presenceChanged()
		case ev, ok := <-events:
			if !ok {
				return
			}
			e.apply(ev)
		}
		if len(e.state.dirty) == 0 {
			continue
		}
		quiet := time.Duration(math.MaxInt64)
		if !flushed.IsZero() {
			quiet = e.cfg.Now().Sub(flushed)
		}
		window = e.cfg.nextWindow(window, quiet)
		if !e.settle(ctx, events, window) {
			return
		}
		e.flush(ctx)
		flushed = e.cfg.Now()
	}
}

// presenceChanged takes the agents' comings and goings: the next change's
// channel is taken before asking who is connected, and kept across
// flushes, so that no change goes unseen (one during a flush, when
// nothing waits on the channel, closes it all the same).
func (e *Endpoints) presenceChanged() {
	e.presence = e.cfg.Presence()
	e.checkLive()
}

// nextWindow is the settling window of a batch that starts quiet after
// the last flush, whose window was last: twice last (at most MaxSettle)
// when the batch started within it, else Settle.
func (c EndpointsConfig) nextWindow(last, quiet time.Duration) time.Duration {
	if quiet < last {
		return min(2*last, c.MaxSettle)
	}
	return c.Settle
}

// settle applies the changes that come within window; false when the
// watch ended.
func (e *Endpoints) settle(ctx context.Context, events <-chan storage.Event, window time.Duration) bool {
	t := time.NewTimer(window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-e.presence:
			e.presenceChanged()
		case ev, ok := <-events:
			if !ok {
				return false
			}
			e.apply(ev)
		}
	}
}

// refresh reads every Dataplane and summary again, and flushes every
// service: the start of a watch.
func (e *Endpoints) refresh(ctx context.Context) {
	dps, err := e.cfg.Store.List(ctx, storage.ListOptions{Type: "Dataplane"})
	if err != nil {
		e.cfg.Logger.Warn("listing Dataplanes for endpoints", "error", err)
		return
	}
	summaries, err := e.cfg.Store.List(ctx, storage.ListOptions{Type: "ZoneEndpoints"})
	if err != nil {
		e.cfg.Logger.Warn("listing endpoint summaries", "error", err)
		return
	}
	e.state = newEndpointState()
	for _, r := range dps.Items {
		e.putLocal(r)
	}
	for _, r := range summaries.Items {
		e.putSummary(r)
	}
	// Every service known before is looked at again: one whose last
	// endpoints left while the watch was down is removed.
	e.mu.Lock()
	for mesh, svcs := range e.byMesh {
		for svc := range svcs {
			e.state.dirty[meshService{mesh, svc}] = struct{}{}
		}
	}
	e.mu.Unlock()
	e.flush(ctx)
}

// flush lists the dirty services' endpoints again, writes this zone's
// summaries of them that changed, and publishes those that changed.
func (e *Endpoints) flush(ctx context.Context) {
	st := e.state
	e.mu.Lock()
	prev := e.byMesh
	e.mu.Unlock()
	var next map[string]map[string][]xds.Endpoint // prev, copied on the first change
	cloned := map[string]bool{}
	var unwritten []meshService
	for ms := range st.dirty {
		local, all := st.endpointsOf(ms)
		if !e.writeSummary(ctx, ms, local) {
			unwritten = append(unwritten, ms)
		}
		if old, ok := prev[ms.mesh][ms.service]; ok == (len(all) > 0) && sameEndpoints(old, all) {
			continue // a service whose endpoints did not change keeps its slice
		}
		if next == nil {
			next = maps.Clone(prev)
		}
		if !cloned[ms.mesh] {
			cloned[ms.mesh] = true
			next[ms.mesh] = maps.Clone(next[ms.mesh])
			if next[ms.mesh] == nil {
				next[ms.mesh] = map[string][]xds.Endpoint{}
			}
		}
		if len(all) == 0 {
			delete(next[ms.mesh], ms.service)
		} else {
			next[ms.mesh][ms.service] = all
		}
	}
	clear(st.dirty)
	for _, ms := range unwritten {
		st.dirty[ms] = struct{}{} // written again with the next batch
	}
	e.dropStaleSummaries(ctx)
	if next == nil {
		return
	}
	for mesh, svcs := range next {
		if len(svcs) == 0 {
			delete(next, mesh)
		}
	}
	e.publish(next)
}

func compareEndpoints(a, b xds.Endpoint) int {
	if c := strings.Compare(a.Address, b.Address); c != 0 {
		return c
	}
	return a.Port - b.Port
}

// summarySpec is a ZoneEndpoints spec.
type summarySpec struct {
	Service   string            `json:"service"`
	Endpoints []summaryEndpoint `json:"endpoints,omitempty"`
}

type summaryEndpoint struct {
	Address string            `json:"address"`
	Port    int               `json:"port"`
	Healthy bool              `json:"healthy"`
	Tags    map[string]string `json:"tags,omitempty"`
}

// writeSummary makes the store's summary of a service of this zone what
// local says: written when it changed, removed when local is empty; false
// when the store failed.
func (e *Endpoints) writeSummary(ctx context.Context, ms meshService, local []xds.Endpoint) bool {
	st := e.state
	key := resource.Key{Type: "ZoneEndpoints", Mesh: ms.mesh, Name: SummaryName(ms.service)}
	if len(local) == 0 {
		if _, ok := st.written[key]; !ok {
			return true
		}
		if err := e.cfg.Store.Delete(ctx, key, 0); err != nil && !errors.Is(err, storage.ErrNotFound) {
			e.cfg.Logger.Warn("removing an endpoint summary", "summary", key, "error", err)
			return false
		}
		delete(st.written, key)
		return true
	}
	spec := summarySpec{Service: ms.service, Endpoints: make([]summaryEndpoint, 0, len(local))}
	for _, ep := range local {
		spec.Endpoints = append(spec.Endpoints, summaryEndpoint{Address: ep.Address, Port: ep.Port, Healthy: ep.Healthy, Tags: ep.Tags})
	}
	if len(spec.Endpoints) > resource.MaxZoneEndpoints {
		e.cfg.Logger.Warn("too many endpoints for one summary; the other zones see the first ones", "mesh", ms.mesh, "service", ms.service,
			"endpoints", len(spec.Endpoints), "max", resource.MaxZoneEndpoints)
		spec.Endpoints = spec.Endpoints[:resource.MaxZoneEndpoints]
	}
	raw, _ := json.Marshal(spec)
	if have, ok := st.written[key]; ok && have.ms == ms && sameSummary(have.raw, raw, spec) {
		return true
	}
	r := &resource.Resource{Type: "ZoneEndpoints", Mesh: ms.mesh, Name: key.Name, Spec: raw}
	r.Labels.Set(resource.LabelOrigin, resource.OriginZone)
	r.Labels.Set(resource.LabelZone, e.cfg.Plane.Zone)
	if _, _, err := e.cfg.Store.Put(ctx, r); err != nil {
		e.cfg.Logger.Warn("writing an endpoint summary", "mesh", ms.mesh, "service", ms.service, "error", err)
		return false
	}
	st.written[key] = writtenSummary{ms: ms, raw: raw}
	return true
}

// dropStaleSummaries removes this zone's summaries stored under another
// name than their service's (unreadable ones too): written under an older
// naming, or by hand.
func (e *Endpoints) dropStaleSummaries(ctx context.Context) {
	for key, w := range e.state.written {
		if w.ms.service != "" && key.Namespace == "" && key.Name == SummaryName(w.ms.service) {
			continue
		}
		delete(e.state.written, key)
		if err := e.cfg.Store.Delete(ctx, key, 0); err != nil && !errors.Is(err, storage.ErrNotFound) {
			e.cfg.Logger.Warn("removing an endpoint summary", "summary", key, "error", err)
		}
	}
}

// sameSummary says whether a stored summary's spec is the one rendered
// (raw, the encoding of want). The store keeps the bytes written, so an
// unchanged summary is the same bytes; one written otherwise (by an older
// encoder, in another field order) is compared decoded.
func sameSummary(stored, raw []byte, want summarySpec) bool {
	if bytes.Equal(stored, raw) {
		return true
	}
	var have summarySpec
	if json.Unmarshal(stored, &have) != nil {
		return false
	}
	return have.Service == want.Service && slices.EqualFunc(have.Endpoints, want.Endpoints, func(a, b summaryEndpoint) bool {
		return a.Address == b.Address && a.Port == b.Port && a.Healthy == b.Healthy && maps.Equal(a.Tags, b.Tags)
	})
}

// SummaryName is the name of a service's summary: the service name made a
// valid resource name, with a hash of it so that two services never share
// one.
func SummaryName(service string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(service) {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if len(name) > 40 {
		name = name[:40]
	}
	if name == "" {
		name = "service"
	}
	h := fnv.New32a()
	h.Write([]byte(service))
	return fmt.Sprintf("%s-%08x", name, h.Sum32())
}

// publish hands out byMesh, which is never changed afterwards.
func (e *Endpoints) publish(byMesh map[string]map[string][]xds.Endpoint) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.byMesh = byMesh
	close(e.next)
	e.next = make(chan struct{})
}
