package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/xds"
)

// openZone opens a store (closed when the test ends) and the plane of
// zone-1, Universal.
func openZone(t *testing.T) (storage.Store, plane.Plane) {
	t.Helper()
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	p, err := plane.NewZone("zone-1", plane.EnvUniversal, "", true)
	if err != nil {
		t.Fatal(err)
	}
	return store, p
}

func TestEndpoints(t *testing.T) {
	ctx := context.Background()
	store, p := openZone(t)
	live := map[string]bool{}
	e, err := NewEndpoints(EndpointsConfig{Store: store, Plane: p, Live: func(n string) bool { return live[n] }})
	if err != nil {
		t.Fatal(err)
	}
	put := func(r *resource.Resource) {
		t.Helper()
		if _, _, err := store.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	dp := func(name, addr, svc string, port int, managed bool, state string) *resource.Resource {
		inbound := map[string]any{"port": port, "tags": map[string]string{"kuma.io/service": svc, "version": "v1"}}
		if state != "" {
			inbound["state"] = state
		}
		spec, _ := json.Marshal(map[string]any{"networking": map[string]any{"address": addr, "inbound": []any{inbound}}})
		r := &resource.Resource{Type: "Dataplane", Mesh: "m", Name: name, Spec: spec}
		r.Labels.Set(resource.LabelOrigin, resource.OriginZone)
		r.Labels.Set(resource.LabelZone, "zone-1")
		if managed {
			r.Labels.Set(LabelManagedBy, ManagedByAgent)
		}
		return r
	}
	put(dp("web-1", "10.0.0.1", "web", 8080, true, ""))
	put(dp("web-2", "10.0.0.2", "web", 8080, true, ""))
	put(dp("api-1", "10.0.0.3", "api", 9090, false, "NotReady"))
	remote := &resource.Resource{Type: "ZoneEndpoints", Mesh: "m", Name: SummaryName("web"),
		Spec: json.RawMessage(`{"service": "web", "endpoints": [{"address": "10.1.0.1", "port": 8080, "healthy": true}]}`)}
	remote.Labels.Set(resource.LabelOrigin, resource.OriginZone)
	remote.Labels.Set(resource.LabelZone, "zone-2")
	// A summary of zone-2 for the same service shares the name: both are
	// stored under their zone's hashed name on a real zone; here another
	// mesh keeps them apart.
	remote.Mesh = "m"
	remote.Name = SummaryName("web") + "-z2"
	put(remote)
	live["m.web-1"] = true

	changed := e.Changed()
	e.refresh(ctx)
	select {
	case <-changed:
	default:
		t.Fatal("Changed not signalled")
	}
	got := e.Of("m")
	want := map[string][]xds.Endpoint{
		"web": {
			{Address: "10.0.0.1", Port: 8080, Zone: "zone-1", Healthy: true, Tags: map[string]string{"version": "v1"}},
			{Address: "10.0.0.2", Port: 8080, Zone: "zone-1", Healthy: false, Tags: map[string]string{"version": "v1"}}, // agent gone
			{Address: "10.1.0.1", Port: 8080, Zone: "zone-2", Healthy: true},
		},
		"api": {{Address: "10.0.0.3", Port: 9090, Zone: "zone-1", Healthy: false, Tags: map[string]string{"version": "v1"}}}, // NotReady
	}
	assertEndpoints(t, got, want)

	// This zone's summaries: one per service, compact, owned by the zone.
	sums, err := store.List(ctx, storage.ListOptions{Type: "ZoneEndpoints", Mesh: "m"})
	if err != nil {
		t.Fatal(err)
	}
	own := map[string]summarySpec{}
	for _, r := range sums.Items {
		if r.Labels.Get(resource.LabelZone) != "zone-1" {
			continue
		}
		var s summarySpec
		if err := json.Unmarshal(r.Spec, &s); err != nil {
			t.Fatal(err)
		}
		if r.Name != SummaryName(s.Service) {
			t.Errorf("summary of %s named %s", s.Service, r.Name)
		}
		own[s.Service] = s
	}
	if len(own) != 2 || len(own["web"].Endpoints) != 2 || len(own["api"].Endpoints) != 1 {
		t.Fatalf("own summaries = %+v", own)
	}

	// Unchanged inputs: the same slices, no signal.
	changed = e.Changed()
	e.refresh(ctx)
	select {
	case <-changed:
		t.Fatal("signalled without a change")
	default:
	}
	if again := e.Of("m"); &again["web"][0] != &got["web"][0] {
		t.Fatal("unchanged endpoints got a new slice")
	}

	// A service gone: its summary is removed.
	if err := store.Delete(ctx, resource.Key{Type: "Dataplane", Mesh: "m", Name: "api-1"}, 0); err != nil {
		t.Fatal(err)
	}
	e.refresh(ctx)
	if _, ok := e.Of("m")["api"]; ok {
		t.Fatal("endpoints of a removed Dataplane kept")
	}
	if _, err := store.Get(ctx, resource.Key{Type: "ZoneEndpoints", Mesh: "m", Name: SummaryName("api")}); err == nil {
		t.Fatal("summary of a service gone kept")
	}
}

func assertEndpoints(t *testing.T, got, want map[string][]xds.Endpoint) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	var gv, wv any
	json.Unmarshal(g, &gv)
	json.Unmarshal(w, &wv)
	gj, _ := json.MarshalIndent(gv, "", " ")
	wj, _ := json.MarshalIndent(wv, "", " ")
	if string(gj) != string(wj) {
		t.Fatalf("endpoints:\n%s\nwant:\n%s", gj, wj)
	}
}

