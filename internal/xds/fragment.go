package xds

import (
	"crypto/sha256"
	"slices"
	"strconv"
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// Rendering again only what changed (docs/dataplane.md#xds). A rendering
// is made of fragments: a gRPC client's listener and routes for one
// service, an Envoy outbound listener, one cluster and its endpoints. Each
// fragment's inputs are summed up in a key: the engine's result ids of the
// outbound policies it reads (policy.OutboundPolicy.ResultID, unchanged
// when a change does not reach the outbound), the faults it injects, the
// cluster's endpoints. Rendering a proxy again (Input.Previous), a
// fragment whose key is unchanged is not rendered: its resources are taken
// from the previous rendering with their digests (so they are neither
// built nor encoded again), and what it recorded (the policies behind its
// resources, what it left out, the clusters it named) is replayed. After
// one policy change among 10,000, a proxy with 100 outbounds renders the
// one outbound the change reaches.
//
// A fragment is not kept when its key cannot be told (a legacy policy, an
// engine result without id) or when it reaches beyond itself (an Envoy
// observability backend's cluster); a proxy with a MeshProxyPatch renders
// whole, since patches apply to the finished resources.

// fragment is what one part of a rendering added and recorded.
type fragment struct {
	key       string
	resources []fragmentResource
	shapes    []fragmentShape
	drops     []fragmentDrop
	carried   [][]policy.Origin
	clusters  []fragmentCluster
	// escapes: the render reached beyond the fragment (a collector
	// cluster): it is not kept.
	escapes bool
}

type fragmentResource struct{ typeURL, name string }

type fragmentShape struct {
	typeURL, name string
	lists         [][]policy.Origin
}

type fragmentDrop struct {
	text  string
	about []policy.Origin
}

type fragmentCluster struct {
	name string
	spec clusterSpec
}

// fragmentState is what a rendering keeps for the next one: its fragments
// by id, and the context they were rendered in (a different context
// reuses none).
type fragmentState struct {
	context     string
	assignments *LoadAssignments
	byID        map[string]*fragment
}

// renderContext sums up what every fragment of a proxy depends on beyond
// its own key.
func (g *generator) renderContext(kind string) string {
	d := g.in.Dataplane
	var b strings.Builder
	for _, s := range []string{kind, d.Mesh, d.Name, d.Namespace, d.Address, g.in.Zone, strconv.FormatBool(g.in.MTLS), g.in.AccessLogPipe} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, in := range d.Inbounds {
		b.WriteString(in.Address + ":" + strconv.Itoa(in.Port) + tagKey(in.Tags))
		b.WriteByte(0)
	}
	return b.String()
}

// startFragments prepares the reuse of the previous rendering's
// fragments, when it was made in the same context from the same shared
// endpoints.
func (g *generator) startFragments(kind string) {
	prev := g.in.Previous
	sized := 0 // the previous rendering's size: this one's, mostly
	if prev != nil && prev.fragments != nil {
		sized = len(prev.fragments.byID)
	}
	g.out.fragments = &fragmentState{context: g.renderContext(kind), assignments: g.in.LoadAssignments, byID: make(map[string]*fragment, sized)}
	if prev == nil || prev.fragments == nil || g.in.LoadAssignments == nil ||
		prev.fragments.context != g.out.fragments.context || prev.fragments.assignments != g.in.LoadAssignments {
		return
	}
	g.prev = prev
	g.out.digests = make(map[string]map[string][sha256.Size]byte, len(prev.digests))
	for typeURL, ds := range prev.digests {
		g.out.digests[typeURL] = make(map[string][sha256.Size]byte, len(ds))
	}
}

// policiesKey sums up the outbound policies of svc by result id; ok is
// false when one has none.
func (g *generator) policiesKey(svc string) (string, bool) {
	if k, ok := g.policyKeys[svc]; ok {
		return k.key, k.ok
	}
	key, ok := g.makePoliciesKey(svc)
	if g.policyKeys == nil {
		g.policyKeys = map[string]policyKey{}
	}
	g.policyKeys[svc] = policyKey{key, ok}
	return key, ok
}

func (g *generator) makePoliciesKey(svc string) (string, bool) {
	policies := g.outboundPolicies(svc)
	types := make([]string, 0, len(policies))
	for t := range policies {
		types = append(types, t)
	}
	slices.Sort(types)
	var b strings.Builder
	for _, t := range types {
		id := policies[t].ResultID()
		if id == 0 {
			return "", false
		}
		b.WriteString(t)
		b.WriteByte('=')
		b.WriteString(strconv.FormatUint(id, 36))
		b.WriteByte(';')
	}
	return b.String(), true
}

// inFragment renders one fragment: replayed from the previous rendering
// when it has fragment id with key, else rendered by render and recorded.
// key "" renders without keeping.
func (g *generator) inFragment(id, key string, render func() error) error {
	if key == "" || g.out.fragments == nil {
		return render()
	}
	if g.prev != nil {
		if f := g.prev.fragments.byID[id]; f != nil && f.key == key && g.replay(f) {
			g.out.fragments.byID[id] = f
			g.out.reused++
			return nil
		}
	}
	rec := &fragment{key: key}
	outer := g.rec
	g.rec = rec
	lens := [4]int{len(g.out.Listeners), len(g.out.Routes), len(g.out.Clusters), len(g.out.Endpoints)}
	err := render()
	g.rec = outer
	if err != nil {
		return err
	}
	for i, list := range [][]types.Resource{g.out.Listeners, g.out.Routes, g.out.Clusters, g.out.Endpoints} {
		for _, r := range list[lens[i]:] {
			rec.resources = append(rec.resources, fragmentResource{fragmentTypes[i], cachev3.GetResourceName(r)})
		}
	}
	if outer != nil {
		// Nested: what the inner fragment did, the outer one did too.
		outer.absorb(rec)
	}
	if !rec.escapes {
		g.out.fragments.byID[id] = rec
	}
	return nil
}

// fragmentTypes are the type URLs of Resources' four lists, in order.
var fragmentTypes = [4]string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType}

