package xds

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// MeshOpenTelemetryBackend references (docs/dataplane.md#envoy). Kuma 2.14's
// MeshAccessLog, MeshTrace and MeshMetric OpenTelemetry backends may name
// their collector by a backendRef to a MeshOpenTelemetryBackend of the mesh,
// selected by labels (the oldest when several match). An Envoy sidecar's
// access logs and tracing export to it directly, as Kuma does without its
// kuma-dp pipe: Envoy's OpenTelemetry logger and tracer speak gRPC, so an
// http collector (which Kuma reaches through kuma-dp) is named as not
// rendered. MeshMetric's push is kuma-dp's, which meridian-dp does not do.

// defaultOTelPort is where a collector listens when its
// MeshOpenTelemetryBackend names no port (OTLP over gRPC).
const defaultOTelPort = 4317

// OTelBackend is a MeshOpenTelemetryBackend as a proxy exports to it.
type OTelBackend struct {
	// Name is the backend's display name.
	Name string
	// Endpoint is host:port: the spec's address, else the proxy's node
	// (127.0.0.1: meridian-dp runs beside the workload), and its port,
	// else 4317.
	Endpoint string
	// HTTP: the collector speaks OTLP over HTTP.
	HTTP   bool
	labels resource.Labels
}

// otelBackends reads a mesh's MeshOpenTelemetryBackends, oldest first (a
// reference matching several takes the oldest, as in Kuma). A backend whose
// spec cannot be read is left out: the API validated it, so only a store
// written around the API holds one.
func otelBackends(rs []*resource.Resource) []OTelBackend {
	sorted := slices.Clone(rs)
	slices.SortStableFunc(sorted, func(a, b *resource.Resource) int {
		return cmp.Or(a.CreationTime.Compare(b.CreationTime), strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	var out []OTelBackend
	for _, r := range sorted {
		var spec struct {
			Endpoint *struct {
				Address string `json:"address"`
				Port    int    `json:"port"`
			} `json:"endpoint"`
			Protocol string `json:"protocol"`
		}
		if len(r.Spec) > 0 && json.Unmarshal(r.Spec, &spec) != nil {
			continue
		}
		address, port := "127.0.0.1", defaultOTelPort
		if ep := spec.Endpoint; ep != nil {
			if ep.Address != "" {
				address = ep.Address
			}
			if ep.Port != 0 {
				port = ep.Port
			}
		}
		out = append(out, OTelBackend{Name: r.DisplayName(), Endpoint: net.JoinHostPort(address, strconv.Itoa(port)),
			HTTP: spec.Protocol == "http", labels: r.Labels})
	}
	return out
}

// selectedBy: the backend carries every label of want. kuma.io/display-name
// matches the backend's display name: its label, else its name (a backend
// made in this zone carries no such label).
func (b *OTelBackend) selectedBy(want map[string]string) bool {
	if len(want) == 0 {
		return false
	}
	for k, v := range want {
		have, ok := b.labels.Lookup(k)
		if k == resource.LabelDisplayName && !ok {
			have, ok = b.Name, true
		}
		if !ok || have != v {
			return false
		}
	}
	return true
}

// otelEndpoint is where an OpenTelemetry backend of a policy exports:
// its inline endpoint, else the MeshOpenTelemetryBackend its backendRef
// selects. problem says why there is none.
func (g *generator) otelEndpoint(endpoint string, backendRef json.RawMessage) (string, string) {
	if endpoint != "" {
		return inlineOTelEndpoint(endpoint), ""
	}
	var ref struct {
		Labels map[string]string `json:"labels"`
	}
	if len(backendRef) == 0 || json.Unmarshal(backendRef, &ref) != nil {
		return "", "it names no collector"
	}
	for i := range g.in.OTelBackends {
		b := &g.in.OTelBackends[i]
		if !b.selectedBy(ref.Labels) {
			continue
		}
		if b.HTTP {
			return "", fmt.Sprintf("MeshOpenTelemetryBackend %s is an http collector, which Envoy's OpenTelemetry exporters do not reach (Kuma sends to it through kuma-dp)", b.Name)
		}
		return b.Endpoint, ""
	}
	return "", "no MeshOpenTelemetryBackend has labels " + formatLabels(ref.Labels)
}

// inlineOTelEndpoint is an inline endpoint with its port, 4317 when it
// names none (Kuma: "an empty port defaults to 4317"); a bare IPv6
// address is a host.
func inlineOTelEndpoint(endpoint string) string {
	host, port, err := net.SplitHostPort(endpoint)
	switch {
	case err != nil: // no port: a host, or a bare IPv6 address
		host = strings.TrimSuffix(strings.TrimPrefix(endpoint, "["), "]")
	case port != "":
		return endpoint
	}
	return net.JoinHostPort(host, strconv.Itoa(defaultOTelPort))
}

// formatLabels is labels as k=v pairs in key order.
func formatLabels(labels map[string]string) string {
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		pairs = append(pairs, k+"="+labels[k])
	}
	return "{" + strings.Join(pairs, ", ") + "}"
}

// otelContext sums up the backends for a rendering's context: a change of
// any renders the proxy's parts again.
func otelContext(backends []OTelBackend) string {
	var b strings.Builder
	for _, be := range backends {
		fmt.Fprintf(&b, "%s|%s|%t|%s;", be.Name, be.Endpoint, be.HTTP, be.labels.String())
	}
	return b.String()
}
