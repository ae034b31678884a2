package resource

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"
)

func TestValidateEnvelope(t *testing.T) {
	timeout := `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}`
	dataplane := `{"networking":{"address":"10.0.0.1","inbound":[{"port":80,"tags":{"kuma.io/service":"web"}}]}}`
	global := plane.Plane{Mode: plane.Global, SystemNamespace: plane.DefaultSystemNamespace}
	universal := plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvUniversal, SystemNamespace: plane.DefaultSystemNamespace}
	k8s := kubernetesZone()
	cases := []struct {
		name string
		r    Resource
		opts plane.Plane
		want []string
	}{
		{"valid policy", Resource{Type: "MeshTimeout", Mesh: "default", Name: "t.v1", Spec: json.RawMessage(timeout)}, global, nil},
		{"valid mesh", Resource{Type: "Mesh", Name: "default"}, global, nil},
		{"empty type", Resource{Name: "x"}, global, []string{"type: must be set"}},
		{"unknown type", Resource{Type: "MeshTimout", Name: "x"}, global, []string{`type: unknown resource type "MeshTimout"`}},
		{"missing name", Resource{Type: "Mesh"}, global, []string{"name: must be set"}},
		{"bad name", Resource{Type: "Mesh", Name: "My_Mesh"}, global,
			[]string{`name: invalid name "My_Mesh": must be a lowercase RFC 1123 subdomain of at most 253 characters`}},
		{"long name", Resource{Type: "Mesh", Name: strings.Repeat("a", 254)}, global,
			[]string{`name: invalid name "` + strings.Repeat("a", 254) + `": must be a lowercase RFC 1123 subdomain of at most 253 characters`}},
		{"name of 253", Resource{Type: "Zone", Name: strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)}, global, nil},
		{"mesh required", Resource{Type: "MeshTimeout", Name: "t", Spec: json.RawMessage(timeout)}, global, []string{"mesh: must be set"}},
		{"mesh forbidden", Resource{Type: "Zone", Mesh: "default", Name: "z"}, global, []string{"mesh: must not be set for type Zone"}},
		{"bad mesh", Resource{Type: "MeshTimeout", Mesh: "my.mesh", Name: "t", Spec: json.RawMessage(timeout)}, global,
			[]string{`mesh: invalid mesh name "my.mesh": must be a lowercase RFC 1123 label of at most 63 characters`}},
		{"labels", Resource{Type: "Mesh", Name: "m", Labels: NewLabels(map[string]string{
			"team": "payments", "kuma.io/zone": "zone-1", "example.com/a_b.c": "A-1_b.2", "empty": "",
			LabelDisplayName: strings.Repeat("n", 200),
		})}, global, nil},
		{"bad labels", Resource{Type: "Mesh", Name: "m", Labels: NewLabels(map[string]string{
			"kuma.io/": "x", "-team": "x", "Bad_Prefix/x": "x", "ok": strings.Repeat("v", 64), "sp": "a b",
			LabelOrigin: "mars", LabelPolicyRole: "owner",
		})}, global, []string{
			`labels["-team"]: key name must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with an alphanumeric`,
			`labels["Bad_Prefix/x"]: key prefix must be a lowercase RFC 1123 subdomain of at most 253 characters`,
			`labels["kuma.io/"]: key name must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with an alphanumeric`,
			`labels["kuma.io/origin"]: invalid value "mars": must be one of global, zone`,
			`labels["kuma.io/policy-role"]: invalid value "owner": must be one of system, producer, consumer, workload-owner`,
			`labels["ok"]: value must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with an alphanumeric`,
			`labels["sp"]: value must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with an alphanumeric`,
		}},
		{"system namespace everywhere", Resource{Type: "MeshTimeout", Mesh: "default", Name: "t", Namespace: "kuma-system", Spec: json.RawMessage(timeout)}, global, nil},
		{"namespace on the global", Resource{Type: "MeshTimeout", Mesh: "default", Name: "t", Namespace: "team-a", Spec: json.RawMessage(timeout)}, global,
			[]string{`namespace: namespace "team-a" is not allowed: only zones with the kubernetes environment have namespaces other than "kuma-system"`}},
		{"namespace in a universal zone", Resource{Type: "Dataplane", Mesh: "default", Name: "dp", Namespace: "team-a", Spec: json.RawMessage(dataplane)}, universal,
			[]string{`namespace: namespace "team-a" is not allowed: only zones with the kubernetes environment have namespaces other than "kuma-system"`}},
		{"other system namespace", Resource{Type: "Dataplane", Mesh: "default", Name: "dp", Namespace: "kuma-system", Spec: json.RawMessage(dataplane)},
			plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvUniversal, SystemNamespace: "mesh-system"},
			[]string{`namespace: namespace "kuma-system" is not allowed: only zones with the kubernetes environment have namespaces other than "mesh-system"`}},
		{"namespace in a kubernetes zone", Resource{Type: "Dataplane", Mesh: "default", Name: "dp", Namespace: "team-a", Spec: json.RawMessage(dataplane)}, k8s, nil},
		{"cluster-scoped types", Resource{Type: "Mesh", Name: "m", Namespace: "team-a"}, k8s,
			[]string{`namespace: Mesh must be in the system namespace "kuma-system"`}},
		{"gateway is cluster-scoped", Resource{Type: "MeshGateway", Mesh: "default", Name: "g", Namespace: "team-a",
			Spec: json.RawMessage(`{"selectors":[{"match":{"kuma.io/service":"g"}}],"conf":{"listeners":[{"port":80,"protocol":"HTTP"}]}}`)}, k8s,
			[]string{`namespace: MeshGateway must be in the system namespace "kuma-system"`}},
		{"bad namespace", Resource{Type: "Dataplane", Mesh: "default", Name: "dp", Namespace: "Team_A", Spec: json.RawMessage(dataplane)}, k8s,
			[]string{`namespace: invalid namespace "Team_A": must be a lowercase RFC 1123 label of at most 63 characters`}},
		{"every problem at once", Resource{Type: "MeshTimeout", Name: "T", Namespace: "x", Labels: NewLabels(map[string]string{"a": "-"}),
			Spec: json.RawMessage(`{"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"soon"}}]}`)}, global, []string{
			`name: invalid name "T": must be a lowercase RFC 1123 subdomain of at most 253 characters`,
			`labels["a"]: value must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with an alphanumeric`,
			"mesh: must be set",
			`namespace: namespace "x" is not allowed: only zones with the kubernetes environment have namespaces other than "kuma-system"`,
			`spec.to[0].default.idleTimeout: invalid duration "soon"`,
		}},
	}
	reg := NewDefaultRegistry()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := reg.Validate(&tc.r, tc.opts)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", describeErr(err))
				}
				return
			}
			if got := causes(t, err); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestValidateInfrastructureSpecs(t *testing.T) {
	runSpecCases(t, []specCase{
		{name: "mesh backends", typ: "Mesh", spec: `{"mtls":{"enabledBackend":"ca-2","backends":[{"name":"ca-1","type":"builtin","mode":"LAX"}]},"tracing":{"backends":[{"name":"z","sampling":150}]}}`,
			want: []string{`spec.mtls.backends[0].mode: invalid value "LAX": must be one of STRICT, PERMISSIVE`,
				`spec.mtls.enabledBackend: no backend named "ca-2"`,
				"spec.tracing.backends[0].sampling: must be between 0 and 100"}},
		{name: "mesh opaque blocks", typ: "Mesh", spec: `{"constraints":{"dataplaneProxy":{"requirements":[{"tags":{"a":"b"}}]}},"logging":{"backends":[{"name":"f","type":"file","conf":{"path":"/x"}}]}}`},
		{name: "zone", typ: "Zone", spec: `{"enabled":"yes"}`, want: []string{"spec.enabled: must be a boolean, got string"}},
		{name: "zone insight is opaque", typ: "ZoneInsight", spec: `{"anything":[1,2,3]}`},
		{name: "dataplane without inbound", typ: "Dataplane", spec: `{"networking":{"address":"10.0.0.1"}}`,
			want: []string{"spec.networking: must have at least one inbound, a listener or a gateway"}},
		{name: "dataplane gateway and inbound", typ: "Dataplane", spec: `{"networking":{"address":"10.0.0.1","gateway":{"tags":{"kuma.io/service":"g"}},"inbound":[{"port":1,"tags":{"kuma.io/service":"a"}}]}}`,
			want: []string{"spec.networking.inbound: must not be set together with gateway"}},
		{name: "dataplane outbounds", typ: "Dataplane", spec: `{"networking":{"address":"host.local","inbound":[{"port":1,"tags":{"kuma.io/service":"a"},"state":"Up"}],
			"outbound":[{"port":2},{"port":3,"service":"b"},{"port":4,"backendRef":{"kind":"MeshService"}}]}}`,
			want: []string{`spec.networking.inbound[0].state: invalid value "Up": must be one of Ready, NotReady, Ignored`,
				`spec.networking.outbound[0]: must name its service: tags["kuma.io/service"], service or backendRef`,
				"spec.networking.outbound[2].backendRef.name: must be set"}},
		{name: "dataplane needs networking", typ: "Dataplane", spec: `{}`, want: []string{"spec.networking: must be set"}},
		{name: "mesh service", typ: "MeshService", spec: `{"ports":[{"port":80,"targetPort":0},{"port":81,"targetPort":""}],"identities":[{"type":"Spiffe","value":"x"}],"state":"Up"}`,
			want: []string{"spec.identities[0].type: invalid value \"Spiffe\": must be one of ServiceTag, SpiffeID",
				"spec.ports[0].targetPort: must be between 1 and 65535",
				"spec.ports[1].targetPort: must not be empty",
				`spec.state: invalid value "Up": must be one of Available, Unavailable`}},
		{name: "mesh external service", typ: "MeshExternalService", spec: `{"match":{"port":443,"protocol":"https"},"endpoints":[{"address":"unix:///tmp/s"},{"address":"bad host!"}],"tls":{"version":{"min":"TLS9"}}}`,
			want: []string{`spec.endpoints[1].address: invalid address "bad host!": must be an IP address or a hostname`,
				`spec.match.protocol: invalid value "https": must be one of tcp, grpc, http, http2`,
				`spec.tls.version.min: invalid value "TLS9": must be one of TLSAuto, TLS10, TLS11, TLS12, TLS13`}},
		{name: "mesh external service match", typ: "MeshExternalService", spec: `{}`, want: []string{"spec.match: must be set"}},
		{name: "mesh gateway", typ: "MeshGateway", spec: `{"selectors":[{"match":{"app":"gw"}}],"conf":{"listeners":[{"port":80,"protocol":"UDP"}]}}`,
			want: []string{`spec.conf.listeners[0].protocol: invalid value "UDP": must be one of HTTP, HTTPS, TCP, TLS`,
				`spec.selectors[0].match: must contain the "kuma.io/service" tag`}},
	})
}