func TestSummaryName(t *testing.T) {
	reg := resource.NewDefaultRegistry()
	p, err := plane.NewZone("zone-1", plane.EnvUniversal, "", true)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, svc := range []string{"web", "Web", "web_ns_svc_8080", "web-ns-svc-8080", "a/b", "x.y.z", string(make([]byte, 100)), "-", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa_b"} {
		n := SummaryName(svc)
		r := &resource.Resource{Type: "ZoneEndpoints", Mesh: "m", Name: n, Spec: json.RawMessage(`{"service": "s"}`)}
		if err := reg.Validate(r, p); err != nil {
			t.Errorf("%q → %q: %v", svc, n, err)
		}
		if other, ok := seen[n]; ok {
			t.Errorf("%q and %q share %q", svc, other, n)
		}
		seen[n] = svc
	}
}

// TestSameSummary: a stored summary is unchanged when it holds the same
// endpoints, whatever its encoding's field order.
func TestSameSummary(t *testing.T) {
	want := summarySpec{Service: "web", Endpoints: []summaryEndpoint{
		{Address: "10.0.0.1", Port: 80, Healthy: true, Tags: map[string]string{"version": "v1"}},
		{Address: "10.0.0.2", Port: 80},
	}}
	raw, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		stored string
		same   bool
	}{
		{"the same bytes", string(raw), true},
		{"other field order", `{"endpoints":[{"tags":{"version":"v1"},"port":80,"healthy":true,"address":"10.0.0.1"},{"port":80,"address":"10.0.0.2","tags":{}}],"service":"web"}`, true},
		{"health changed", `{"service":"web","endpoints":[{"address":"10.0.0.1","port":80,"healthy":false,"tags":{"version":"v1"}},{"address":"10.0.0.2","port":80}]}`, false},
		{"tags changed", `{"service":"web","endpoints":[{"address":"10.0.0.1","port":80,"healthy":true,"tags":{"version":"v2"}},{"address":"10.0.0.2","port":80}]}`, false},
		{"an endpoint fewer", `{"service":"web","endpoints":[{"address":"10.0.0.1","port":80,"healthy":true,"tags":{"version":"v1"}}]}`, false},
		{"another service", `{"service":"api","endpoints":[{"address":"10.0.0.1","port":80,"healthy":true,"tags":{"version":"v1"}},{"address":"10.0.0.2","port":80}]}`, false},
		{"not JSON", `{`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameSummary([]byte(tc.stored), raw, want); got != tc.same {
				t.Errorf("sameSummary = %v, want %v", got, tc.same)
			}
		})
	}
}

