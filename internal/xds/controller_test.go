package xds

import (
	"context"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// sources are test inputs the controller renders from, changed by hand.
type sources struct {
	mu        sync.Mutex
	snap      *policy.MeshSnapshot
	endpoints map[string][]Endpoint
	mtls      bool
	next      chan struct{}
}

func (s *sources) change(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
	close(s.next)
	s.next = make(chan struct{})
}

func (s *sources) Sources() Sources {
	changed := func() <-chan struct{} {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.next
	}
	return Sources{
		Snapshot: func(context.Context, string) (*policy.MeshSnapshot, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.snap, nil
		},
		Changed: changed,
		Endpoints: func(string) map[string][]Endpoint {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.endpoints
		},
		EndpointsChanged: changed,
		MTLS: func(string) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.mtls
		},
		MTLSChanged: changed,
	}
}

// freshRendering is what Dataplane name of mesh default gets as kind from
// the controller's current inputs, rendered whole, and its versions.
func freshRendering(t *testing.T, ctrl *Controller, kind, name string) (*Resources, map[string]string) {
	t.Helper()
	fresh, err := ctrl.Inspect(context.Background(), kind, "default", name, "")
	if err != nil {
		t.Fatal(err)
	}
	versions, err := Versions(fresh)
	if err != nil {
		t.Fatal(err)
	}
	return fresh, versions
}

// generations number the test's snapshots as a view does (1 first, one
// more per change) and say which resource each change wrote, so that the
// controller can tell the proxies a change touches (SnapshotGen,
// ChangedSince).
type generations struct {
	mu  sync.Mutex
	log []resource.Key // log[i] made generation i+2
}

// add records a change of key: the next generation.
func (g *generations) add(key resource.Key) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.log = append(g.log, key)
}

// sources are src's sources with generations.
func (g *generations) sources(src *sources) Sources {
	s := src.Sources()
	s.SnapshotGen = func(ctx context.Context, mesh string) (*policy.MeshSnapshot, uint64, error) {
		snap, err := s.Snapshot(ctx, mesh)
		g.mu.Lock()
		defer g.mu.Unlock()
		return snap, uint64(len(g.log)) + 1, err
	}
	s.ChangedSince = func(_ string, from, to uint64) ([]resource.Key, bool) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if from < 1 || to > uint64(len(g.log))+1 {
			return nil, false
		}
		return append([]resource.Key(nil), g.log[from-1:to-1]...), true
	}
	return s
}

