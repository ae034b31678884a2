package xds

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// LoadAssignments renders each cluster's ClusterLoadAssignment once for
// every proxy of a zone that calls it. An assignment depends only on the
// cluster (a service, maybe a subset of its tags), the service's endpoints
// and the caller's zone, and a mesh's proxies mostly call the same
// services: rendered per proxy, a thousand proxies of ten services would
// hold a million endpoint messages, all encoded again at every mesh-wide
// change.
//
// A LoadAssignments is built for one endpoints map and one zone; the
// assignments it hands out are shared and must not be modified. It is
// safe for concurrent use.
//
// It also keeps, for the same proxies, their TLS transport sockets
// (tlsSocket): a called service's depends only on the kind of proxy, the
// mesh and the service, and encoding it was a quarter of an Envoy
// rendering of 100 outbounds; a gRPC server's is the same for all.
type LoadAssignments struct {
	endpoints map[string][]Endpoint
	zone      string

	mu      sync.Mutex
	byName  map[assignmentKey]sharedAssignment
	sockets map[socketKey]*corev3.TransportSocket
}

// socketKey names a TLS socket: the kind of proxy (ProxyGRPC,
// ProxyEnvoy), the mesh and the called service, or inbound for a server's.
type socketKey struct {
	kind, mesh, service string
	inbound             bool
}

// tlsSocket returns the shared TLS socket of key, built by build on first
// use (outside the lock: concurrent first uses agree on the first
// stored). The socket must not be modified.
func (l *LoadAssignments) tlsSocket(key socketKey, build func() (*corev3.TransportSocket, error)) (*corev3.TransportSocket, error) {
	l.mu.Lock()
	ts, ok := l.sockets[key]
	l.mu.Unlock()
	if ok {
		return ts, nil
	}
	ts, err := build()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if held, ok := l.sockets[key]; ok {
		return held, nil
	}
	if l.sockets == nil {
		l.sockets = map[socketKey]*corev3.TransportSocket{}
	}
	l.sockets[key] = ts
	return ts, nil
}

// assignmentKey is a cluster and how its endpoints are spread over
// priorities and localities (localityPlan.key).
type assignmentKey struct {
	name, plan string
}

type sharedAssignment struct {
	cla     *endpointv3.ClusterLoadAssignment
	digest  [sha256.Size]byte // of its deterministic encoding
	service string            // whose endpoints it assigns
}

// NewLoadAssignments serves the assignments of endpoints as seen from zone.
func NewLoadAssignments(endpoints map[string][]Endpoint, zone string) *LoadAssignments {
	return &LoadAssignments{endpoints: endpoints, zone: zone, byName: map[assignmentKey]sharedAssignment{}}
}

// carryFrom takes prev's assignments of the services whose endpoints are
// the very same slice in both: a proxy none of whose services changed
// keeps the very same resources.
func (l *LoadAssignments) carryFrom(prev *LoadAssignments) {
	prev.mu.Lock()
	defer prev.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, a := range prev.byName {
		if sameSlice(prev.endpoints[a.service], l.endpoints[a.service]) {
			l.byName[key] = a
		}
	}
}

