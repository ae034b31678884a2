package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// --- Outbounds, ports and routes vs brute force (docs/policy.md#routes) ---

// outEntry is a generated to-entry with what the reference needs to judge
// it without the engine.
type outEntry struct {
	policy  string
	top     string // top-level kind: Mesh, MeshService (web) or MeshHTTPRoute
	topName string // the route of a MeshHTTPRoute top-level targetRef
	index   int
	kind    string // the entry's own kind
	name    string // MeshService or MeshHTTPRoute name
	section string // sectionName of a MeshService entry
	conf    any
}

// outboundCase: the outbounds of web-1 (service, destination port and
// section name of that port) and the routes routing each.
var outboundCase = []struct {
	service, section string
	port             int
	routes           []string
}{
	{"backend", "http", 8080, []string{"r1"}},
	{"backend", "9090", 9090, []string{"r1"}},
	{"other", "", 10003, []string{"r2"}},
}

func randomOutEntries(r *rand.Rand, policy, top, topName string, conf func() any) []outEntry {
	var out []outEntry
	for i := range 1 + r.IntN(4) {
		e := outEntry{policy: policy, top: top, topName: topName, index: i, conf: conf()}
		switch k := r.IntN(6); {
		case top == resource.KindMeshHTTPRoute || k == 0:
			e.kind = resource.KindMesh
		case k <= 2:
			e.kind, e.name = resource.KindMeshService, "backend"
			e.section = []string{"", "", "http", "9090", "nope"}[r.IntN(5)]
		case k == 3:
			e.kind, e.name = resource.KindMeshService, "other"
		default:
			e.kind, e.name = resource.KindMeshHTTPRoute, []string{"r1", "r2"}[r.IntN(2)]
		}
		out = append(out, e)
	}
	return out
}

// outRank is the reference order of docs/policy.md#ordering for these
// entries: top-level kind, entry kind (a MeshService entry with a
// sectionName after one without), name (the smaller later), index.
func outRank(a, b outEntry) int {
	topRank := map[string]int{resource.KindMesh: 0, resource.KindMeshService: 4, resource.KindMeshHTTPRoute: 6}
	entryRank := func(e outEntry) int {
		r := 2 * map[string]int{resource.KindMesh: 0, resource.KindMeshService: 4, resource.KindMeshHTTPRoute: 6}[e.kind]
		if e.section != "" {
			r++
		}
		return r
	}
	return cmp.Or(cmp.Compare(topRank[a.top], topRank[b.top]), cmp.Compare(entryRank(a), entryRank(b)),
		cmp.Compare(b.policy, a.policy), cmp.Compare(a.index, b.index))
}

