package dataplane

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/xds"
)

func TestEndpoints(t *testing.T) {
	ctx := context.Background()
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	p, err := plane.NewZone("zone-1", plane.EnvUniversal, "", true)
	if err != nil {
		t.Fatal(err)
	}
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
