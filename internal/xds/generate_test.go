package xds

import (
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"cel.dev/cel-go/cel"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"sigs.k8s.io/yaml"

	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// genCase is a golden input: a mesh's resources, the proxy, its zone and
// the endpoints it sees.
type genCase struct {
	Description string                `json:"description"`
	Zone        string                `json:"zone"`
	MTLS        bool                  `json:"mtls"`
	Dataplane   struct{ Name string } `json:"dataplane"`
	Endpoints   map[string][]struct {
		Address string            `json:"address"`
		Port    int               `json:"port"`
		Zone    string            `json:"zone"`
		Healthy bool              `json:"healthy"`
		Tags    map[string]string `json:"tags"`
	} `json:"endpoints"`
	Resources []json.RawMessage `json:"resources"`
	// AccessLogPipe is the agent's access log pipe (node metadata).
	AccessLogPipe string `json:"accessLogPipe"`
}

// genGolden is what a case renders: the config dump, the policies behind
// each resource and what was left out.
type genGolden struct {
	ConfigDump json.RawMessage                `json:"configDump"`
	Policies   map[string]map[string][]string `json:"policies,omitempty"`
	Dropped    []string                       `json:"dropped,omitempty"`
	Programmed map[string]*Touch              `json:"programmed,omitempty"`
}

// TestGenerateGolden renders every case for both kinds of proxy: a
// proxyless gRPC workload (grpc.json) and an Envoy sidecar (envoy.json).
func TestGenerateGolden(t *testing.T) {
	dirs, err := filepath.Glob("testdata/*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	kinds := []struct {
		file   string
		render func(Input) (*Resources, error)
	}{{"grpc.json", Generate}, {"envoy.json", GenerateEnvoy}}
	for _, dir := range dirs {
		for _, kind := range kinds {
			t.Run(filepath.Base(dir)+"/"+kind.file, func(t *testing.T) {
				in := loadGenCase(t, filepath.Join(dir, "input.yaml"))
				res, err := kind.render(in)
				if err != nil {
					t.Fatal(err)
				}
				validateAll(t, res)
				parseCEL(t, goldenOf(t, res))
				// Rendered again with load assignments shared between
				// proxies: the same resources and versions.
				shared := in
				shared.LoadAssignments = NewLoadAssignments(in.Endpoints, in.Zone)
				again, err := kind.render(shared)
				if err != nil {
					t.Fatal(err)
				}
				if a, b := goldenOf(t, res), goldenOf(t, again); string(a) != string(b) {
					t.Fatal("two renderings of the same input differ")
				}
				// Another proxy rendered with the same load assignments
				// shares each called service's upstream TLS socket (but
				// where a MeshProxyPatch made copies).
				other, err := kind.render(shared)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range again.Clusters {
					if patched(again) {
						break
					}
					want := r.(*clusterv3.Cluster).GetTransportSocket()
					if got := other.Clusters[i].(*clusterv3.Cluster).GetTransportSocket(); want != nil && got != want {
						t.Errorf("cluster %s: its TLS socket is not shared", cachev3.GetResourceName(r))
					}
				}
				// And a gRPC server's.
				for i, r := range again.Listeners {
					if kind.file != "grpc.json" {
						break
					}
					for j, c := range r.(*listenerv3.Listener).GetFilterChains() {
						got := other.Listeners[i].(*listenerv3.Listener).GetFilterChains()[j].GetTransportSocket()
						if c.GetTransportSocket() != nil && got != c.GetTransportSocket() {
							t.Errorf("listener %s: its TLS socket is not shared", cachev3.GetResourceName(r))
						}
					}
				}
				va, _ := Versions(res)
				vb, _ := Versions(again)
				if !maps.Equal(va, vb) {
					t.Fatalf("versions %v, with shared assignments %v", va, vb)
				}
				// Rendered again from the same input with the first
				// rendering as the previous one: every part is reused, and
				// the result is the same.
				if err := digestAll(again); err != nil {
					t.Fatal(err)
				}
				reused := shared
				reused.Previous = again
				third, err := kind.render(reused)
				if err != nil {
					t.Fatal(err)
				}
				if third.fragments != nil && len(again.fragments.list) > 0 && third.reused == 0 {
					t.Error("nothing of the previous rendering was reused")
				}
				if a, b := goldenOf(t, res), goldenOf(t, third); string(a) != string(b) {
					t.Fatalf("rendered again from the previous rendering, it differs:\n%s", firstDifference(string(a), string(b)))
				}
				if vc, _ := Versions(third); !maps.Equal(va, vc) {
					t.Fatalf("versions %v, reused %v", va, vc)
				}
				compareFile(t, filepath.Join(dir, kind.file), goldenOf(t, res))
			})
		}
	}
}

// patched says a MeshProxyPatch shaped res.
func patched(res *Resources) bool {
	for ref := range res.Touched {
		if ref.Type == "MeshProxyPatch" {
			return true
		}
	}
	return false
}

func loadGenCase(t *testing.T, path string) Input {
	t.Helper()
	snap, gc := loadSnapshot(t, path)
	dpRes := snap.Dataplane(gc.Dataplane.Name, "")
	if dpRes == nil {
		t.Fatalf("no Dataplane %s", gc.Dataplane.Name)
	}
	dp, err := ParseDataplane(dpRes, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := snap.Config(gc.Dataplane.Name, "")
	if err != nil {
		t.Fatal(err)
	}
	return Input{Dataplane: dp, Zone: gc.Zone, Config: cfg, MTLS: gc.MTLS, Endpoints: gc.endpoints(), Faults: NewFaults(snap),
		AccessLogPipe: gc.AccessLogPipe, OTelBackends: otelBackendsOf(snap)}
}

func (gc *genCase) endpoints() map[string][]Endpoint {
	out := map[string][]Endpoint{}
	for svc, eps := range gc.Endpoints {
		for _, ep := range eps {
			out[svc] = append(out[svc], Endpoint{Address: ep.Address, Port: ep.Port, Zone: ep.Zone, Healthy: ep.Healthy, Tags: ep.Tags})
		}
	}
	return out
}

// loadSnapshot reads a golden input and builds its mesh's policy snapshot.
func loadSnapshot(t *testing.T, path string) (*policy.MeshSnapshot, *genCase) {
	t.Helper()
	gc, in := loadResources(t, path)
	snap, err := policy.NewMeshSnapshot(in)
	if err != nil {
		t.Fatal(err)
	}
	return snap, gc
}

// loadResources reads a case and its resources, as the inputs of a
// snapshot built from them all.
func loadResources(t *testing.T, path string) (*genCase, policy.Inputs) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var gc genCase
	if err := yaml.UnmarshalStrict(data, &gc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	reg := resource.NewDefaultRegistry()
	p, err := plane.NewZone(gc.Zone, plane.EnvUniversal, "", false)
	if err != nil {
		t.Fatal(err)
	}
	var resources []*resource.Resource
	for i, doc := range gc.Resources {
		r, err := reg.Decode(doc)
		if err != nil {
			t.Fatalf("resources[%d]: %v", i, err)
		}
		reg.Normalize(r, p.SystemNamespace)
		if err := reg.Validate(r, p); err != nil {
			var verr *resource.ValidationError
			if errors.As(err, &verr) {
				t.Fatalf("resources[%d] %s: %+v", i, r.Key(), verr.Causes)
			}
			t.Fatalf("resources[%d]: %v", i, err)
		}
		resources = append(resources, r)
	}
	return &gc, policy.Inputs{Registry: reg, Mesh: "default", Zone: gc.Zone, SystemNamespace: p.SystemNamespace, Resources: resources}
}

// validateAll checks every resource against Envoy's proto constraints
// (protoc-gen-validate): what Envoy would refuse is never sent.
func validateAll(t *testing.T, res *Resources) {
	t.Helper()
	for typeURL, items := range res.ByType() {
		for _, r := range items {
			v, ok := r.(interface{ ValidateAll() error })
			if !ok {
				t.Fatalf("%s has no validation", typeURL)
			}
			if err := v.ValidateAll(); err != nil {
				t.Errorf("%s %s: %v", typeURL, cachev3.GetResourceName(r), err)
			}
		}
	}
}

// parseCEL parses every CEL expression of a rendering (access log
// filters) with cel-go: Envoy's CEL would refuse one that does not parse.
func parseCEL(t *testing.T, golden []byte) {
	t.Helper()
	var doc any
	if err := json.Unmarshal(golden, &doc); err != nil {
		t.Fatal(err)
	}
	env, err := cel.NewEnv()
	if err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if x["@type"] == "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter" {
				expr, _ := x["expression"].(string)
				if _, iss := env.Parse(expr); iss.Err() != nil {
					t.Errorf("CEL expression %q: %v", expr, iss.Err())
				}
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
}

func goldenOf(t *testing.T, res *Resources) []byte {
	t.Helper()
	dump, err := ConfigDump(res, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := MarshalJSON(dump)
	if err != nil {
		t.Fatal(err)
	}
	programmed := map[string]*Touch{}
	for ref, t := range res.Touched {
		programmed[ref.String()] = t
	}
	out, err := json.MarshalIndent(genGolden{ConfigDump: raw, Policies: res.Shaped(), Dropped: res.Dropped, Programmed: programmed}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

func compareFile(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != string(got) {
		t.Errorf("%s differs (run with -update after checking the change):\n%s", path, got)
	}
}

// TestParseDataplaneOutbounds: the services a proxy declares it calls are
// its outbounds' and its reachableServices, each once, sorted.
func TestParseDataplaneOutbounds(t *testing.T) {
	tests := []struct {
		name string
		spec string
		want []string
	}{
		{"none: every service", `{"networking":{"address":"10.0.0.1"}}`, nil},
		{"outbounds by tag, service and backendRef",
			`{"networking":{"address":"10.0.0.1","outbound":[{"port":1,"tags":{"kuma.io/service":"a"}},{"port":2,"service":"b"},{"port":3,"backendRef":{"kind":"MeshService","name":"c"}}]}}`,
			[]string{"a", "b", "c"}},
		{"reachableServices", `{"networking":{"address":"10.0.0.1","transparentProxying":{"reachableServices":["b","a","b"]}}}`, []string{"a", "b"}},
		{"both, each once",
			`{"networking":{"address":"10.0.0.1","outbound":[{"port":1,"tags":{"kuma.io/service":"a"}}],"transparentProxying":{"reachableServices":["a","c"]}}}`,
			[]string{"a", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dp, err := ParseDataplane(&resource.Resource{Type: "Dataplane", Mesh: "default", Name: "web-1", Spec: json.RawMessage(tt.spec)}, "")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(dp.Outbounds, tt.want) {
				t.Fatalf("outbounds %v, want %v", dp.Outbounds, tt.want)
			}
		})
	}
}

// FuzzParseDataplane: any stored spec parses or fails with an error, and
// what parses renders for both kinds of proxy without failing.
func FuzzParseDataplane(f *testing.F) {
	f.Add(`{"networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"web","kuma.io/protocol":"http"}}],"outbound":[{"port":1,"tags":{"kuma.io/service":"a"}}],"transparentProxying":{"reachableServices":["b"]}}}`)
	f.Add(`{"networking":{"inbound":[{"port":-1,"state":"NotReady","health":{"ready":false}}]}}`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, spec string) {
		dp, err := ParseDataplane(&resource.Resource{Type: "Dataplane", Mesh: "default", Name: "web-1", Spec: json.RawMessage(spec)}, "")
		if err != nil {
			return
		}
		in := Input{Dataplane: dp, Zone: "zone-1", Config: &policy.ConfigResult{}, Endpoints: map[string][]Endpoint{}}
		for _, render := range []func(Input) (*Resources, error){Generate, GenerateEnvoy} {
			if _, err := render(in); err != nil {
				t.Fatalf("%s: %v", spec, err)
			}
		}
	})
}

// firstDifference shows where two texts part.
func firstDifference(a, b string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			lo := max(0, i-200)
			return "want …" + a[lo:min(len(a), i+200)] + "\ngot  …" + b[lo:min(len(b), i+200)]
		}
	}
	return "one is a prefix of the other"
}