// TestPropertyOutboundsPortsAndRoutes: for random MeshTimeouts over two
// ports of a MeshService and two routes, every outbound's conf and origin
// is the forward merge of the entries Kuma 2.14 finds relevant to it (Mesh
// entries, entries naming the service, those naming its port), and every
// route's the merge of the Mesh entries, the entries naming the route and
// the entries of policies whose top-level targetRef is the route.
func TestPropertyOutboundsPortsAndRoutes(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(11, 12))
	reg := resource.NewDefaultRegistry()
	conf := func() any {
		c := map[string]any{}
		for _, k := range []string{"connectionTimeout", "idleTimeout"} {
			if r.IntN(2) == 0 {
				c[k] = fmt.Sprintf("%ds", 1+r.IntN(3))
			}
		}
		if r.IntN(2) == 0 {
			c["http"] = map[string]any{"requestTimeout": fmt.Sprintf("%ds", 1+r.IntN(3))}
		}
		return c
	}
	infra := outboundInfra(t)
	for i := range 1500 {
		var entries []outEntry
		resources := slices.Clone(infra)
		for p := range 1 + r.IntN(4) {
			name := fmt.Sprintf("p%d", p)
			top, topName := resource.KindMesh, ""
			topRef := map[string]any{"kind": resource.KindMesh}
			switch r.IntN(4) {
			case 0:
				top, topRef = resource.KindMeshService, map[string]any{"kind": resource.KindMeshService, "name": "web"}
			case 1:
				topName = []string{"r1", "r2"}[r.IntN(2)]
				top, topRef = resource.KindMeshHTTPRoute, map[string]any{"kind": resource.KindMeshHTTPRoute, "name": topName}
			}
			es := randomOutEntries(r, name, top, topName, conf)
			var to []any
			for _, e := range es {
				ref := map[string]any{"kind": e.kind}
				if e.name != "" {
					ref["name"] = e.name
				}
				if e.section != "" {
					ref["sectionName"] = e.section
				}
				to = append(to, map[string]any{"targetRef": ref, "default": e.conf})
			}
			entries = append(entries, es...)
			spec, _ := json.Marshal(map[string]any{"targetRef": topRef, "to": to})
			resources = append(resources, &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name, Spec: spec})
		}
		slices.SortStableFunc(entries, outRank)
		snap, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "z1", Resources: resources})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := snap.Config("web-1", "")
		if err != nil {
			t.Fatal(err)
		}
		for k, o := range outboundCase {
			got := cfg.Outbounds[k].Policies["MeshTimeout"]
			if got == nil {
				got = &OutboundPolicy{}
			}
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("case %d, outbound %s:%d, entries %+v:\n%s", i, o.service, o.port, entries, fmt.Sprintf(format, args...))
			}
			var confs []any
			var origins []string
			routeEntries := map[string][]outEntry{}
			for _, e := range entries {
				switch {
				case e.top == resource.KindMeshHTTPRoute:
					if slices.Contains(o.routes, e.topName) {
						routeEntries[e.topName] = append(routeEntries[e.topName], e)
					}
					continue
				case e.kind == resource.KindMeshHTTPRoute:
					if slices.Contains(o.routes, e.name) {
						routeEntries[e.name] = append(routeEntries[e.name], e)
					}
					continue
				case e.kind == resource.KindMesh,
					e.kind == resource.KindMeshService && e.name == o.service && (e.section == "" || e.section == o.section):
					confs = append(confs, e.conf)
					origins = append(origins, fmt.Sprintf("%s[%d]", e.policy, e.index))
				}
			}
			want := normalizeJSON(forwardFold(confs, nil))
			if len(confs) == 0 {
				want = nil
			}
			if gotConf := normalizeJSON(got.Conf); !reflect.DeepEqual(gotConf, want) {
				fail("conf %s, brute force %s", compact(gotConf), compact(want))
			}
			if len(confs) > 0 && !slices.Equal(originNames(got.Origin), origins) {
				fail("origin %v, brute force %v", originNames(got.Origin), origins)
			}
			var wantRoutes []string
			for _, route := range o.routes {
				if len(routeEntries[route]) > 0 {
					wantRoutes = append(wantRoutes, route)
				}
			}
			if len(got.Routes) != len(wantRoutes) {
				fail("%d routes, brute force %v", len(got.Routes), wantRoutes)
			}
			for j, route := range wantRoutes {
				var rconfs []any
				var rorigins []string
				for _, e := range entries {
					mesh := e.kind == resource.KindMesh && e.top != resource.KindMeshHTTPRoute
					if mesh || slices.ContainsFunc(routeEntries[route], func(x outEntry) bool { return x.policy == e.policy && x.index == e.index }) {
						rconfs = append(rconfs, e.conf)
						rorigins = append(rorigins, fmt.Sprintf("%s[%d]", e.policy, e.index))
					}
				}
				rc := got.Routes[j]
				if rc.Route.Name != route {
					fail("route %d is %s, want %s", j, rc.Route.Name, route)
				}
				if gotConf, want := normalizeJSON(rc.Conf), normalizeJSON(forwardFold(rconfs, nil)); !reflect.DeepEqual(gotConf, want) {
					fail("route %s conf %s, brute force %s", route, compact(gotConf), compact(want))
				}
				if !slices.Equal(originNames(rc.Origin), rorigins) {
					fail("route %s origin %v, brute force %v", route, originNames(rc.Origin), rorigins)
				}
			}
		}
	}
}

// outboundInfra is the case's MeshService, routes and Dataplane.
func outboundInfra(t *testing.T) []*resource.Resource {
	t.Helper()
	raw := []string{
		`{"type":"MeshService","mesh":"default","name":"backend","spec":{"ports":[{"port":8080,"name":"http","targetPort":8080},{"port":9090,"targetPort":9090}]}}`,
		`{"type":"MeshHTTPRoute","mesh":"default","name":"r1","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"rules":[{"matches":[{"path":{"type":"PathPrefix","value":"/a"}}],"default":{"backendRefs":[{"kind":"MeshService","name":"backend"}]}}]}]}}`,
		`{"type":"MeshHTTPRoute","mesh":"default","name":"r2","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"other"},"rules":[{"matches":[{"path":{"type":"PathPrefix","value":"/b"}}],"default":{"backendRefs":[{"kind":"MeshService","name":"other"}]}}]}]}}`,
		`{"type":"Dataplane","mesh":"default","name":"web-1","spec":{"networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"web"}}],"outbound":[` +
			`{"port":8080,"backendRef":{"kind":"MeshService","name":"backend","port":8080}},` +
			`{"port":9090,"backendRef":{"kind":"MeshService","name":"backend","port":9090}},` +
			`{"port":10003,"tags":{"kuma.io/service":"other"}}]}}}`,
	}
	var out []*resource.Resource
	for _, s := range raw {
		var r resource.Resource
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, &r)
	}
	return out
}
