package xds

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestRenderingAfterAChangeReusesTheRest: a proxy calling three services
// is rendered, one service's MeshTimeout or endpoints change, and the
// proxy is rendered again from its previous rendering. The result is what a fresh
// rendering gives, and the parts the change does not reach are the
// previous rendering's own (not rendered again), for both kinds of proxy.
func TestRenderingAfterAChangeReusesTheRest(t *testing.T) {
	reg, p, decode := zoneDecoder(t)
	timeout := func(svc, d string) *resource.Resource {
		return decode(fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":"t-%s","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":%q},"default":{"connectionTimeout":%q,"http":{"requestTimeout":%q}}}]}}`, svc, svc, d, d))
	}
	rs := []*resource.Resource{
		decode(`{"type":"Dataplane","mesh":"default","name":"web-1","networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"web","kuma.io/protocol":"http"}}],"outbound":[{"port":10001,"tags":{"kuma.io/service":"a"}},{"port":10002,"tags":{"kuma.io/service":"b"}},{"port":10003,"tags":{"kuma.io/service":"c"}}]}}`),
		decode(`{"type":"MeshRetry","mesh":"default","name":"retry","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"grpc":{"numRetries":2},"http":{"numRetries":2}}}]}}`),
		timeout("a", "1s"), timeout("b", "2s"),
	}
	endpoints := map[string][]Endpoint{}
	for i, svc := range []string{"a", "b", "c"} {
		endpoints[svc] = []Endpoint{{Address: fmt.Sprintf("10.0.1.%d", i+1), Port: 9090, Zone: "zone-1", Healthy: true,
			Tags: map[string]string{"kuma.io/service": svc, "kuma.io/protocol": "http"}}}
	}
	snap, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: p.SystemNamespace, Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	next, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: p.SystemNamespace,
		Previous: snap, Changes: &policy.Changes{Put: []*resource.Resource{timeout("b", "5s")}}})
	if err != nil {
		t.Fatal(err)
	}
	// The change of endpoints: b gains an instance in another zone.
	moreEndpoints := maps.Clone(endpoints)
	moreEndpoints["b"] = append(slices.Clip(endpoints["b"]), Endpoint{Address: "10.0.2.1", Port: 9090, Zone: "zone-2", Healthy: true,
		Tags: map[string]string{"kuma.io/service": "b", "kuma.io/protocol": "http"}})
	type state struct {
		snap      *policy.MeshSnapshot
		endpoints map[string][]Endpoint
	}
	assignments := map[*Endpoint]*LoadAssignments{}
	input := func(s state, prev *Resources) Input {
		dp, err := ParseDataplane(s.snap.Dataplane("web-1", ""), "")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := s.snap.Config("web-1", "")
		if err != nil {
			t.Fatal(err)
		}
		// Shared assignments, one per endpoints map, as the controller
		// keeps them.
		a := assignments[&s.endpoints["b"][0]]
		if a == nil {
			a = NewLoadAssignments(s.endpoints, "zone-1")
			assignments[&s.endpoints["b"][0]] = a
		}
		return Input{Dataplane: dp, Zone: "zone-1", Config: cfg, Endpoints: s.endpoints, MTLS: true, LoadAssignments: a, Previous: prev}
	}
	before := state{snap, endpoints}
	for _, tc := range []struct {
		name   string
		after  state
		render func(Input) (*Resources, error)
		// unchanged and changed are resources the change does not and
		// does reach.
		unchanged, changed []typedName
	}{
		{"policy/" + ProxyGRPC, state{next, endpoints}, Generate,
			[]typedName{{resourcev3.ListenerType, "a"}, {resourcev3.RouteType, "c"}, {resourcev3.ClusterType, "a"}},
			[]typedName{{resourcev3.RouteType, "b"}}},
		{"policy/" + ProxyEnvoy, state{next, endpoints}, GenerateEnvoy,
			[]typedName{{resourcev3.ListenerType, "outbound:127.0.0.1:10001"}, {resourcev3.ClusterType, "c"}},
			[]typedName{{resourcev3.ListenerType, "outbound:127.0.0.1:10002"}, {resourcev3.ClusterType, "b"}}},
		// Endpoints are no part of a fragment: only the assignment of
		// the service whose endpoints changed is new.
		{"endpoints/" + ProxyGRPC, state{snap, moreEndpoints}, Generate,
			[]typedName{{resourcev3.ListenerType, "b"}, {resourcev3.RouteType, "b"}, {resourcev3.ClusterType, "b"}},
			[]typedName{{resourcev3.EndpointType, "b"}}},
		{"endpoints/" + ProxyEnvoy, state{snap, moreEndpoints}, GenerateEnvoy,
			[]typedName{{resourcev3.ListenerType, "outbound:127.0.0.1:10002"}, {resourcev3.ClusterType, "b"}},
			[]typedName{{resourcev3.EndpointType, "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := tc.render(input(before, nil))
			if err != nil {
				t.Fatal(err)
			}
			if err := digestAll(first); err != nil {
				t.Fatal(err)
			}
			reused, err := tc.render(input(tc.after, first))
			if err != nil {
				t.Fatal(err)
			}
			fresh, err := tc.render(input(tc.after, nil))
			if err != nil {
				t.Fatal(err)
			}
			if a, b := goldenOf(t, fresh), goldenOf(t, reused); string(a) != string(b) {
				t.Fatalf("rendered from the previous rendering, it differs from a fresh one:\n%s", firstDifference(string(a), string(b)))
			}
			vf, _ := Versions(fresh)
			vr, _ := Versions(reused)
			if !maps.Equal(vf, vr) {
				t.Fatalf("versions: fresh %v, reused %v", vf, vr)
			}
			// A previous rendering whose resources are not where its
			// fragments say (its lists reordered, as a patch may) is
			// rendered again where they moved, and still right.
			moved := *first
			moved.Listeners = slices.Clone(first.Listeners)
			slices.Reverse(moved.Listeners)
			moved.Clusters = slices.Clone(first.Clusters)
			slices.Reverse(moved.Clusters)
			fromMoved, err := tc.render(input(tc.after, &moved))
			if err != nil {
				t.Fatal(err)
			}
			if a, b := goldenOf(t, fresh), goldenOf(t, fromMoved); string(a) != string(b) {
				t.Fatalf("rendered from a reordered rendering, it differs from a fresh one:\n%s", firstDifference(string(a), string(b)))
			}
			if vm, _ := Versions(fromMoved); !maps.Equal(vf, vm) {
				t.Fatalf("versions: fresh %v, from a reordered rendering %v", vf, vm)
			}
			for _, r := range tc.unchanged {
				if find(first, r) == nil || find(first, r) != find(reused, r) {
					t.Errorf("%s %s was rendered again", r.typeURL, r.name)
				}
			}
			for _, r := range tc.changed {
				if find(first, r) == find(reused, r) {
					t.Errorf("%s %s was not rendered again", r.typeURL, r.name)
				}
			}
		})
	}
}

