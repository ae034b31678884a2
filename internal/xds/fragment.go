package xds

import (
	"crypto/sha256"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// Rendering again only what changed (docs/dataplane.md#xds). A rendering
// is made of fragments: a gRPC client's listener and routes for one
// service, an Envoy outbound listener, one cluster. Each fragment's inputs
// are summed up in a key: the engine's result ids of the outbound policies
// it reads (policy.OutboundPolicy.ResultID, unchanged when a change does
// not reach the outbound; compared only within the snapshots' lineage,
// which the rendering's context holds), the faults it injects. What every
// fragment reads (the proxy itself, the mesh's mTLS, its proxy-wide
// policies) is the rendering's context instead. Rendering a proxy again
// (Input.Previous), a fragment whose key is unchanged is not rendered: its
// resources are taken from the previous rendering with their digests (so
// they are neither built nor encoded again), and what it recorded (the
// policies behind its resources, what it left out, the clusters it named,
// the assignments it asked for) is replayed. After one policy change among
// 10,000, a proxy with 100 outbounds renders the one outbound the change
// reaches. A cluster's endpoints are not in its fragment: the assignment
// it asks for is taken from the rendering's shared assignments (cached per
// endpoints map), so a change of endpoints renders no fragment again.
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
	// assignments are the clusters' endpoints the fragment asked for:
	// taken from the rendering's shared assignments, which change with
	// the endpoints while the fragment stands.
	assignments []fragmentAssignment
	// escapes: the render reached beyond the fragment (a collector
	// cluster): it is not kept.
	escapes bool
}

// fragmentResource is one resource a fragment added: its list (in
// listTypes' order) and name. A fragment's resources of one list are
// contiguous in the rendering that holds it (placed.at).
type fragmentResource struct {
	list uint8
	name string
}

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

type fragmentAssignment struct {
	name string
	spec clusterSpec
	plan localityPlan
}

// fragmentState is what a rendering keeps for the next one: its fragments
// by id, and the context they were rendered in (a different context
// reuses none).
type fragmentState struct {
	context string
	// list holds the fragments in the order the rendering finished them;
	// the next rendering, which mostly asks for them in that order, finds
	// each at its cursor (prevFragment). A map of them by id per rendering
	// was a fifth of what rendering a proxy after a change allocated.
	list []placedFragment
}

// placedFragment is a fragment of a rendering with its id.
type placedFragment struct {
	id fragmentID
	placed
}

// placed is a fragment as a rendering holds it: where its resources of
// each list start in that rendering's lists (the next rendering finds
// them there, with their digests, without looking names up).
type placed struct {
	f  *fragment
	at [4]int32
}

// renderContext sums up what every fragment of a proxy depends on beyond
// its own key.
func (g *generator) renderContext(kind string) string {
	d := g.in.Dataplane
	var b strings.Builder
	// The engine's result ids, which fragment keys hold, compare within
	// a lineage of snapshots only.
	lineage := strconv.FormatUint(g.in.Config.Lineage(), 36)
	for _, s := range []string{kind, lineage, d.Mesh, d.Name, d.Namespace, d.Address, g.in.Zone, strconv.FormatBool(g.in.MTLS), g.in.AccessLogPipe} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, in := range d.Inbounds {
		b.WriteString(in.Address + ":" + strconv.Itoa(in.Port) + tagKey(in.Tags))
		b.WriteByte(0)
	}
	// Parts reference collectors by labels, which their keys do not say.
	b.WriteString(otelContext(g.in.OTelBackends))
	// Proxy-wide policies reach parts their keys do not name (MeshTrace
	// traces every Envoy outbound listener): one that changes renders the
	// proxy whole.
	types := slices.Sorted(maps.Keys(g.in.Config.Proxy))
	for _, typ := range types {
		ap := g.in.Config.Proxy[typ]
		b.WriteString(typ)
		b.WriteByte(0)
		b.Write(ap.Conf)
		for _, o := range ap.Origin {
			b.WriteByte(0)
			b.WriteString(refOf(o).String())
		}
		b.WriteByte(0)
	}
	return b.String()
}

// startFragments prepares the reuse of the previous rendering's
// fragments, when it was made in the same context. Endpoints are no part
// of a fragment (its assignments are asked for again), so a change of
// endpoints alone renders no fragment again.
func (g *generator) startFragments(kind string) {
	prev := g.in.Previous
	sized := 0 // the previous rendering's size: this one's, mostly
	if prev != nil && prev.fragments != nil {
		sized = len(prev.fragments.list)
	}
	g.out.fragments = &fragmentState{context: g.renderContext(kind), list: make([]placedFragment, 0, sized)}
	if prev == nil || prev.fragments == nil || prev.fragments.context != g.out.fragments.context {
		return
	}
	g.prev = prev
	// This rendering is about the size of the previous one: its lists
	// and maps are made at that size instead of grown to it.
	for i, list := range g.out.lists() {
		g.out.sums[i] = make([][sha256.Size]byte, 0, len(prev.sums[i]))
		*list = make([]types.Resource, 0, len(*prev.lists()[i]))
	}
	g.out.asked = make([]fragmentAssignment, 0, len(prev.asked))
}

// policiesKey sums up the outbound policies of svc by result id; ok is
// false when one has none.
func (g *generator) policiesKey(svc string) (string, bool) {
	o := g.outbound(svc)
	return o.key, o.keyed
}