func TestValidateLegacySpecs(t *testing.T) {
	sd := `"sources":[{"match":{"kuma.io/service":"*"}}],"destinations":[{"match":{"kuma.io/service":"b"}}]`
	runSpecCases(t, []specCase{
		{name: "no conf", typ: "TrafficPermission", spec: `{` + sd + `}`},
		{name: "conf not allowed", typ: "TrafficPermission", spec: `{` + sd + `,"conf":{}}`, want: []string{"spec.conf: unknown field"}},
		{name: "selectors", typ: "TrafficPermission", spec: `{"sources":[],"destinations":[{"match":{}},{"match":{"version":"v1","x":""}}]}`,
			want: []string{"spec.sources: must have at least one item",
				"spec.destinations[0].match: must have at least one tag",
				`spec.destinations[0].match: must contain the "kuma.io/service" tag`,
				`spec.destinations[1].match: must contain the "kuma.io/service" tag`,
				"spec.destinations[1].match.x: must not be empty"}},
		{name: "sources required", typ: "TrafficLog", spec: `{"conf":{"backend":"x"}}`,
			want: []string{"spec.destinations: must be set", "spec.sources: must be set"}},
		{name: "selectors shape", typ: "TrafficTrace", spec: `{` + sd + `}`,
			want: []string{"spec.destinations: unknown field", "spec.selectors: must be set", "spec.sources: unknown field"}},
		{name: "traffic route", typ: "TrafficRoute", spec: `{` + sd + `,"conf":{"split":[{"weight":-1,"destination":{"kuma.io/service":"b"}}],"destination":{"kuma.io/service":"b"},"loadBalancer":{"random":{},"maglev":{}}}}`,
			want: []string{"spec.conf.loadBalancer: only one of random, maglev may be set",
				"spec.conf.split[0].weight: must be between 0 and 4294967295",
				"spec.conf: exactly one of split, destination must be set"}},
		{name: "timeout", typ: "Timeout", spec: `{` + sd + `,"conf":{"connectTimeout":"0s","http":{"idleTimeout":"forever"}}}`,
			want: []string{"spec.conf.connectTimeout: must be greater than 0", `spec.conf.http.idleTimeout: invalid duration "forever"`}},
		{name: "retry", typ: "Retry", spec: `{` + sd + `,"conf":{"http":{"retriableMethods":["FETCH"]},"grpc":{"retryOn":["Unavailable"]}}}`,
			want: []string{`spec.conf.grpc.retryOn[0]: invalid value "Unavailable": must be one of cancelled, deadline_exceeded, internal, resource_exhausted, unavailable`,
				`spec.conf.http.retriableMethods[0]: invalid value "FETCH": must be one of CONNECT, DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT, TRACE`}},
		{name: "health check", typ: "HealthCheck", spec: `{` + sd + `,"conf":{"interval":"10s"}}`,
			want: []string{"spec.conf.healthyThreshold: must be set", "spec.conf.timeout: must be set", "spec.conf.unhealthyThreshold: must be set"}},
		{name: "circuit breaker", typ: "CircuitBreaker", spec: `{` + sd + `,"conf":{"detectors":{"failure":{"threshold":101}},"thresholds":{"maxConnections":"2"}}}`,
			want: []string{"spec.conf.detectors.failure.threshold: must be between 0 and 100", "spec.conf.thresholds.maxConnections: must be an integer, got string"}},
		{name: "fault injection", typ: "FaultInjection", spec: `{` + sd + `,"conf":{"delay":{"value":"1s"}}}`,
			want: []string{"spec.conf.delay.percentage: must be set"}},
		{name: "rate limit", typ: "RateLimit", spec: `{` + sd + `,"conf":{"http":{"requests":0,"interval":"1s"}}}`,
			want: []string{"spec.conf.http.requests: must be between 1 and 4294967295"}},
		{name: "traffic log", typ: "TrafficLog", spec: `{` + sd + `,"conf":{"backend":5}}`,
			want: []string{"spec.conf.backend: must be a string, got number"}},
		{name: "traffic trace", typ: "TrafficTrace", spec: `{"selectors":[{"match":{"kuma.io/service":"*"}}],"conf":{"backends":["a"]}}`,
			want: []string{"spec.conf.backends: unknown field"}},
		{name: "proxy template", typ: "ProxyTemplate", spec: `{"selectors":[{"match":{"kuma.io/service":"*"}}],"conf":{"modifications":[{"cluster":{"operation":"upsert"}},{}],"resources":[{"name":"r"}]}}`,
			want: []string{`spec.conf.modifications[0].cluster.operation: invalid value "upsert": must be one of add, remove, patch, addFirst, addBefore, addAfter, addLast`,
				"spec.conf.modifications[1]: exactly one of cluster, listener, networkFilter, httpFilter, virtualHost must be set",
				"spec.conf.resources[0].resource: must be set", "spec.conf.resources[0].version: must be set"}},
	})
}

