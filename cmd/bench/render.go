package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	planeid "github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/xds"
)

// The render scenario (docs/dataplane.md#xds), in process: a mesh with
// renderServices services, one instance each, and n MeshTimeouts spread
// over them; web-1 declares an outbound to every service. Per round, one
// policy changes, the snapshot is rebuilt from the change, and web-1 is
// rendered from it (its _config, then the resources): for proxyless gRPC
// and for Envoy. The Envoy configuration's size is its encoded bytes.

const (
	renderServices = 100
	renderRounds   = 60
)

func renderScenario(n int, profileDir string, r results) error {
	reg := resource.NewDefaultRegistry()
	p, err := planeid.NewZone("zone-1", planeid.EnvUniversal, "", false)
	if err != nil {
		return err
	}
	var rs []*resource.Resource
	add := func(doc string) error {
		res, err := reg.Decode([]byte(doc))
		if err != nil {
			return err
		}
		reg.Normalize(res, p.SystemNamespace)
		if err := reg.Validate(res, p); err != nil {
			return fmt.Errorf("%s: %w", res.Key(), err)
		}
		rs = append(rs, res)
		return nil
	}
	outbounds := ""
	endpoints := map[string][]xds.Endpoint{}
	for i := range renderServices {
		svc := fmt.Sprintf("svc-%d", i)
		outbounds += fmt.Sprintf(`{"port":%d,"tags":{"kuma.io/service":%q}},`, 20000+i, svc)
		if err := add(fmt.Sprintf(`{"type":"Dataplane","mesh":"default","name":"%s-1","networking":{"address":"10.0.%d.%d","inbound":[{"port":8080,"tags":{"kuma.io/service":%q,"kuma.io/protocol":"http"}}]}}`,
			svc, i/250, i%250+1, svc)); err != nil {
			return err
		}
		endpoints[svc] = []xds.Endpoint{{Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Port: 8080, Zone: "zone-1", Healthy: true,
			Tags: map[string]string{"kuma.io/service": svc, "kuma.io/protocol": "http"}}}
	}
	if err := add(`{"type":"Dataplane","mesh":"default","name":"web-1","networking":{"address":"10.1.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"web","kuma.io/protocol":"http"}}],"outbound":[` +
		outbounds[:len(outbounds)-1] + `]}}`); err != nil {
		return err
	}
	timeout := func(i int, requestTimeout string) string {
		return fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":"t-%d","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"svc-%d"},"default":{"http":{"requestTimeout":%q}}}]}}`,
			i, i%renderServices, requestTimeout)
	}
	for i := range n {
		if err := add(timeout(i, fmt.Sprintf("%ds", 1+i%30))); err != nil {
			return err
		}
	}
	snap, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: p.SystemNamespace, Resources: rs})
	if err != nil {
		return err
	}
	dp, err := xds.ParseDataplane(snap.Dataplane("web-1", ""), "")
	if err != nil {
		return err
	}
	assignments := xds.NewLoadAssignments(endpoints, "zone-1")
	if profileDir != "" {
		f, err := os.Create(filepath.Join(profileDir, "render.pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var grpcTimes, envoyTimes []time.Duration
	var envoyBytes int
	for round := range renderRounds {
		// One policy changes; the snapshot is rebuilt from the change.
		changed, err := reg.Decode([]byte(timeout(round, fmt.Sprintf("%dms", 100+round))))
		if err != nil {
			return err
		}
		reg.Normalize(changed, p.SystemNamespace)
		next, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default", Zone: "zone-1", SystemNamespace: p.SystemNamespace,
			Previous: snap, Changes: &policy.Changes{Put: []*resource.Resource{changed}}})
		if err != nil {
			return err
		}
		snap = next
		for _, kind := range []string{xds.ProxyGRPC, xds.ProxyEnvoy} {
			start := time.Now()
			cfg, err := snap.Config("web-1", "")
			if err != nil {
				return err
			}
			in := xds.Input{Dataplane: dp, Zone: "zone-1", Config: cfg, Endpoints: endpoints, LoadAssignments: assignments, MTLS: true}
			var res *xds.Resources
			if kind == xds.ProxyEnvoy {
				res, err = xds.GenerateEnvoy(in)
			} else {
				res, err = xds.Generate(in)
			}
			if err != nil {
				return err
			}
			if _, err := xds.Versions(res); err != nil {
				return err
			}
			took := time.Since(start)
			if kind == xds.ProxyEnvoy {
				envoyTimes = append(envoyTimes, took)
				envoyBytes = encodedSize(res)
			} else {
				grpcTimes = append(grpcTimes, took)
			}
		}
	}
	r["render_grpc_p99_ms"] = msOf(percentileOf(grpcTimes, 99))
	r["render_envoy_p99_ms"] = msOf(percentileOf(envoyTimes, 99))
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
