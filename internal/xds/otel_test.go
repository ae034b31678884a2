package xds

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestOTelEndpoint: a backendRef selects the oldest MeshOpenTelemetryBackend
// carrying all its labels (kuma.io/display-name matching the backend's name
// when it has no such label), whose endpoint defaults to 127.0.0.1:4317; an
// inline endpoint is taken as it is; an http collector or no match gives no
// endpoint and says why.
func TestOTelEndpoint(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	backend := func(name string, age time.Duration, labels map[string]string, spec string) *resource.Resource {
		return &resource.Resource{Type: "MeshOpenTelemetryBackend", Mesh: "default", Name: name, Spec: json.RawMessage(spec),
			Labels: resource.NewLabels(labels), CreationTime: t0.Add(-age)}
	}
	backends := otelBackends([]*resource.Resource{
		backend("newer", time.Hour, map[string]string{"team": "obs"}, `{"endpoint":{"address":"10.0.0.2","port":4317}}`),
		backend("older", 2*time.Hour, map[string]string{"team": "obs", "tier": "1"}, `{"endpoint":{"address":"10.0.0.1"}}`),
		backend("local", 0, nil, `{}`),
		backend("http", 0, map[string]string{"proto": "http"}, `{"endpoint":{"address":"c","port":4318},"protocol":"http"}`),
		backend("renamed", 0, map[string]string{resource.LabelDisplayName: "main"}, `{"endpoint":{"address":"m","port":9000}}`),
	})
	g := &generator{in: Input{OTelBackends: backends}}
	for _, tc := range []struct {
		name, endpoint, ref string
		want, problem       string
	}{
		{"inline", "c:4317", ``, "c:4317", ""},
		{"inline without a port", "otel-collector", ``, "otel-collector:4317", ""},
		{"inline with an empty port", "otel-collector:", ``, "otel-collector:4317", ""},
		{"inline IPv6", "2001:db8::1", ``, "[2001:db8::1]:4317", ""},
		{"inline IPv6 with a port", "[2001:db8::1]:4318", ``, "[2001:db8::1]:4318", ""},
		{"oldest of two", "", `{"kind":"MeshOpenTelemetryBackend","labels":{"team":"obs"}}`, "10.0.0.1:4317", ""},
		{"all labels", "", `{"kind":"MeshOpenTelemetryBackend","labels":{"team":"obs","tier":"2"}}`, "", "no MeshOpenTelemetryBackend has labels {team=obs, tier=2}"},
		{"display name is the name", "", `{"kind":"MeshOpenTelemetryBackend","labels":{"kuma.io/display-name":"local"}}`, "127.0.0.1:4317", ""},
		{"display name label", "", `{"kind":"MeshOpenTelemetryBackend","labels":{"kuma.io/display-name":"main"}}`, "m:9000", ""},
		{"label over name", "", `{"kind":"MeshOpenTelemetryBackend","labels":{"kuma.io/display-name":"renamed"}}`, "", "no MeshOpenTelemetryBackend has labels {kuma.io/display-name=renamed}"},
		{"http collector", "", `{"kind":"MeshOpenTelemetryBackend","labels":{"proto":"http"}}`, "", "MeshOpenTelemetryBackend http is an http collector, which Envoy's OpenTelemetry exporters do not reach (Kuma sends to it through kuma-dp)"},
		{"no labels", "", `{"kind":"MeshOpenTelemetryBackend"}`, "", "no MeshOpenTelemetryBackend has labels {}"},
		{"nothing", "", ``, "", "it names no collector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, problem := g.otelEndpoint(tc.endpoint, json.RawMessage(tc.ref))
			if got != tc.want || problem != tc.problem {
				t.Errorf("got %q (%q), want %q (%q)", got, problem, tc.want, tc.problem)
			}
		})
	}
}
