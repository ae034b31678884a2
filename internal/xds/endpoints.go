package xds

import (
	"crypto/sha256"
	"fmt"
	"sort"
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
type LoadAssignments struct {
	endpoints map[string][]Endpoint
	zone      string

	mu     sync.Mutex
	byName map[assignmentKey]sharedAssignment
}

// assignmentKey is a cluster and whether its localities are prioritized.
type assignmentKey struct {
	name     string
	locality bool
}

type sharedAssignment struct {
	cla    *endpointv3.ClusterLoadAssignment
	digest [sha256.Size]byte // of its deterministic encoding
}

// NewLoadAssignments serves the assignments of endpoints as seen from zone.
func NewLoadAssignments(endpoints map[string][]Endpoint, zone string) *LoadAssignments {
	return &LoadAssignments{endpoints: endpoints, zone: zone, byName: map[assignmentKey]sharedAssignment{}}
}

// get returns the assignment of cluster name (spec) and its digest; with
// locality, the caller's zone is priority 0 and the others 1, else every
// zone is priority 0.
func (l *LoadAssignments) get(name string, spec clusterSpec, locality bool) (sharedAssignment, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := assignmentKey{name, locality}
	if a, ok := l.byName[key]; ok {
		return a, nil
	}
	zone := l.zone
	if !locality {
		zone = ""
	}
	cla := loadAssignment(l.endpoints[spec.service], zone, name, spec.tags)
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(cla)
	if err != nil {
		return sharedAssignment{}, fmt.Errorf("encode %s: %w", name, err)
	}
	a := sharedAssignment{cla: cla, digest: sha256.Sum256(b)}
	l.byName[key] = a
	return a, nil
}

// loadAssignment renders a cluster's endpoints carrying tags: the caller's
// zone first (priority 0), the other zones as failover (1); with no caller
// zone, every zone at priority 0.
func loadAssignment(endpoints []Endpoint, callerZone, name string, tags map[string]string) *endpointv3.ClusterLoadAssignment {
	byZone := map[string][]*endpointv3.LbEndpoint{}
	for _, ep := range endpoints {
		if !hasTags(ep.Tags, tags) {
			continue
		}
		health := corev3.HealthStatus_HEALTHY
		if !ep.Healthy {
			health = corev3.HealthStatus_UNHEALTHY
		}
		byZone[ep.Zone] = append(byZone[ep.Zone], &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress(ep.Address, ep.Port),
			}},
			HealthStatus: health,
		})
	}
	zones := make([]string, 0, len(byZone))
	for z := range byZone {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for _, z := range zones {
		priority := uint32(1)
		if z == callerZone {
			priority = 0
		}
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Zone: z},
			LbEndpoints:         byZone[z],
			LoadBalancingWeight: wrapperspb.UInt32(1),
			Priority:            priority,
		})
	}
	normalizePriorities(cla)
	return cla
}

// normalizePriorities makes the priorities used contiguous from 0, as xDS
// requires: with no endpoint in the proxy's own zone, the other zones are
// priority 0.
func normalizePriorities(cla *endpointv3.ClusterLoadAssignment) {
	used := map[uint32]bool{}
	for _, l := range cla.Endpoints {
		used[l.Priority] = true
	}
	if !used[0] {
		for _, l := range cla.Endpoints {
			l.Priority = 0
		}
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
