package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	planeid "github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/tuning"
	"github.com/meridian-mesh/meridian/internal/xds"
)

// The render scenario (docs/dataplane.md#xds), in process: a mesh with
// renderServices services, one instance each, and n MeshTimeouts spread
// over them; web-1 declares an outbound to every service. Per round, one
// policy changes, the snapshot is rebuilt from the change, and web-1 is
// rendered from it (its _config, then the resources): for proxyless gRPC
// and for Envoy. The Envoy configuration's size is its encoded bytes.
// There are renderRounds rounds because a p99 needs more than a hundred
// samples: of 60, it is their maximum, one stall of the machine. The
// rendering runs under the zone's collector pacing (tuning.PaceGC): with
// Go's default, this process's small heap was collected every 20 MB,
// three times as often as zone-cp's, and a third of the rounds ran beside
// a collection.

const (
	renderServices = 100
	renderRounds   = 300
)

// renderFixture is the rendering scenario's mesh: its snapshot, web-1 and
// the endpoints of every service.
type renderFixture struct {
	reg         *resource.Registry
	plane       planeid.Plane
	snap        *policy.MeshSnapshot
	dp          *xds.Dataplane
	endpoints   map[string][]xds.Endpoint
	assignments *xds.LoadAssignments
}

// renderTimeout is MeshTimeout t-i, on service svc-(i mod renderServices).
func renderTimeout(i int, requestTimeout string) string {
	return fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":"t-%d","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"svc-%d"},"default":{"http":{"requestTimeout":%q}}}]}}`,
		i, i%renderServices, requestTimeout)
}

func newRenderFixture(n int) (*renderFixture, error) {
	reg := resource.NewDefaultRegistry()
	p, err := planeid.NewZone("zone-1", planeid.EnvUniversal, "", false)
	if err != nil {
		return nil, err
	}
	f := &renderFixture{reg: reg, plane: p, endpoints: map[string][]xds.Endpoint{}}
	var rs []*resource.Resource
	add := func(doc string) error {
		res, err := f.decode(doc)
		if err != nil {
			return err
		}
		if err := reg.Validate(res, p); err != nil {
			return fmt.Errorf("%s: %w", res.Key(), err)
		}
		rs = append(rs, res)
		return nil
	}
	outbounds := ""
	for i := range renderServices {
		svc := fmt.Sprintf("svc-%d", i)
		outbounds += fmt.Sprintf(`{"port":%d,"tags":{"kuma.io/service":%q}},`, 20000+i, svc)
		if err := add(fmt.Sprintf(`{"type":"Dataplane","mesh":"default","name":"%s-1","networking":{"address":"10.0.%d.%d","inbound":[{"port":8080,"tags":{"kuma.io/service":%q,"kuma.io/protocol":"http"}}]}}`,
			svc, i/250, i%250+1, svc)); err != nil {
			return nil, err
		}
		f.endpoints[svc] = []xds.Endpoint{{Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Port: 8080, Zone: "zone-1", Healthy: true,
			Tags: map[string]string{"kuma.io/service": svc, "kuma.io/protocol": "http"}}}
	}
	if err := add(`{"type":"Dataplane","mesh":"default","name":"web-1","networking":{"address":"10.1.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"web","kuma.io/protocol":"http"}}],"outbound":[` +
		outbounds[:len(outbounds)-1] + `]}}`); err != nil {
		return nil, err
	}
	for i := range n {
		if err := add(renderTimeout(i, fmt.Sprintf("%ds", 1+i%30))); err != nil {
			return nil, err
		}
	}
	if f.snap, err = policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: p.SystemNamespace, Resources: rs}); err != nil {
		return nil, err
	}
	if f.dp, err = xds.ParseDataplane(f.snap.Dataplane("web-1", ""), ""); err != nil {
		return nil, err
	}
	f.assignments = xds.NewLoadAssignments(f.endpoints, "zone-1")
	return f, nil
}

func (f *renderFixture) decode(doc string) (*resource.Resource, error) {
	res, err := f.reg.Decode([]byte(doc))
	if err != nil {
		return nil, err
	}
	f.reg.Normalize(res, f.plane.SystemNamespace)
	return res, nil
}

