package dataplane

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/xds"
)

// endpointState is what the follower knows of the store between
// refreshes, so that a change costs what it touched: a Dataplane is parsed
// when it changes, and only the services a change touched are listed,
// summarized and compared again. During a burst of joins this is the
// difference between reading every Dataplane per refresh and reading each
// once.
type endpointState struct {
	local  map[resource.Key]*localSource
	remote map[resource.Key]*remoteSource
	// sources index both by the services they give endpoints to.
	sources map[meshService]map[resource.Key]struct{}
	// written are this zone's summaries as the store holds them: what
	// the follower wrote, or found at its last refresh.
	written map[resource.Key]writtenSummary
	// dirty are the services whose endpoints may have changed since the
	// last flush.
	dirty map[meshService]struct{}
}

type meshService struct{ mesh, service string }

// localSource is one of this zone's Dataplanes, parsed.
type localSource struct {
	mesh string
	// node is the node id of an agent-registered Dataplane ("" for
	// others), and live whether its agent was connected when last asked.
	node     string
	live     bool
	inbounds []localInbound
}

// localInbound is an inbound's endpoint, healthy when the Dataplane
// reports it ready (the agent's presence is applied when listing).
type localInbound struct {
	service string
	ep      xds.Endpoint
}

// remoteSource is another zone's summary of one service, parsed.
type remoteSource struct {
	ms  meshService
	eps []xds.Endpoint
}

// writtenSummary is one of this zone's summaries: its service (zero when
// unreadable) and its spec as stored.
type writtenSummary struct {
	ms  meshService
	raw []byte
}

func newEndpointState() *endpointState {
	return &endpointState{
		local:   map[resource.Key]*localSource{},
		remote:  map[resource.Key]*remoteSource{},
		sources: map[meshService]map[resource.Key]struct{}{},
		written: map[resource.Key]writtenSummary{},
		dirty:   map[meshService]struct{}{},
	}
}

// apply takes one change of the store.
func (e *Endpoints) apply(ev storage.Event) {
	r := ev.Resource
	if r == nil {
		return
	}
	switch {
	case r.Type == "Dataplane" && ev.Kind == storage.EventPut:
		e.putLocal(r)
	case r.Type == "Dataplane":
		e.state.dropLocal(r.Key())
	case r.Type == "ZoneEndpoints" && ev.Kind == storage.EventPut:
		e.putSummary(r)
	case r.Type == "ZoneEndpoints":
		e.dropSummary(r.Key())
	}
}

// putLocal takes a Dataplane as stored; one of another zone gives no
// endpoints here.
func (e *Endpoints) putLocal(r *resource.Resource) {
	st := e.state
	key := r.Key()
	st.dropLocal(key)
	if !mapping.OwnedByZone(r, e.cfg.Plane.Zone) {
		return
	}
	dp, err := xds.ParseDataplane(r, e.cfg.Plane.Namespace(r.Namespace))
	if err != nil {
		return
	}
	src := &localSource{mesh: dp.Mesh, live: true}
	if r.Labels.Get(LabelManagedBy) == ManagedByAgent {
		src.node = xds.NodeID(dp.Mesh, dp.Name, dp.Namespace)
		src.live = e.cfg.Live(src.node)
	}
	for _, in := range dp.Inbounds {
		svc := in.Service()
		if svc == "" {
			continue
		}
		tags := maps.Clone(in.Tags)
		delete(tags, resource.ServiceTag)
		delete(tags, resource.LabelZone)
		src.inbounds = append(src.inbounds, localInbound{svc, xds.Endpoint{Address: in.Address, Port: in.Port,
			Zone: e.cfg.Plane.Zone, Healthy: in.Ready, Tags: tags}})
		st.link(meshService{dp.Mesh, svc}, key)
	}
	st.local[key] = src
}

func (st *endpointState) dropLocal(key resource.Key) {
	src := st.local[key]
	if src == nil {
		return
	}
	delete(st.local, key)
	for _, in := range src.inbounds {
		st.unlink(meshService{src.mesh, in.service}, key)
	}
}