func TestNormalize(t *testing.T) {
	reg := NewDefaultRegistry()
	r := &Resource{Type: "MeshTimeout", Namespace: "mesh-system", Labels: LabelsOf(),
		Spec:   json.RawMessage("{ \"to\" : [ {\"default\":{\"b\":1, \"a\":\"<&>\"}} ] }"),
		Status: json.RawMessage(" null ")}
	reg.Normalize(r, "mesh-system")
	if r.Namespace != "" || r.Labels.Len() > 0 || r.Status != nil {
		t.Errorf("envelope not normalized: %+v", r)
	}
	if want := `{"to":[{"default":{"a":"<&>","b":1}}]}`; string(r.Spec) != want {
		t.Errorf("spec = %s, want %s", r.Spec, want)
	}
	other := &Resource{Namespace: "kuma-system", Spec: json.RawMessage(`{"a":`)}
	reg.Normalize(other, "mesh-system")
	if other.Namespace != "kuma-system" || string(other.Spec) != `{"a":` {
		t.Errorf("Normalize changed what it must keep: %+v", other)
	}
	def := &Resource{Namespace: "kuma-system"}
	reg.Normalize(def, plane.DefaultSystemNamespace)
	if def.Namespace != "" {
		t.Errorf("default system namespace not normalized: %q", def.Namespace)
	}
}

// TestResourceNames: Kubernetes' DNS-1123 subdomain rule, with no limit per
// dot-separated part (names of 47-63 characters plus a synced
// copy's 17-character hash suffix must stay valid).
func TestResourceNames(t *testing.T) {
	for name, want := range map[string]bool{
		"a":                      true,
		strings.Repeat("a", 100): true,
		strings.Repeat("a", 253): true,
		strings.Repeat("a", 254): false,
		strings.Repeat("a", 64) + ".b" + strings.Repeat("c", 80): true,
		"a.b-c.d": true,
		"a..b":    false,
		".a":      false,
		"a.":      false,
		"a-":      false,
		"-a":      false,
		"a.-b":    false,
		"A":       false,
		"a_b":     false,
	} {
		if got := isResourceName(name); got != want {
			t.Errorf("%.40q: %v, want %v", name, got, want)
		}
	}
}