// TestEndpointsFollowMatchesRefresh: endpoints and summaries kept up by
// applying the store's changes one by one equal those of reading it all
// again, over random joins, leaves, health and presence changes, other
// zones' summaries, and this zone's summaries changed behind its back.
func TestEndpointsFollowMatchesRefresh(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, p := openZone(t)
	live := map[string]bool{}
	liveOf := func(n string) bool { return live[n] }
	followed, err := NewEndpoints(EndpointsConfig{Store: store, Plane: p, Live: liveOf})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := store.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	followed.refresh(ctx)
	events, err := store.Watch(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	// catchUp applies every change up to the store's revision.
	catchUp := func() {
		t.Helper()
		want, err := store.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for rev < want {
			select {
			case ev := <-events:
				followed.apply(ev)
				rev = ev.Revision
			case <-time.After(5 * time.Second):
				t.Fatalf("no event after revision %d (store at %d)", rev, want)
			}
		}
	}
	put := func(r *resource.Resource) {
		t.Helper()
		if _, _, err := store.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	del := func(k resource.Key) {
		t.Helper()
		if err := store.Delete(ctx, k, 0); err != nil && !errors.Is(err, storage.ErrNotFound) {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	services := []string{"web", "api", "db"}
	meshes := []string{"m", "n"}
	dataplane := func(i int) *resource.Resource {
		var inbounds []any
		for j := range rng.IntN(3) {
			in := map[string]any{"port": 8000 + rng.IntN(2), "address": fmt.Sprintf("10.0.0.%d", rng.IntN(4)),
				"tags": map[string]string{"kuma.io/service": services[rng.IntN(len(services))], "version": fmt.Sprint("v", j+rng.IntN(2))}}
			if rng.IntN(4) == 0 {
				in["state"] = "NotReady"
			}
			inbounds = append(inbounds, in)
		}
		spec, _ := json.Marshal(map[string]any{"networking": map[string]any{"address": "10.0.0.9", "inbound": inbounds}})
		r := &resource.Resource{Type: "Dataplane", Mesh: meshes[i%2], Name: fmt.Sprint("dp-", i), Spec: spec}
		r.Labels.Set(resource.LabelOrigin, resource.OriginZone)
		r.Labels.Set(resource.LabelZone, "zone-1")
		if i%3 == 0 {
			r.Labels.Set(resource.LabelZone, "zone-2") // another zone's: no endpoints here
		}
		if i%2 == 1 {
			r.Labels.Set(LabelManagedBy, ManagedByAgent)
		}
		return r
	}
	summary := func(zone string, i int) *resource.Resource {
		svc := services[i%len(services)]
		var eps []string
		for j := range rng.IntN(3) {
			eps = append(eps, fmt.Sprintf(`{"address":"10.%d.0.%d","port":80,"healthy":%v}`, i, j, rng.IntN(2) == 0))
		}
		spec := fmt.Sprintf(`{"service":%q,"endpoints":[%s]}`, svc, strings.Join(eps, ","))
		r := &resource.Resource{Type: "ZoneEndpoints", Mesh: meshes[i%2], Name: SummaryName(svc) + "-" + zone, Spec: json.RawMessage(spec)}
		if zone == "zone-1" {
			r.Name = SummaryName(svc)
		}
		r.Labels.Set(resource.LabelOrigin, resource.OriginZone)
		r.Labels.Set(resource.LabelZone, zone)
		return r
	}
	for step := range 400 {
		switch op := rng.IntN(10); {
		case op < 4:
			put(dataplane(rng.IntN(12)))
		case op < 5:
			del(resource.Key{Type: "Dataplane", Mesh: meshes[rng.IntN(2)], Name: fmt.Sprint("dp-", rng.IntN(12))})
		case op < 6:
			i := rng.IntN(12)
			live[xds.NodeID(meshes[i%2], fmt.Sprint("dp-", i), "")] = rng.IntN(2) == 0
			followed.checkLive()
		case op < 7:
			put(summary(fmt.Sprint("zone-", 2+rng.IntN(2)), rng.IntN(6)))
		case op < 8:
			r := summary(fmt.Sprint("zone-", 2+rng.IntN(2)), rng.IntN(6))
			del(r.Key())
		case op < 9:
			r := summary("zone-1", rng.IntN(6)) // this zone's, written by hand
			if rng.IntN(3) == 0 {
				// under another service's name
				r.Name = SummaryName(services[rng.IntN(len(services))])
			}
			put(r)
		default:
			del(summary("zone-1", rng.IntN(6)).Key())
		}
		catchUp()
		followed.flush(ctx)
		catchUp() // the follower's own writes come back as changes

		before, err := store.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := NewEndpoints(EndpointsConfig{Store: store, Plane: p, Live: liveOf})
		if err != nil {
			t.Fatal(err)
		}
		fresh.refresh(ctx)
		if after, _ := store.Revision(ctx); after != before {
			t.Fatalf("step %d: reading the store again rewrote this zone's summaries (revision %d → %d)", step, before, after)
		}
		brute := bruteEndpoints(t, store, "zone-1", liveOf)
		for _, mesh := range meshes {
			got, want := followed.Of(mesh), fresh.Of(mesh)
			if b := brute[mesh]; len(b) != len(want) {
				t.Fatalf("step %d, mesh %s: services %v, brute force %v", step, mesh, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(b)))
			}
			for svc, eps := range brute[mesh] {
				if !sameEndpoints(inOrder(want[svc]), inOrder(eps)) {
					t.Fatalf("step %d, mesh %s, service %s:\n%+v\nbrute force\n%+v", step, mesh, svc, want[svc], eps)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("step %d, mesh %s: services %v, want %v", step, mesh, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
			}
			for svc, eps := range want {
				if !sameEndpoints(got[svc], eps) {
					t.Fatalf("step %d, mesh %s, service %s:\n%+v\nwant\n%+v", step, mesh, svc, got[svc], eps)
				}
			}
		}
	}
}

// bruteEndpoints lists every mesh's endpoints from the store as a zone's
// proxies reach them, read whole: this zone's Dataplanes' inbounds, and
// the other zones' summaries.
func bruteEndpoints(t *testing.T, store storage.Store, zone string, live func(string) bool) map[string]map[string][]xds.Endpoint {
	t.Helper()
	ctx := context.Background()
	out := map[string]map[string][]xds.Endpoint{}
	add := func(mesh, svc string, ep xds.Endpoint) {
		if out[mesh] == nil {
			out[mesh] = map[string][]xds.Endpoint{}
		}
		out[mesh][svc] = append(out[mesh][svc], ep)
	}
	dps, err := store.List(ctx, storage.ListOptions{Type: "Dataplane"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range dps.Items {
		if r.Labels.Get(resource.LabelZone) != zone {
			continue
		}
		dp, err := xds.ParseDataplane(r, "")
		if err != nil {
			continue
		}
		up := r.Labels.Get(LabelManagedBy) != ManagedByAgent || live(xds.NodeID(dp.Mesh, dp.Name, ""))
		for _, in := range dp.Inbounds {
			tags := maps.Clone(in.Tags)
			delete(tags, resource.ServiceTag)
			delete(tags, resource.LabelZone)
			add(dp.Mesh, in.Service(), xds.Endpoint{Address: in.Address, Port: in.Port, Zone: zone, Healthy: in.Ready && up, Tags: tags})
		}
	}
	sums, err := store.List(ctx, storage.ListOptions{Type: "ZoneEndpoints"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sums.Items {
		if r.Labels.Get(resource.LabelZone) == zone {
			continue
		}
		var spec summarySpec
		if json.Unmarshal(r.Spec, &spec) != nil {
			continue
		}
		for _, ep := range spec.Endpoints {
			add(r.Mesh, spec.Service, xds.Endpoint{Address: ep.Address, Port: ep.Port, Zone: r.Labels.Get(resource.LabelZone), Healthy: ep.Healthy, Tags: ep.Tags})
		}
	}
	return out
}

// inOrder sorts a copy of eps by every field.
func inOrder(eps []xds.Endpoint) []xds.Endpoint {
	eps = slices.Clone(eps)
	slices.SortFunc(eps, func(a, b xds.Endpoint) int {
		x, _ := json.Marshal(a)
		y, _ := json.Marshal(b)
		return strings.Compare(string(x), string(y))
	})
	return eps
}

// TestNextWindow: back-to-back batches settle longer, up to MaxSettle; a
// batch after a quiet window settles for Settle again.
func TestNextWindow(t *testing.T) {
	c := EndpointsConfig{Settle: 20 * time.Millisecond, MaxSettle: 320 * time.Millisecond}
	ms := time.Millisecond
	for _, tc := range []struct {
		last, quiet, want time.Duration
	}{
		{20 * ms, math.MaxInt64, 20 * ms}, // the first batch
		{20 * ms, 5 * ms, 40 * ms},
		{40 * ms, 39 * ms, 80 * ms},
		{160 * ms, 1 * ms, 320 * ms},
		{320 * ms, 1 * ms, 320 * ms},
		{320 * ms, 320 * ms, 20 * ms},
		{80 * ms, time.Second, 20 * ms},
	} {
		if got := c.nextWindow(tc.last, tc.quiet); got != tc.want {
			t.Errorf("nextWindow(%v, %v) = %v, want %v", tc.last, tc.quiet, got, tc.want)
		}
	}
}

// failingPuts fails the first puts of endpoint summaries.
type failingPuts struct {
	storage.Store
	fail int
}

func (f *failingPuts) Put(ctx context.Context, r *resource.Resource) (*resource.Resource, storage.Outcome, error) {
	if r.Type == "ZoneEndpoints" && f.fail > 0 {
		f.fail--
		return nil, 0, errors.New("disk full")
	}
	return f.Store.Put(ctx, r)
}

// TestEndpointsRetryFailedSummary: a summary the store refused is written
// with the next batch of changes, whatever service that batch is about.
func TestEndpointsRetryFailedSummary(t *testing.T) {
	ctx := context.Background()
	store, p := openZone(t)
	failing := &failingPuts{Store: store, fail: 1}
	e, err := NewEndpoints(EndpointsConfig{Store: failing, Plane: p})
	if err != nil {
		t.Fatal(err)
	}
	dp := func(name, svc string) *resource.Resource {
		spec, _ := json.Marshal(map[string]any{"networking": map[string]any{"address": "10.0.0.1",
			"inbound": []any{map[string]any{"port": 80, "tags": map[string]string{"kuma.io/service": svc}}}}})
		r := &resource.Resource{Type: "Dataplane", Mesh: "m", Name: name, Spec: spec}
		r.Labels.Set(resource.LabelOrigin, resource.OriginZone)
		r.Labels.Set(resource.LabelZone, "zone-1")
		return r
	}
	summary := func(svc string) bool {
		_, err := store.Get(ctx, resource.Key{Type: "ZoneEndpoints", Mesh: "m", Name: SummaryName(svc)})
		return err == nil
	}
	if _, _, err := store.Put(ctx, dp("web-1", "web")); err != nil {
		t.Fatal(err)
	}
	e.refresh(ctx)
	if summary("web") {
		t.Fatal("the refused summary is stored")
	}
	stored2, _, err := store.Put(ctx, dp("api-1", "api"))
	if err != nil {
		t.Fatal(err)
	}
	e.apply(storage.Event{Kind: storage.EventPut, Resource: stored2})
	e.flush(ctx)
	if !summary("web") || !summary("api") {
		t.Fatalf("summaries stored after the next batch: web %v, api %v", summary("web"), summary("api"))
	}
}

// agentsOnHook is a store whose puts of endpoint summaries run a hook
// once: an agent coming back while the follower writes.
type agentsOnHook struct {
	storage.Store
	once sync.Once
	hook func()
}

func (a *agentsOnHook) Put(ctx context.Context, r *resource.Resource) (*resource.Resource, storage.Outcome, error) {
	if r.Type == "ZoneEndpoints" {
		a.once.Do(a.hook)
	}
	return a.Store.Put(ctx, r)
}

// TestEndpointsSeePresenceDuringFlush: an agent that connects while the
// follower is writing summaries (no one waits on the presence channel
// then) still makes its endpoint healthy.
func TestEndpointsSeePresenceDuringFlush(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, p := openZone(t)
	var (
		mu   sync.Mutex
		live bool
		next = make(chan struct{})
	)
	presence := func() <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		return next
	}
	hooked := &agentsOnHook{Store: store, hook: func() {
		mu.Lock()
		defer mu.Unlock()
		live = true
		close(next)
		next = make(chan struct{})
	}}
	e, err := NewEndpoints(EndpointsConfig{Store: hooked, Plane: p, Presence: presence,
		Live: func(string) bool { mu.Lock(); defer mu.Unlock(); return live }})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(map[string]any{"networking": map[string]any{"address": "10.0.0.1",
		"inbound": []any{map[string]any{"port": 80, "tags": map[string]string{"kuma.io/service": "web"}}}}})
	dp := &resource.Resource{Type: "Dataplane", Mesh: "m", Name: "web-1", Spec: spec}
	dp.Labels.Set(resource.LabelOrigin, resource.OriginZone)
	dp.Labels.Set(resource.LabelZone, "zone-1")
	dp.Labels.Set(LabelManagedBy, ManagedByAgent)
	if _, _, err := store.Put(ctx, dp); err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.Run(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if eps := e.Of("m")["web"]; len(eps) == 1 && eps[0].Healthy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent connected during a flush and its endpoint is still %+v", e.Of("m")["web"])
		}
	}
}
