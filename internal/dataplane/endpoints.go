package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
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
	// recomputed; 0 means 20 ms.
	Settle time.Duration
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
	return &Endpoints{cfg: cfg, byMesh: map[string]map[string][]xds.Endpoint{}, next: make(chan struct{})}, nil
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
		e.refresh(ctx)
		events, err := e.cfg.Store.Watch(ctx, rev)
		if err != nil {
			return err
		}
		e.follow(ctx, events)
	}
	return nil
}

func (e *Endpoints) follow(ctx context.Context, events <-chan storage.Event) {
	for {
		presence := e.cfg.Presence()
		select {
		case <-ctx.Done():
			return
		case <-presence:
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Resource == nil || (ev.Resource.Type != "Dataplane" && ev.Resource.Type != "ZoneEndpoints") {
				continue
			}
		}
		e.settle(ctx, events)
		e.refresh(ctx)
	}
}

// settle waits until the changes of a burst stopped for Settle.
func (e *Endpoints) settle(ctx context.Context, events <-chan storage.Event) {
	t := time.NewTimer(e.cfg.Settle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case _, ok := <-events:
			if !ok {
				return
			}
		}
	}
}

// refresh recomputes every mesh's endpoints and writes this zone's
// summaries that changed.
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
	local := e.local(dps.Items)
	byMesh := map[string]map[string][]xds.Endpoint{}
	for mesh, svcs := range local {
		byMesh[mesh] = maps.Clone(svcs)
	}
	own := map[resource.Key]*resource.Resource{}
	for _, r := range summaries.Items {
		if mapping.OwnedByZone(r, e.cfg.Plane.Zone) {
			own[r.Key()] = r
			continue
		}
		e.addRemote(byMesh, r)
	}
	e.writeSummaries(ctx, local, own)
	e.publish(byMesh)
}

// local lists this zone's endpoints by mesh and service.
func (e *Endpoints) local(dps []*resource.Resource) map[string]map[string][]xds.Endpoint {
	out := map[string]map[string][]xds.Endpoint{}
	for _, r := range dps {
		if !mapping.OwnedByZone(r, e.cfg.Plane.Zone) {
			continue
		}
		ns := e.cfg.Plane.Namespace(r.Namespace)
		dp, err := xds.ParseDataplane(r, ns)
		if err != nil {
			continue
		}
		live := r.Labels.Get(LabelManagedBy) != ManagedByAgent || e.cfg.Live(xds.NodeID(dp.Mesh, dp.Name, dp.Namespace))
		for _, in := range dp.Inbounds {
			svc := in.Service()
			if svc == "" {
				continue
			}
			if out[dp.Mesh] == nil {
				out[dp.Mesh] = map[string][]xds.Endpoint{}
			}
			tags := maps.Clone(in.Tags)
			delete(tags, resource.ServiceTag)
			delete(tags, resource.LabelZone)
			out[dp.Mesh][svc] = append(out[dp.Mesh][svc], xds.Endpoint{Address: in.Address, Port: in.Port,
				Zone: e.cfg.Plane.Zone, Healthy: in.Ready && live, Tags: tags})
		}
	}
	for _, svcs := range out {
		for svc, eps := range svcs {
			slices.SortFunc(eps, compareEndpoints)
			svcs[svc] = eps
		}
	}
	return out
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

func (e *Endpoints) addRemote(byMesh map[string]map[string][]xds.Endpoint, r *resource.Resource) {
	var spec summarySpec
	if err := json.Unmarshal(r.Spec, &spec); err != nil || spec.Service == "" {
		return
	}
	zone := r.Labels.Get(resource.LabelZone)
	if byMesh[r.Mesh] == nil {
		byMesh[r.Mesh] = map[string][]xds.Endpoint{}
	}
	for _, ep := range spec.Endpoints {
		byMesh[r.Mesh][spec.Service] = append(byMesh[r.Mesh][spec.Service],
			xds.Endpoint{Address: ep.Address, Port: ep.Port, Zone: zone, Healthy: ep.Healthy, Tags: ep.Tags})
	}
}

// writeSummaries makes the store's summaries of this zone what local says:
// changed ones written, those of services gone removed.
func (e *Endpoints) writeSummaries(ctx context.Context, local map[string]map[string][]xds.Endpoint, own map[resource.Key]*resource.Resource) {
	keep := map[resource.Key]bool{}
	for mesh, svcs := range local {
		for svc, eps := range svcs {
			spec := summarySpec{Service: svc}
			for _, ep := range eps {
				spec.Endpoints = append(spec.Endpoints, summaryEndpoint{Address: ep.Address, Port: ep.Port, Healthy: ep.Healthy, Tags: ep.Tags})
			}
			if len(spec.Endpoints) > resource.MaxZoneEndpoints {
				e.cfg.Logger.Warn("too many endpoints for one summary; the other zones see the first ones", "mesh", mesh, "service", svc,
					"endpoints", len(spec.Endpoints), "max", resource.MaxZoneEndpoints)
				spec.Endpoints = spec.Endpoints[:resource.MaxZoneEndpoints]
			}
			raw, _ := json.Marshal(spec)
			r := &resource.Resource{Type: "ZoneEndpoints", Mesh: mesh, Name: SummaryName(svc), Spec: raw}
			r.Labels.Set(resource.LabelOrigin, resource.OriginZone)
			r.Labels.Set(resource.LabelZone, e.cfg.Plane.Zone)
			keep[r.Key()] = true
			if have := own[r.Key()]; have != nil && sameSummary(have.Spec, raw, spec) {
				continue
			}
			if _, _, err := e.cfg.Store.Put(ctx, r); err != nil {
				e.cfg.Logger.Warn("writing an endpoint summary", "mesh", mesh, "service", svc, "error", err)
			}
		}
	}
	for key := range own {
		if !keep[key] {
			if err := e.cfg.Store.Delete(ctx, key, 0); err != nil && !errors.Is(err, storage.ErrNotFound) {
				e.cfg.Logger.Warn("removing an endpoint summary", "summary", key, "error", err)
			}
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

func (e *Endpoints) publish(byMesh map[string]map[string][]xds.Endpoint) {
	e.mu.Lock()
	defer e.mu.Unlock()
	// A service whose endpoints did not change keeps its slice: the xDS
	// controller tells unchanged inputs by their slices.
	for mesh, svcs := range byMesh {
		for svc, eps := range svcs {
			if old, ok := e.byMesh[mesh][svc]; ok && reflect.DeepEqual(old, eps) {
				svcs[svc] = old
			}
		}
	}
	if reflect.DeepEqual(byMesh, e.byMesh) {
		return
	}
	e.byMesh = byMesh
	close(e.next)
	e.next = make(chan struct{})
}