// TestRenderingFromAnotherLineage: a mesh's snapshot built again from
// every resource (the view reloads a mesh after a lost watch or a
// replaced store) numbers its engine results afresh. A proxy rendered
// from such a snapshot, its previous rendering made from the one before,
// gets what a fresh rendering gives: a part is never taken from the
// previous rendering because two lineages gave its results equal ids.
func TestRenderingFromAnotherLineage(t *testing.T) {
	reg, p, decode := zoneDecoder(t)
	dp := decode(`{"type":"Dataplane","mesh":"default","name":"web-1","networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"web","kuma.io/protocol":"http"}}],"outbound":[{"port":10001,"tags":{"kuma.io/service":"a"}}]}}`)
	endpoints := map[string][]Endpoint{"a": {{Address: "10.0.1.1", Port: 9090, Zone: "zone-1", Healthy: true,
		Tags: map[string]string{"kuma.io/service": "a", "kuma.io/protocol": "http"}}}}
	render := func(kind func(Input) (*Resources, error), timeout string, prev *Resources) *Resources {
		t.Helper()
		mt := decode(fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":"t","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"a"},"default":{"connectionTimeout":%q,"http":{"requestTimeout":%q}}}]}}`, timeout, timeout))
		snap, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: p.SystemNamespace,
			Resources: []*resource.Resource{dp, mt}})
		if err != nil {
			t.Fatal(err)
		}
		d, err := ParseDataplane(snap.Dataplane("web-1", ""), "")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := snap.Config("web-1", "")
		if err != nil {
			t.Fatal(err)
		}
		res, err := kind(Input{Dataplane: d, Zone: "zone-1", Config: cfg, Endpoints: endpoints, MTLS: true, Previous: prev})
		if err != nil {
			t.Fatal(err)
		}
		if err := digestAll(res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	for name, kind := range map[string]func(Input) (*Resources, error){ProxyGRPC: Generate, ProxyEnvoy: GenerateEnvoy} {
		t.Run(name, func(t *testing.T) {
			first := render(kind, "1s", nil)
			again, fresh := render(kind, "5s", first), render(kind, "5s", nil)
			if a, b := goldenOf(t, fresh), goldenOf(t, again); string(a) != string(b) {
				t.Fatalf("rendered from a rendering of another lineage, it differs from a fresh one:\n%s", firstDifference(string(a), string(b)))
			}
		})
	}
}

// TestRenderingAgainMatchesFresh is fragment reuse against its reference,
// a fresh rendering: in every golden case, policies leave and come back
// in a random order, each change building the snapshot from the last one
// (or, one time in four, from every resource, as a reloaded mesh is),
// services' instances changing protocol meanwhile, and the proxy rendered
// from its previous rendering gets what a fresh rendering gives
// (resources, versions, the policies behind them, what was left out), for
// both kinds of proxy. Each case has its own seed, the same every run.
func TestRenderingAgainMatchesFresh(t *testing.T) {
	dirs, err := filepath.Glob("testdata/*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	kinds := map[string]func(Input) (*Resources, error){ProxyGRPC: Generate, ProxyEnvoy: GenerateEnvoy}
	for _, dir := range dirs {
		for kind, render := range kinds {
			t.Run(filepath.Base(dir)+"/"+kind, func(t *testing.T) {
				gc, all := loadResources(t, filepath.Join(dir, "input.yaml"))
				var policies, dataplanes []*resource.Resource
				for _, r := range all.Resources {
					if r.Type == "Dataplane" {
						dataplanes = append(dataplanes, r)
					} else {
						policies = append(policies, r)
					}
				}
				endpoints := gc.endpoints()
				assignments := NewLoadAssignments(endpoints, gc.Zone)
				input := func(snap *policy.MeshSnapshot, prev *Resources) Input {
					dp, err := ParseDataplane(snap.Dataplane(gc.Dataplane.Name, ""), "")
					if err != nil {
						t.Fatal(err)
					}
					cfg, err := snap.Config(gc.Dataplane.Name, "")
					if err != nil {
						t.Fatal(err)
					}
					return Input{Dataplane: dp, Zone: gc.Zone, Config: cfg, MTLS: gc.MTLS, Endpoints: endpoints, LoadAssignments: assignments,
						Faults: NewFaults(snap), AccessLogPipe: gc.AccessLogPipe, OTelBackends: otelBackendsOf(snap), Previous: prev}
				}
				rendered := func(in Input) *Resources {
					res, err := render(in)
					if err != nil {
						t.Fatal(err)
					}
					if err := digestAll(res); err != nil {
						t.Fatal(err)
					}
					return res
				}
				snap, err := policy.NewMeshSnapshot(all)
				if err != nil {
					t.Fatal(err)
				}
				last := rendered(input(snap, nil))
				lastVersions, _ := Versions(last)
				present := make([]bool, len(policies))
				for i := range present {
					present[i] = true
				}
				seed := fnv.New64a()
				seed.Write([]byte(dir + "/" + kind))
				rng := rand.New(rand.NewPCG(seed.Sum64(), 1))
				services := slices.Sorted(maps.Keys(endpoints))
				for step := range 4 * len(policies) {
					if rng.IntN(4) == 0 && len(services) > 0 {
						// A service's instances change protocol (new
						// endpoints, new shared assignments, as the zone's).
						svc := services[rng.IntN(len(services))]
						endpoints = maps.Clone(endpoints)
						eps := slices.Clone(endpoints[svc])
						for j := range eps {
							tags := maps.Clone(eps[j].Tags)
							if tags == nil {
								tags = map[string]string{}
							}
							eps[j].Tags = tags
							eps[j].Tags["kuma.io/protocol"] = map[bool]string{true: "tcp", false: "http"}[eps[j].Tags["kuma.io/protocol"] == "http"]
						}
						endpoints[svc] = eps
						assignments = NewLoadAssignments(endpoints, gc.Zone)
					}
					i := rng.IntN(len(policies))
					changes := &policy.Changes{}
					if present[i] {
						changes.Deleted = []resource.Key{policies[i].Key()}
					} else {
						changes.Put = []*resource.Resource{policies[i]}
					}
					present[i] = !present[i]
					all.Previous, all.Changes, all.Resources = snap, changes, nil
					if rng.IntN(4) == 0 {
						// Built again from every resource, as a reloaded
						// mesh is: a new lineage of results.
						all.Previous, all.Changes, all.Resources = nil, nil, dataplanes
						for j, p := range policies {
							if present[j] {
								all.Resources = append(all.Resources, p)
							}
						}
					}
					if snap, err = policy.NewMeshSnapshot(all); err != nil {
						t.Fatal(err)
					}
					again, fresh := rendered(input(snap, last)), rendered(input(snap, nil))
					if a, b := goldenOf(t, fresh), goldenOf(t, again); string(a) != string(b) {
						t.Fatalf("step %d (%s %s): rendered from the previous rendering, it differs from a fresh one:\n%s",
							step, map[bool]string{true: "back:", false: "gone:"}[present[i]], policies[i].Key(), firstDifference(string(a), string(b)))
					}
					// As the server versions it: a list of the very
					// resources of the last rendering keeps its version.
					vf, _ := Versions(fresh)
					va, _ := VersionsAfter(again, last, lastVersions)
					if !maps.Equal(vf, va) {
						t.Fatalf("step %d: versions: fresh %v, from the previous rendering %v", step, vf, va)
					}
					last, lastVersions = again, va
				}
			})
		}
	}
}

// zoneDecoder is a registry, a Universal zone-1 plane and a decoder of
// resources as that zone admits them (normalized and validated).
func zoneDecoder(t *testing.T) (*resource.Registry, plane.Plane, func(doc string) *resource.Resource) {
	t.Helper()
	reg := resource.NewDefaultRegistry()
	p, err := plane.NewZone("zone-1", plane.EnvUniversal, "", false)
	if err != nil {
		t.Fatal(err)
	}
	return reg, p, func(doc string) *resource.Resource {
		t.Helper()
		r, err := reg.Decode([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		reg.Normalize(r, p.SystemNamespace)
		if err := reg.Validate(r, p); err != nil {
			t.Fatal(err)
		}
		return r
	}
}

// typedName names a resource by type URL and name.
type typedName struct{ typeURL, name string }

func find(res *Resources, r typedName) types.Resource {
	for _, x := range res.ByType()[r.typeURL] {
		if cachev3.GetResourceName(x) == r.name {
			return x
		}
	}
	return nil
}

// TestTagKeyTellsSetsApart: two tag sets share a key exactly when they are
// equal, over every set of up to two pairs drawn from strings that embed
// the encoding's separator and digits.
func TestTagKeyTellsSetsApart(t *testing.T) {
	words := []string{"", "a", ":", "1", "1:a", "a:1", "b"}
	var sets []map[string]string
	sets = append(sets, nil, map[string]string{})
	for _, k1 := range words {
		for _, v1 := range words {
			sets = append(sets, map[string]string{k1: v1})
			for _, k2 := range words {
				for _, v2 := range words {
					if k2 != k1 {
						sets = append(sets, map[string]string{k1: v1, k2: v2})
					}
				}
			}
		}
	}
	byKey := map[string]map[string]string{}
	for _, s := range sets {
		k := tagKey(s)
		if other, ok := byKey[k]; ok && !maps.Equal(other, s) {
			t.Fatalf("%v and %v share the key %q", other, s, k)
		}
		byKey[k] = s
	}
}