// sameSlice: the very same endpoints (Endpoints hands out a new slice
// for every change of a service).
func sameSlice(a, b []Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// get returns the assignment of cluster name (spec) spread by plan, and
// its digest.
func (l *LoadAssignments) get(name string, spec clusterSpec, plan localityPlan) (sharedAssignment, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := assignmentKey{name, plan.key()}
	if a, ok := l.byName[key]; ok {
		return a, nil
	}
	cla := loadAssignment(l.endpoints[spec.service], l.zone, name, spec.tags, plan)
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(cla)
	if err != nil {
		return sharedAssignment{}, fmt.Errorf("encode %s: %w", name, err)
	}
	a := sharedAssignment{cla: cla, digest: sha256.Sum256(b), service: spec.service}
	l.byName[key] = a
	return a, nil
}

// localityPlan is how a cluster's endpoints are spread over priorities
// and localities: MeshLoadBalancingStrategy's localityAwareness, laid out
// as Kuma 2.14 lays it out (docs/dataplane.md#locality). The zero plan is
// the default: the caller's zone first (priority 0), every other zone as
// failover (priority 1), one locality per zone.
type localityPlan struct {
	// disabled: every zone at priority 0.
	disabled bool
	// grouped: localZone or crossZone is given. Endpoints of the caller's
	// zone are priority 0, in the locality of the first affinity group
	// they match (else the zone's, weight 1); other zones' endpoints take
	// the priority of the first failover rule that admits their zone and
	// are left out when none does.
	grouped  bool
	affinity []affinityGroup
	failover []failoverRule
	// overprovisioning is the assignment's overprovisioning factor (0:
	// not set; gRPC clients have none).
	overprovisioning uint32
}

// affinityGroup is one localZone.affinityTags entry resolved against the
// caller's tags: its endpoints are those whose tag key has value.
type affinityGroup struct {
	key, value string
	weight     uint32
}

// failoverRule is one crossZone.failover entry that applies to the
// caller's zone.
type failoverRule struct {
	kind     string // Any, AnyExcept or Only (None rules admit nothing)
	zones    []string
	priority uint32 // the rule's position + 1, made contiguous later
}

func (r failoverRule) admits(zone string) bool {
	switch r.kind {
	case "Any":
		return true
	case "AnyExcept":
		return !slices.Contains(r.zones, zone)
	case "Only":
		return slices.Contains(r.zones, zone)
	}
	return false
}

// key identifies the plan among a zone's assignments.
func (p localityPlan) key() string {
	if !p.grouped {
		return strconv.FormatBool(p.disabled)
	}
	var b strings.Builder
	b.WriteString("g")
	for _, a := range p.affinity {
		fmt.Fprintf(&b, "|a%q=%q:%d", a.key, a.value, a.weight)
	}
	for _, r := range p.failover {
		fmt.Fprintf(&b, "|f%s%q:%d", r.kind, r.zones, r.priority)
	}
	fmt.Fprintf(&b, "|o%d", p.overprovisioning)
	return b.String()
}

// locality is where plan puts an endpoint of zone with tags, seen from
// callerZone; ok is false when the endpoint is left out.
func (p localityPlan) locality(callerZone, zone string, tags map[string]string) (loc localityOf, ok bool) {
	switch {
	case !p.grouped:
		if p.disabled || zone == callerZone {
			return localityOf{zone: zone, weight: 1}, true
		}
		return localityOf{zone: zone, weight: 1, priority: 1}, true
	case zone == callerZone:
		for _, a := range p.affinity {
			if v, has := tags[a.key]; has && v == a.value {
				return localityOf{zone: zone, subZone: a.key + "=" + a.value, weight: a.weight}, true
			}
		}
		return localityOf{zone: zone, weight: 1}, true
	}
	for _, r := range p.failover {
		if r.admits(zone) {
			return localityOf{zone: zone, weight: 1, priority: r.priority}, true
		}
	}
	return localityOf{}, false
}

// localityOf is a locality of an assignment.
type localityOf struct {
	zone, subZone string
	weight        uint32
	priority      uint32
}

// loadAssignment renders a cluster's endpoints carrying tags, spread by
// plan as seen from callerZone. Localities are sorted by zone and sub
// zone, their priorities made contiguous from 0 (as xDS requires).
func loadAssignment(endpoints []Endpoint, callerZone, name string, tags map[string]string, plan localityPlan) *endpointv3.ClusterLoadAssignment {
	byLocality := map[localityOf][]*endpointv3.LbEndpoint{}
	for _, ep := range endpoints {
		if !hasTags(ep.Tags, tags) {
			continue
		}
		loc, ok := plan.locality(callerZone, ep.Zone, ep.Tags)
		if !ok {
			continue
		}
		health := corev3.HealthStatus_HEALTHY
		if !ep.Healthy {
			health = corev3.HealthStatus_UNHEALTHY
		}
		byLocality[loc] = append(byLocality[loc], &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress(ep.Address, ep.Port),
			}},
			HealthStatus: health,
		})
	}
	locs := slices.SortedFunc(maps.Keys(byLocality), func(a, b localityOf) int {
		return cmp.Or(cmp.Compare(a.zone+a.subZone, b.zone+b.subZone), cmp.Compare(a.priority, b.priority))
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for _, l := range locs {
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Zone: l.zone, SubZone: l.subZone},
			LbEndpoints:         byLocality[l],
			LoadBalancingWeight: wrapperspb.UInt32(l.weight),
			Priority:            l.priority,
		})
	}
	densePriorities(cla)
	if plan.overprovisioning > 0 {
		cla.Policy = &endpointv3.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(plan.overprovisioning)}
	}
	return cla
}

// densePriorities renumbers the priorities used 0, 1, 2... in their
// order, as xDS requires (grpc-go refuses a gap): with no endpoint in the
// proxy's own zone, the first failover is priority 0.
func densePriorities(cla *endpointv3.ClusterLoadAssignment) {
	var used []uint32
	for _, l := range cla.Endpoints {
		used = append(used, l.Priority)
	}
	slices.Sort(used)
	used = slices.Compact(used)
	for _, l := range cla.Endpoints {
		i, _ := slices.BinarySearch(used, l.Priority)
		l.Priority = uint32(i)
	}
}

func hasTags(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