// change rebuilds the snapshot from one policy's change.
func (f *renderFixture) change(round int) error {
	changed, err := f.decode(renderTimeout(round, fmt.Sprintf("%dms", 100+round)))
	if err != nil {
		return err
	}
	next, err := policy.NewMeshSnapshot(policy.Inputs{Registry: f.reg, Mesh: "default", Zone: "zone-1", SystemNamespace: f.plane.SystemNamespace,
		Previous: f.snap, Changes: &policy.Changes{Put: []*resource.Resource{changed}}})
	if err != nil {
		return err
	}
	f.snap = next
	return nil
}

// rendering is a rendering of web-1: its resources and their versions.
type rendering struct {
	res      *xds.Resources
	versions map[string]string
}

// render renders web-1 from the current snapshot for kind: its _config,
// then the resources and their versions, as the zone's controller and
// server do (from prev, its last rendering, when set: its parts are
// reused, and a list of the very same resources keeps its version).
func (f *renderFixture) render(kind string, prev *rendering) (*rendering, error) {
	cfg, err := f.snap.Config("web-1", "")
	if err != nil {
		return nil, err
	}
	in := xds.Input{Dataplane: f.dp, Zone: "zone-1", Config: cfg, Endpoints: f.endpoints, LoadAssignments: f.assignments, MTLS: true}
	if prev != nil {
		in.Previous = prev.res
	}
	var res *xds.Resources
	if kind == xds.ProxyEnvoy {
		res, err = xds.GenerateEnvoy(in)
	} else {
		res, err = xds.Generate(in)
	}
	if err != nil {
		return nil, err
	}
	out := &rendering{res: res}
	if prev != nil {
		out.versions, err = xds.VersionsAfter(res, prev.res, prev.versions)
	} else {
		out.versions, err = xds.Versions(res)
	}
	return out, err
}

// renderScenario times, per kind of proxy, web-1's rendering after one
// policy change: from its last rendering (what the zone does for a
// connected proxy) and whole (a proxy that connects).
func renderScenario(n int, profileDir string, r results) error {
	f, err := newRenderFixture(n)
	if err != nil {
		return err
	}
	// What the scenarios before left in this process (a thousand
	// simulated proxies) is not the rendering's to collect; the
	// collector is paced as zone-cp paces its own.
	runtime.GC()
	defer tuning.PaceGC()()
	if profileDir != "" {
		pf, err := os.Create(filepath.Join(profileDir, "render.pprof"))
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	kinds := []string{xds.ProxyGRPC, xds.ProxyEnvoy}
	last := map[string]*rendering{}
	for _, kind := range kinds {
		if last[kind], err = f.render(kind, nil); err != nil {
			return err
		}
	}
	times := map[string][]time.Duration{}
	var envoyBytes int
	for round := range renderRounds {
		// One policy changes; the snapshot is rebuilt from the change.
		if err := f.change(round); err != nil {
			return err
		}
		for _, kind := range kinds {
			for _, whole := range []bool{false, true} {
				prev := last[kind]
				if whole {
					prev = nil
				}
				start := time.Now()
				res, err := f.render(kind, prev)
				if err != nil {
					return err
				}
				took := time.Since(start)
				name := kind
				if whole {
					name = "full_" + kind
				} else {
					last[kind] = res
				}
				times[name] = append(times[name], took)
				if kind == xds.ProxyEnvoy {
					envoyBytes = encodedSize(res.res)
				}
			}
		}
	}
	for name, ts := range times {
		r["render_"+name+"_p50_ms"] = msOf(percentileOf(ts, 50))
		r["render_"+name+"_p99_ms"] = msOf(percentileOf(ts, 99))
	}
	r["render_envoy_kib"] = float64(envoyBytes) / 1024
	return nil
}

// encodedSize is the resources' encoded size.
func encodedSize(res *xds.Resources) int {
	n := 0
	for _, items := range res.ByType() {
		for _, it := range items {
			n += proto.Size(it)
		}
	}
	return n
}

func percentileOf(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, len(s)*p/100)]
}