// TestControllerPushesChanges: a proxy that connects gets its resources at
// once; an endpoint change reaches it as a new version of the endpoints
// alone.
func TestControllerPushesChanges(t *testing.T) {
	srv, client := testServer(t)
	snap, gc := loadSnapshot(t, "testdata/grpc-mtls/input.yaml")
	src := &sources{snap: snap, endpoints: gc.endpoints(), mtls: true, next: make(chan struct{})}
	ctrl, err := NewController(ControllerConfig{Server: srv, Sources: src.Sources(), Zone: "zone-1"})
	if err != nil {
		t.Fatal(err)
	}
	srv.OnConnect(func(string) { ctrl.Kick() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ctrl.Run(ctx)

	st := openStream(t, client, "default.web-1")
	node := &corev3.Node{Id: "default.web-1"}
	ask := func(typeURL string, names ...string) *discoveryv3.DiscoveryResponse {
		t.Helper()
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
		r, err := recv(t, st, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	l := ask(resourcev3.ListenerType, "backend")
	if len(l.GetResources()) != 1 {
		t.Fatalf("listener backend: %v", l)
	}
	e := ask(resourcev3.EndpointType, "backend")
	if len(e.GetResources()) != 1 {
		t.Fatalf("endpoints of backend: %v", e)
	}
	// ACK the endpoints, then change them.
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"backend"},
		VersionInfo: e.GetVersionInfo(), ResponseNonce: e.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	src.change(func() {
		eps := gc.endpoints()
		eps["backend"] = append(eps["backend"], Endpoint{Address: "10.0.0.4", Port: 9090, Zone: "zone-1", Healthy: true})
		src.endpoints = eps
	})
	r, err := recv(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.GetTypeUrl() != resourcev3.EndpointType || r.GetVersionInfo() == e.GetVersionInfo() {
		t.Fatalf("after an endpoint change: %s %s", r.GetTypeUrl(), r.GetVersionInfo())
	}
	t.Logf("endpoint change pushed in %v", time.Since(start))
	// The listener did not change: nothing else is sent.
	if r, err := recv(t, st, 200*time.Millisecond); err == nil {
		t.Fatalf("unexpected push of %s", r.GetTypeUrl())
	}
}

// TestControllerProgrammed: a connected proxy's rendering gives the
// policies that shaped it a Programmed condition, gone when it leaves.
func TestControllerProgrammed(t *testing.T) {
	srv, client := testServer(t)
	snap, gc := loadSnapshot(t, "testdata/grpc-policies/input.yaml")
	src := &sources{snap: snap, endpoints: gc.endpoints(), next: make(chan struct{})}
	ctrl, err := NewController(ControllerConfig{Server: srv, Sources: src.Sources(), Zone: "zone-1"})
	if err != nil {
		t.Fatal(err)
	}
	srv.OnConnect(func(string) { ctrl.Kick() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ctrl.Run(ctx)
	if _, ok := ctrl.Programmed(snap, "default", "MeshTimeout", "backend-timeout", ""); ok {
		t.Fatal("a Programmed condition with no proxy connected")
	}
	st := openStream(t, client, "default.web-1")
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "default.web-1"}, TypeUrl: resourcev3.ListenerType}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		c, _ := ctrl.Programmed(snap, "default", "MeshTimeout", "backend-timeout", "")
		return c.Reason == ReasonPartially
	})
	c, _ := ctrl.Programmed(snap, "default", "MeshTimeout", "backend-timeout", "")
	if c.Status != "False" || c.Reason != ReasonPartially || !strings.Contains(c.Message, "web-1: MeshTimeout idleTimeout") {
		t.Errorf("MeshTimeout backend-timeout: %+v", c)
	}
	if c, ok := ctrl.Programmed(snap, "other", "MeshTimeout", "backend-timeout", ""); ok {
		t.Errorf("a policy of another mesh: %+v", c)
	}
}

// TestControllerSkipsUntouchedProxies: after a change, only the proxies
// the change may touch are rendered again.
func TestControllerSkipsUntouchedProxies(t *testing.T) {
	srv, client := testServer(t)
	reg := resource.NewDefaultRegistry()
	decode := func(doc string) *resource.Resource {
		t.Helper()
		r, err := reg.Decode([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		reg.Normalize(r, "kuma-system")
		return r
	}
	dp := func(name, svc string, port ...int) string {
		p := 8080
		if len(port) > 0 {
			p = port[0]
		}
		return `{"type":"Dataplane","mesh":"default","name":"` + name + `","networking":{"address":"10.0.0.1","inbound":[{"port":` + strconv.Itoa(p) + `,"tags":{"kuma.io/service":"` + svc + `"}}],"outbound":[{"port":9000,"tags":{"kuma.io/service":"db"}}]}}`
	}
	timeout := func(name, target, d string) string {
		return `{"type":"MeshTimeout","mesh":"default","name":"` + name + `","spec":{"targetRef":` + target + `,"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"requestTimeout":"` + d + `"}}}]}}`
	}
	snap, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: "kuma-system",
		Resources: []*resource.Resource{decode(dp("web-1", "web")), decode(dp("api-1", "api")),
			decode(timeout("web-only", `{"kind":"MeshService","name":"web"}`, "1s"))}})
	if err != nil {
		t.Fatal(err)
	}
	src := &sources{snap: snap, endpoints: map[string][]Endpoint{"db": {{Address: "10.0.0.9", Port: 9000, Zone: "zone-1", Healthy: true}}}, next: make(chan struct{})}
	var changes generations
	ctrl, err := NewController(ControllerConfig{Server: srv, Sources: changes.sources(src), Zone: "zone-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Driven by hand, one pass at a time.
	for _, node := range []string{"default.web-1", "default.api-1"} {
		st := openStream(t, client, node)
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resourcev3.ListenerType}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return len(srv.Connected()) == 2 })
	ctx := context.Background()
	ctrl.renderAll(ctx)
	if ctrl.renders != 2 {
		t.Fatalf("%d renderings of two new proxies", ctrl.renders)
	}
	change := func(r *resource.Resource) {
		t.Helper()
		next, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: "kuma-system",
			Previous: src.snap, Changes: &policy.Changes{Put: []*resource.Resource{r}}})
		if err != nil {
			t.Fatal(err)
		}
		changes.add(r.Key())
		src.change(func() { src.snap = next })
	}
	db := func(protocol string, addrs ...string) []Endpoint {
		var out []Endpoint
		for _, a := range addrs {
			ep := Endpoint{Address: a, Port: 9000, Zone: "zone-1", Healthy: true}
			if protocol != "" {
				ep.Tags = map[string]string{"kuma.io/protocol": protocol}
			}
			out = append(out, ep)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		// res is a resource written, or endpoints the new endpoints.
		res       string
		endpoints map[string][]Endpoint
		// render proxies are rendered, reassign given new endpoints
		// alone.
		render, reassign int
	}{
		{name: "a policy of web's touches web-1 alone", res: timeout("web-only", `{"kind":"MeshService","name":"web"}`, "2s"), render: 1},
		{name: "a new mesh-wide policy touches both", res: timeout("everyone", `{"kind":"Mesh"}`, "3s"), render: 2},
		{name: "a Dataplane touches itself", res: dp("api-1", "api", 8081), render: 1},
		{name: "a Dataplane changing the mesh's services touches every proxy (implicit outbounds)", res: dp("api-1", "api2"), render: 2},
		{name: "a collector touches every proxy (its references are by labels)",
			res: `{"type":"MeshOpenTelemetryBackend","mesh":"default","name":"collector","spec":{"endpoint":{"address":"10.0.0.5"}}}`, render: 2},
		{name: "a service touches every proxy", res: `{"type":"MeshService","mesh":"default","name":"db","spec":{"selector":{"dataplaneTags":{"kuma.io/service":"db"}},"ports":[{"port":9000,"targetPort":9000,"appProtocol":"http"}]}}`, render: 2},
		{name: "an instance joining gives every proxy new endpoints, rendering none",
			endpoints: map[string][]Endpoint{"db": db("", "10.0.0.9", "10.0.0.10")}, reassign: 2},
		{name: "an instance leaving too", endpoints: map[string][]Endpoint{"db": db("", "10.0.0.10")}, reassign: 2},
		{name: "a service whose protocol changed renders every proxy", endpoints: map[string][]Endpoint{"db": db("http", "10.0.0.10")}, render: 2},
		{name: "a new service renders every proxy",
			endpoints: map[string][]Endpoint{"db": db("http", "10.0.0.10"), "cache": db("", "10.0.0.11")}, render: 2},
	} {
		renders, reassigns := ctrl.renders, ctrl.reassigns
		if tc.endpoints != nil {
			src.change(func() { src.endpoints = tc.endpoints })
		} else {
			change(decode(tc.res))
		}
		ctrl.renderAll(ctx)
		if got := ctrl.renders - renders; got != tc.render {
			t.Errorf("%s: %d renderings, want %d", tc.name, got, tc.render)
		}
		if got := ctrl.reassigns - reassigns; got != tc.reassign {
			t.Errorf("%s: %d proxies given endpoints alone, want %d", tc.name, got, tc.reassign)
		}
		// Whatever the path, each proxy holds what a fresh rendering
		// gives.
		for _, name := range []string{"web-1", "api-1"} {
			_, want := freshRendering(t, ctrl, ProxyGRPC, name)
			_, got, _ := srv.Current("default." + name)
			if !maps.Equal(got, want) {
				t.Errorf("%s: %s holds versions %v, a fresh rendering %v", tc.name, name, got, want)
			}
		}
	}
}

// TestControllerMatchesFreshRenderings is the controller's skipping of
// untouched proxies (and its reuse of their last renderings and shared
// assignments) against its reference: after every change of a random
// series (the golden cases' policies coming and going, a Dataplane's
// outbounds, instances joining, leaving or changing protocol, the mesh's
// mTLS, one snapshot in five built from every resource), every connected
// proxy, gRPC or Envoy, holds the versions a fresh rendering gives.
func TestControllerMatchesFreshRenderings(t *testing.T) {
	srv, client := testServer(t)
	reg, zone, decode := zoneDecoder(t)
	// Every golden case's policies, each key once.
	dirs, err := filepath.Glob("testdata/*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	var pool []*resource.Resource
	seen := map[resource.Key]bool{}
	for _, dir := range dirs {
		_, in := loadResources(t, filepath.Join(dir, "input.yaml"))
		for _, r := range in.Resources {
			if r.Type != "Dataplane" && !seen[r.Key()] {
				seen[r.Key()] = true
				pool = append(pool, r)
			}
		}
	}
	dp := func(name, svc, protocol string, outbounds ...string) *resource.Resource {
		var outs []string
		for i, o := range outbounds {
			outs = append(outs, `{"port":`+strconv.Itoa(10001+i)+`,"tags":{"kuma.io/service":"`+o+`"}}`)
		}
		return decode(`{"type":"Dataplane","mesh":"default","name":"` + name + `","networking":{"address":"10.0.0.` + strconv.Itoa(len(name)) +
			`","inbound":[{"port":8080,"tags":{"kuma.io/service":"` + svc + `","kuma.io/protocol":"` + protocol + `"}}],"outbound":[` + strings.Join(outs, ",") + `]}}`)
	}
	web := []*resource.Resource{dp("web-1", "web", "http", "backend", "db", "cache"), dp("web-1", "web", "http", "backend", "db")}
	dataplanes := []*resource.Resource{web[0], dp("backend-1", "backend", "http"), dp("db-1", "db", "tcp", "backend")}
	present := map[resource.Key]*resource.Resource{}
	for _, r := range dataplanes {
		present[r.Key()] = r
	}
	build := func(prev *policy.MeshSnapshot, changed *resource.Resource, gone *resource.Key) *policy.MeshSnapshot {
		t.Helper()
		in := policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: zone.SystemNamespace}
		if prev == nil {
			in.Resources = slices.Collect(maps.Values(present))
		} else {
			in.Previous, in.Changes = prev, &policy.Changes{}
			if changed != nil {
				in.Changes.Put = []*resource.Resource{changed}
			}
			if gone != nil {
				in.Changes.Deleted = []resource.Key{*gone}
			}
		}
		snap, err := policy.NewMeshSnapshot(in)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	instances := func(svc, protocol string, n int) []Endpoint {
		var out []Endpoint
		for i := range n {
			out = append(out, Endpoint{Address: "10.1." + strconv.Itoa(len(svc)) + "." + strconv.Itoa(i+1), Port: 8080, Zone: []string{"zone-1", "zone-2"}[i%2],
				Healthy: true, Tags: map[string]string{"kuma.io/service": svc, "kuma.io/protocol": protocol}})
		}
		return out
	}
	protocols := map[string]string{"web": "http", "backend": "http", "db": "tcp", "cache": "http"}
	counts := map[string]int{"web": 1, "backend": 2, "db": 1, "cache": 1}
	endpointsNow := func() map[string][]Endpoint {
		out := map[string][]Endpoint{}
		for svc, n := range counts {
			out[svc] = instances(svc, protocols[svc], n)
		}
		return out
	}
	src := &sources{snap: build(nil, nil, nil), endpoints: endpointsNow(), mtls: true, next: make(chan struct{})}
	var changes generations
	ctrl, err := NewController(ControllerConfig{Server: srv, Sources: changes.sources(src), Zone: "zone-1"})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{"web-1": ProxyEnvoy, "backend-1": ProxyGRPC, "db-1": ProxyEnvoy}
	for name, kind := range kinds {
		node := &corev3.Node{Id: "default." + name}
		if kind == ProxyEnvoy {
			node.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataProxy: structpb.NewStringValue(ProxyEnvoy)}}
		}
		st := openStream(t, client, node.Id)
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return len(srv.Connected()) == len(kinds) })
	ctx := context.Background()
	check := func(step int, what string) {
		t.Helper()
		ctrl.renderAll(ctx)
		for name, kind := range kinds {
			fresh, want := freshRendering(t, ctrl, kind, name)
			if held, got, _ := srv.Current("default." + name); !maps.Equal(got, want) {
				t.Fatalf("step %d (%s): %s holds other resources than a fresh rendering gives:\n%s", step, what, name,
					firstDifference(string(goldenOf(t, fresh)), string(goldenOf(t, held))))
			}
		}
	}
	check(0, "connected")
	rng := rand.New(rand.NewPCG(11, 17))
	// change applies r, or removes the resource gone names.
	change := func(r *resource.Resource, gone *resource.Key, whole bool) {
		var key resource.Key
		if gone != nil {
			key = *gone
		} else {
			key = r.Key()
		}
		next := build(src.snap, r, gone)
		if whole {
			next = build(nil, nil, nil)
		}
		changes.add(key)
		src.change(func() { src.snap = next })
	}
	for step := 1; step <= 300; step++ {
		var what string
		switch k := rng.IntN(10); {
		case k < 6: // a policy comes or goes
			r := pool[rng.IntN(len(pool))]
			if _, ok := present[r.Key()]; ok {
				delete(present, r.Key())
				key := r.Key()
				change(nil, &key, rng.IntN(5) == 0)
				what = "gone: " + key.String()
			} else {
				present[r.Key()] = r
				change(r, nil, rng.IntN(5) == 0)
				what = "back: " + r.Key().String()
			}
		case k == 6: // web-1 calls cache, or stops
			next := web[rng.IntN(2)]
			present[next.Key()] = next
			change(next, nil, false)
			what = "web-1's outbounds"
		case k == 7: // instances join or leave
			svc := []string{"backend", "db", "cache"}[rng.IntN(3)]
			counts[svc] = rng.IntN(3)
			src.change(func() { src.endpoints = endpointsNow() })
			what = "instances of " + svc
		case k == 8: // a service's instances change protocol
			svc := []string{"backend", "db", "cache"}[rng.IntN(3)]
			protocols[svc] = map[string]string{"http": "tcp", "tcp": "grpc", "grpc": "http"}[protocols[svc]]
			src.change(func() { src.endpoints = endpointsNow() })
			what = svc + " speaks " + protocols[svc]
		default: // the mesh's mTLS
			src.change(func() { src.mtls = !src.mtls })
			what = "mTLS"
		}
		check(step, what)
	}
}
