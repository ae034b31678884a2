package xds

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Dataplane is what the xDS rendering reads of a Dataplane resource beyond
// what the policy engine computes: where its inbounds listen and whether
// they are ready.
type Dataplane struct {
	Mesh, Name, Namespace string
	Address               string
	Inbounds              []Inbound
	// Outbounds are the services it declares it calls (its outbounds and
	// transparentProxying.reachableServices), sorted; empty: every service
	// of the mesh (docs/dataplane.md#resources).
	Outbounds []string
}

// Inbound is one inbound of a Dataplane.
type Inbound struct {
	Address string
	Port    int
	Tags    map[string]string
	// Ready is false when the Dataplane reports the inbound not ready.
	Ready bool
}

// Service is the inbound's kuma.io/service.
func (in Inbound) Service() string { return in.Tags[resource.ServiceTag] }

// NodeID is the xDS node id of a Dataplane: <mesh>.<name> in the system
// namespace, <mesh>.<name>.<namespace> in a custom one (as Kuma's).
func NodeID(mesh, name, namespace string) string {
	if namespace == "" {
		return mesh + "." + name
	}
	return mesh + "." + name + "." + namespace
}

// ParseDataplane reads a stored Dataplane resource. ns is its namespace
// with the system namespace as "".
func ParseDataplane(r *resource.Resource, ns string) (*Dataplane, error) {
	var spec struct {
		Networking struct {
			Address string `json:"address"`
			Inbound []struct {
				Address string            `json:"address"`
				Port    int               `json:"port"`
				Tags    map[string]string `json:"tags"`
				State   string            `json:"state"`
				Health  *struct {
					Ready *bool `json:"ready"`
				} `json:"health"`
			} `json:"inbound"`
			Outbound []struct {
				Tags       map[string]string `json:"tags"`
				Service    string            `json:"service"`
				BackendRef *struct {
					Kind string `json:"kind"`
					Name string `json:"name"`
				} `json:"backendRef"`
			} `json:"outbound"`
			TransparentProxying *struct {
				ReachableServices []string `json:"reachableServices"`
			} `json:"transparentProxying"`
		} `json:"networking"`
	}
	if err := json.Unmarshal(r.Spec, &spec); err != nil {
		return nil, fmt.Errorf("Dataplane %s: %w", r.Name, err)
	}
	n := spec.Networking
	dp := &Dataplane{Mesh: r.Mesh, Name: r.Name, Namespace: ns, Address: n.Address}
	for _, in := range n.Inbound {
		addr := in.Address
		if addr == "" {
			addr = n.Address
		}
		ready := in.State != "NotReady" && (in.Health == nil || in.Health.Ready == nil || *in.Health.Ready)
		dp.Inbounds = append(dp.Inbounds, Inbound{Address: addr, Port: in.Port, Tags: in.Tags, Ready: ready})
	}
	for _, out := range n.Outbound {
		svc := out.Tags[resource.ServiceTag]
		if svc == "" {
			svc = out.Service
		}
		if svc == "" && out.BackendRef != nil {
			svc = out.BackendRef.Name
		}
		if svc != "" && !slices.Contains(dp.Outbounds, svc) {
			dp.Outbounds = append(dp.Outbounds, svc)
		}
	}
	// reachableServices narrows what a transparent proxy reaches, as in
	// Kuma; for a proxyless client it names the services it may call.
	if tp := n.TransparentProxying; tp != nil {
		for _, svc := range tp.ReachableServices {
			if svc != "" && !slices.Contains(dp.Outbounds, svc) {
				dp.Outbounds = append(dp.Outbounds, svc)
			}
		}
	}
	slices.Sort(dp.Outbounds)
	return dp, nil
}

// InboundTags are the tag sets of dp's inbounds (what a token's tags are
// checked against).
func (dp *Dataplane) InboundTags() []map[string]string {
	out := make([]map[string]string, len(dp.Inbounds))
	for i, in := range dp.Inbounds {
		out[i] = in.Tags
	}
	return out
}

// Identities are the URI SANs of dp's workload certificate
// (docs/security.md#mesh-ca): spiffe://<mesh>/<service> per inbound
// service and kuma://<key>/<value> per other inbound tag, the ids
// MeshTrafficPermission's RBAC principals match.
func (dp *Dataplane) Identities() []string {
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, in := range dp.Inbounds {
		if svc := in.Service(); svc != "" {
			add("spiffe://" + dp.Mesh + "/" + svc)
		}
	}
	for _, in := range dp.Inbounds {
		keys := make([]string, 0, len(in.Tags))
		for k := range in.Tags {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k != resource.ServiceTag {
				add("kuma://" + k + "/" + in.Tags[k])
			}
		}
	}
	return out
}

// ServerListenerName is the listener a proxyless gRPC server asks for
// when it listens on addr:port (its bootstrap's template).
func ServerListenerName(addr string, port int) string {
	return ServerListenerTemplate[:strings.Index(ServerListenerTemplate, "%s")] + hostPort(addr, port)
}

// ServerListenerTemplate is the bootstrap's server_listener_resource_name_template.
const ServerListenerTemplate = "grpc/server?xds.resource.listening_address=%s"

func hostPort(addr string, port int) string {
	if strings.Contains(addr, ":") {
		return fmt.Sprintf("[%s]:%d", addr, port)
	}
	return fmt.Sprintf("%s:%d", addr, port)
}