func (f *fragment) absorb(inner *fragment) {
	f.shapes = append(f.shapes, inner.shapes...)
	f.drops = append(f.drops, inner.drops...)
	f.carried = append(f.carried, inner.carried...)
	f.clusters = append(f.clusters, inner.clusters...)
	f.escapes = f.escapes || inner.escapes
}

// replay adds a previous fragment's resources (with their digests) and
// what it recorded; false, adding nothing, when the previous rendering
// lacks one of its resources.
func (g *generator) replay(f *fragment) bool {
	if g.prevIndex == nil {
		prev := g.prev
		g.prevIndex = make(map[fragmentResource]types.Resource, len(prev.Listeners)+len(prev.Routes)+len(prev.Clusters)+len(prev.Endpoints))
		for i, list := range [][]types.Resource{g.prev.Listeners, g.prev.Routes, g.prev.Clusters, g.prev.Endpoints} {
			for _, r := range list {
				g.prevIndex[fragmentResource{fragmentTypes[i], cachev3.GetResourceName(r)}] = r
			}
		}
	}
	found := make([]types.Resource, len(f.resources))
	digests := make([][sha256.Size]byte, len(f.resources))
	for i, fr := range f.resources {
		r, ok := g.prevIndex[fr]
		d, known := g.prev.digests[fr.typeURL][fr.name]
		if !ok || !known {
			return false
		}
		found[i], digests[i] = r, d
	}
	for i, fr := range f.resources {
		switch fr.typeURL {
		case resourcev3.ListenerType:
			g.out.Listeners = append(g.out.Listeners, found[i])
		case resourcev3.RouteType:
			g.out.Routes = append(g.out.Routes, found[i])
		case resourcev3.ClusterType:
			g.out.Clusters = append(g.out.Clusters, found[i])
		case resourcev3.EndpointType:
			g.out.Endpoints = append(g.out.Endpoints, found[i])
		}
		g.out.digest(fr.typeURL, fr.name, digests[i])
	}
	for _, s := range f.shapes {
		g.out.shape(s.typeURL, s.name, s.lists)
	}
	about := g.about
	for _, d := range f.drops {
		g.about = d.about
		g.dropText(d.text)
	}
	g.about = about
	g.out.carried = append(g.out.carried, f.carried...)
	for _, c := range f.clusters {
		g.clusters[c.name] = c.spec
	}
	if g.rec != nil {
		g.rec.absorb(f)
	}
	return true
}