// putSummary takes a ZoneEndpoints as stored: another zone's gives
// endpoints; one of this zone's that is not what the follower wrote (an
// older encoding, a write by hand) has its service summarized again.
func (e *Endpoints) putSummary(r *resource.Resource) {
	st := e.state
	key := r.Key()
	if mapping.OwnedByZone(r, e.cfg.Plane.Zone) {
		if w, ok := st.written[key]; ok {
			if string(w.raw) == string(r.Spec) {
				return
			}
			st.dirty[w.ms] = struct{}{} // the service it summarized is written again
		}
		var spec summarySpec
		_ = json.Unmarshal(r.Spec, &spec) // unreadable: rewritten or removed at the flush
		w := writtenSummary{ms: meshService{r.Mesh, spec.Service}, raw: r.Spec}
		st.written[key] = w
		st.dirty[w.ms] = struct{}{}
		return
	}
	st.dropRemote(key)
	var spec summarySpec
	if err := json.Unmarshal(r.Spec, &spec); err != nil || spec.Service == "" {
		return
	}
	src := &remoteSource{ms: meshService{r.Mesh, spec.Service}}
	zone := r.Labels.Get(resource.LabelZone)
	for _, ep := range spec.Endpoints {
		src.eps = append(src.eps, xds.Endpoint{Address: ep.Address, Port: ep.Port, Zone: zone, Healthy: ep.Healthy, Tags: ep.Tags})
	}
	st.remote[key] = src
	st.link(src.ms, key)
}

// dropSummary takes a removed ZoneEndpoints: one of this zone's that the
// follower did not remove itself has its service summarized again.
func (e *Endpoints) dropSummary(key resource.Key) {
	st := e.state
	if w, ok := st.written[key]; ok {
		delete(st.written, key)
		st.dirty[w.ms] = struct{}{}
		return
	}
	st.dropRemote(key)
}

func (st *endpointState) dropRemote(key resource.Key) {
	if src := st.remote[key]; src != nil {
		delete(st.remote, key)
		st.unlink(src.ms, key)
	}
}

func (st *endpointState) link(ms meshService, key resource.Key) {
	keys := st.sources[ms]
	if keys == nil {
		keys = map[resource.Key]struct{}{}
		st.sources[ms] = keys
	}
	keys[key] = struct{}{}
	st.dirty[ms] = struct{}{}
}

func (st *endpointState) unlink(ms meshService, key resource.Key) {
	delete(st.sources[ms], key)
	if len(st.sources[ms]) == 0 {
		delete(st.sources, ms)
	}
	st.dirty[ms] = struct{}{}
}

// checkLive asks again whether the agents of agent-registered Dataplanes
// are connected; the services of those whose answer changed are dirty.
func (e *Endpoints) checkLive() {
	for _, src := range e.state.local {
		if src.node == "" {
			continue
		}
		if live := e.cfg.Live(src.node); live != src.live {
			src.live = live
			for _, in := range src.inbounds {
				e.state.dirty[meshService{src.mesh, in.service}] = struct{}{}
			}
		}
	}
}

// endpointsOf lists a service's endpoints: this zone's, sorted by
// address and port (then Dataplane), then the other zones' summaries' in
// the summaries' name order. local are this zone's alone (a prefix of
// all). The order is fixed so that unchanged endpoints compare equal.
func (st *endpointState) endpointsOf(ms meshService) (local, all []xds.Endpoint) {
	type keyed struct {
		key resource.Key
		ep  xds.Endpoint
	}
	var mine []keyed
	var remotes []resource.Key
	for key := range st.sources[ms] {
		if src := st.local[key]; src != nil {
			for _, in := range src.inbounds {
				if in.service == ms.service {
					ep := in.ep
					ep.Healthy = ep.Healthy && src.live
					mine = append(mine, keyed{key, ep})
				}
			}
			continue
		}
		remotes = append(remotes, key)
	}
	slices.SortFunc(mine, func(a, b keyed) int {
		if c := compareEndpoints(a.ep, b.ep); c != 0 {
			return c
		}
		return compareKeys(a.key, b.key)
	})
	slices.SortFunc(remotes, compareKeys)
	for _, m := range mine {
		all = append(all, m.ep)
	}
	local = all[:len(all):len(all)]
	for _, key := range remotes {
		all = append(all, st.remote[key].eps...)
	}
	return local, all
}

func compareKeys(a, b resource.Key) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// sameEndpoints: the same endpoints in the same order.
func sameEndpoints(a, b []xds.Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y xds.Endpoint) bool {
		return x.Address == y.Address && x.Port == y.Port && x.Zone == y.Zone && x.Healthy == y.Healthy && maps.Equal(x.Tags, y.Tags)
	})
}