// makePoliciesKey writes the key of policies in the rendering's scratch
// buffer, in type order, and allocates only the string it returns.
func (g *generator) makePoliciesKey(policies map[string]*policy.OutboundPolicy) (string, bool) {
	var typesArr [8]string
	types := typesArr[:0]
	for t := range policies {
		types = append(types, t)
	}
	slices.Sort(types)
	b := g.scratch[:0]
	for _, t := range types {
		id := policies[t].ResultID()
		if id == 0 {
			return "", false
		}
		b = append(b, t...)
		b = append(b, '=')
		b = strconv.AppendUint(b, id, 36)
		b = append(b, ';')
	}
	g.scratch = b
	return string(b), true
}

// fragmentID names a fragment within a rendering: its kind ("client",
// "cluster", "outbound") and the service, cluster name or port it is for.
// A struct, not a string: a rendering that replays its fragments makes no
// id strings.
type fragmentID struct {
	kind, name string
	port       int
}

// inFragment renders one fragment: replayed from the previous rendering
// when it has fragment id with key, else rendered by render and recorded.
// A nil key renders without keeping. key may be the rendering's key buffer
// (keyBuf): it is read before render runs, which may write that buffer.
func (g *generator) inFragment(id fragmentID, key []byte, render func() error) error {
	if key == nil || g.out.fragments == nil {
		return render()
	}
	if g.prev != nil {
		if p, ok := g.prevFragment(id); ok && p.f.key == string(key) {
			if at, ok := g.replay(p); ok {
				g.out.fragments.list = append(g.out.fragments.list, placedFragment{id, placed{p.f, at}})
				g.out.reused++
				return nil
			}
		}
	}
	rec := &fragment{key: string(key)}
	outer := g.rec
	g.rec = rec
	at := g.out.ends()
	err := render()
	g.rec = outer
	if err != nil {
		return err
	}
	for i, list := range g.out.lists() {
		for _, r := range (*list)[at[i]:] {
			rec.resources = append(rec.resources, fragmentResource{uint8(i), cachev3.GetResourceName(r)})
		}
	}
	if outer != nil {
		// Nested: what the inner fragment did, the outer one did too.
		outer.absorb(rec)
	}
	if !rec.escapes {
		g.out.fragments.list = append(g.out.fragments.list, placedFragment{id, placed{rec, at}})
	}
	return nil
}

// prevFragment finds fragment id of the previous rendering: at the
// cursor, or a few places on (fragments that rendering nested or dropped
// are not asked for again), else by an index of them made once.
func (g *generator) prevFragment(id fragmentID) (placed, bool) {
	list := g.prev.fragments.list
	for i := g.prevCursor; i < min(g.prevCursor+4, len(list)); i++ {
		if list[i].id == id {
			g.prevCursor = i + 1
			return list[i].placed, true
		}
	}
	if g.prevIndex == nil {
		g.prevIndex = make(map[fragmentID]int, len(list))
		for i, pf := range list {
			g.prevIndex[pf.id] = i
		}
	}
	i, ok := g.prevIndex[id]
	if !ok {
		return placed{}, false
	}
	g.prevCursor = i + 1
	return list[i].placed, true
}

// ends are the lengths of r's lists: where what is added next starts.
func (r *Resources) ends() [4]int32 {
	return [4]int32{int32(len(r.Listeners)), int32(len(r.Routes)), int32(len(r.Clusters)), int32(len(r.Endpoints))}
}

func (f *fragment) absorb(inner *fragment) {
	f.shapes = append(f.shapes, inner.shapes...)
	f.drops = append(f.drops, inner.drops...)
	f.carried = append(f.carried, inner.carried...)
	f.clusters = append(f.clusters, inner.clusters...)
	f.assignments = append(f.assignments, inner.assignments...)
	f.escapes = f.escapes || inner.escapes
}

// replay adds a previous fragment's resources (with their digests) and
// what it recorded, and returns where its resources start in this
// rendering; false, adding nothing, when the previous rendering does not
// hold them where the fragment says, with their digests.
func (g *generator) replay(p placed) ([4]int32, bool) {
	f := p.f
	prevLists := g.prev.lists()
	var k [4]int32
	for _, fr := range f.resources {
		pos := p.at[fr.list] + k[fr.list]
		k[fr.list]++
		items := *prevLists[fr.list]
		if int(pos) >= len(items) || cachev3.GetResourceName(items[pos]) != fr.name {
			return [4]int32{}, false
		}
		if _, known := g.prev.sum(int(fr.list), int(pos)); !known {
			return [4]int32{}, false
		}
	}
	at := g.out.ends()
	lists := g.out.lists()
	k = [4]int32{}
	for _, fr := range f.resources {
		pos := p.at[fr.list] + k[fr.list]
		k[fr.list]++
		d, _ := g.prev.sum(int(fr.list), int(pos))
		*lists[fr.list] = append(*lists[fr.list], (*prevLists[fr.list])[pos])
		g.out.setSum(int(fr.list), len(*lists[fr.list])-1, d)
	}
	g.out.shaped = append(g.out.shaped, f.shapes...)
	about := g.about
	for _, d := range f.drops {
		g.about = d.about
		g.dropText(d.text)
	}
	g.about = about
	g.out.carried = append(g.out.carried, f.carried...)
	for _, c := range f.clusters {
		g.addCluster(c.name, c.spec)
	}
	g.pending = append(g.pending, f.assignments...)
	if g.rec != nil {
		g.rec.absorb(f)
	}
	return at, true
}
