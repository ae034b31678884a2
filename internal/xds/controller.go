package xds

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// The controller keeps every connected proxy's resources current: after a
// change of its mesh's policies or Dataplanes, of the endpoints, or of the
// mesh's mTLS, the proxies of the meshes concerned are rendered again, and
// the server pushes the types whose resources changed.

// Sources are what the controller renders from. Every field is required.
type Sources struct {
	// Snapshot returns the current policy snapshot of a mesh; Changed is
	// closed at the next change of any mesh.
	Snapshot func(ctx context.Context, mesh string) (*policy.MeshSnapshot, error)
	Changed  func() <-chan struct{}
	// Endpoints returns a mesh's endpoints by service; EndpointsChanged
	// is closed at their next change.
	Endpoints        func(mesh string) map[string][]Endpoint
	EndpointsChanged func() <-chan struct{}
	// MTLS says whether a mesh's workloads use mTLS; MTLSChanged is
	// closed at its next change.
	MTLS        func(mesh string) bool
	MTLSChanged func() <-chan struct{}
	// SnapshotGen and ChangedSince, both set or both nil, let the
	// controller skip proxies a change does not touch: the snapshot with
	// the generation it reflects, and the keys changed between two
	// generations (ok false: unknown, every proxy is rendered).
	SnapshotGen  func(ctx context.Context, mesh string) (*policy.MeshSnapshot, uint64, error)
	ChangedSince func(mesh string, from, to uint64) (keys []resource.Key, ok bool)
}

// ControllerConfig wires a Controller.
type ControllerConfig struct {
	Server  *Server
	Sources Sources
	// Zone is this zone (the proxies' locality).
	Zone   string
	Logger hclog.Logger
	// Settle is how long changes settle before proxies are rendered;
	// 0 means 2 ms (a burst of writes costs one rendering).
	Settle time.Duration
	// ProgrammedChanged, when set, is called after a pass that changed
	// what some proxy leaves out (ProgrammedProblem's answers).
	ProgrammedChanged func()
}

// Controller renders connected proxies' resources. Run it once.
type Controller struct {
	cfg  ControllerConfig
	kick chan struct{}
	// last is what each node was rendered from: a node whose inputs did
	// not change is not rendered again.
	last map[string]renderedFrom
	// assignments are each mesh's shared load assignments, for the
	// endpoints they were built from; faults each mesh's destinations'
	// faults, for the snapshot they were built from.
	assignments map[string]*LoadAssignments
	faults      map[string]*Faults
	// otel are each mesh's MeshOpenTelemetryBackends, for the snapshot
	// they were read from.
	otel map[string]meshOTel
	// programmed aggregates what the renderings did with each policy.
	programmed *programmedIndex
	// reportedVersion is the programmed index's version ProgrammedChanged
	// was last called for.
	reportedVersion uint64
	// renders counts renderings (tests: untouched proxies are skipped),
	// reassigns the proxies given new endpoints alone.
	renders, reassigns int
	// ids, connected and meshes are a pass's connected nodes (by mesh),
	// node ids and meshes, kept for the next pass.
	ids       []Identity
	connected map[string]bool
	meshes    map[string]bool
}

type renderedFrom struct {
	id          Identity // who was rendered, as which kind of proxy
	snap        *policy.MeshSnapshot
	gen         uint64 // snap's generation (0: unknown)
	endpoints   map[string][]Endpoint
	mtls        bool
	assignments *LoadAssignments // of endpoints; nil renders them per proxy
	faults      *Faults          // of snap
	otel        []OTelBackend    // of snap
}

// NewController checks cfg.
func NewController(cfg ControllerConfig) (*Controller, error) {
	s := cfg.Sources
	if cfg.Server == nil || s.Snapshot == nil || s.Changed == nil || s.Endpoints == nil || s.EndpointsChanged == nil ||
		s.MTLS == nil || s.MTLSChanged == nil {
		return nil, errors.New("xds controller: Server and every source are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * time.Millisecond
	}
	return &Controller{cfg: cfg, kick: make(chan struct{}, 1), last: map[string]renderedFrom{},
		assignments: map[string]*LoadAssignments{}, faults: map[string]*Faults{}, otel: map[string]meshOTel{},
		connected: map[string]bool{}, meshes: map[string]bool{},
		programmed: newProgrammedIndex()}, nil
}

// Kick asks for a rendering soon (a node connected).
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run renders until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	for {
		s := c.cfg.Sources
		changed, endpoints, mtls := s.Changed(), s.EndpointsChanged(), s.MTLSChanged()
		c.renderAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-endpoints:
		case <-mtls:
		case <-c.kick:
		}
		t := time.NewTimer(c.cfg.Settle)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// renderAll renders the connected proxies whose inputs changed.
func (c *Controller) renderAll(ctx context.Context) {
	// A pass runs after every change (during a burst of joins, hundreds
	// of times a second): its lists are kept from one pass to the next.
	c.ids = c.cfg.Server.appendConnected(c.ids)
	clear(c.connected)
	clear(c.meshes)
	for _, id := range c.ids {
		c.connected[id.NodeID] = true
		c.meshes[id.Mesh] = true
	}
	for node, last := range c.last {
		if !c.connected[node] {
			delete(c.last, node)
			c.programmed.forget(last.id)
		}
	}
	for mesh := range c.assignments {
		if !c.meshes[mesh] {
			delete(c.assignments, mesh)
			delete(c.faults, mesh)
			delete(c.otel, mesh)
		}
	}
	for rest := c.ids; len(rest) > 0; {
		mesh := rest[0].Mesh
		n := 1
		for n < len(rest) && rest[n].Mesh == mesh {
			n++
		}
		ids := rest[:n]
		rest = rest[n:]
		snap, gen, err := c.snapshot(ctx, mesh)
		if err != nil {
			c.cfg.Logger.Warn("policy snapshot for xDS", "mesh", mesh, "error", err)
			continue
		}
		from := renderedFrom{snap: snap, gen: gen, endpoints: c.cfg.Sources.Endpoints(mesh), mtls: c.cfg.Sources.MTLS(mesh)}
		touched := newTouchedSet(c, mesh, snap, gen)
		from.assignments = c.sharedAssignments(mesh, from.endpoints)
		if f := c.faults[mesh]; f == nil || f.snap != snap {
			c.faults[mesh] = NewFaults(snap)
		}
		from.faults = c.faults[mesh]
		if o := c.otel[mesh]; o.snap != snap {
			c.otel[mesh] = meshOTel{snap, otelBackendsOf(snap)}
		}
		from.otel = c.otel[mesh].backends
		for _, id := range ids {
			if last, ok := c.last[id.NodeID]; ok && last.mtls == from.mtls &&
				last.id.Kind == id.Kind && last.id.AccessLogPipe == id.AccessLogPipe &&
				(last.snap == from.snap || !touched.touches(id, last)) {
				// The policy change, if any, is not this proxy's: its
				// resources stand, and the next change is counted from
				// this snapshot.
				last.snap, last.gen, last.faults, last.otel = from.snap, from.gen, from.faults, from.otel
				if sameEndpoints(last.endpoints, from.endpoints) {
					c.last[id.NodeID] = last
					continue
				}
				if sameServices(last.endpoints, from.endpoints) {
					// Instances came or went: the proxy's endpoints are
					// taken again, nothing else is rendered.
					done, err := c.reassign(ctx, id, from)
					if err != nil {
						c.cfg.Logger.Warn("updating a proxy's endpoints", "node", id.NodeID, "error", err)
						continue
					}
					if done {
						last.endpoints, last.assignments = from.endpoints, from.assignments
						c.last[id.NodeID] = last
						continue
					}
				}
			}
			if err := c.render(ctx, id, from); err != nil {
				c.cfg.Logger.Warn("rendering a proxy's xDS resources", "node", id.NodeID, "error", err)
				continue
			}
			from.id = id
			c.last[id.NodeID] = from
		}
	}
	if v := c.programmed.versionNow(); v != c.reportedVersion && c.cfg.ProgrammedChanged != nil {
		c.reportedVersion = v
		c.cfg.ProgrammedChanged()
	}
}

// snapshot is mesh's current snapshot, with its generation when the
// sources tell it.
func (c *Controller) snapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, uint64, error) {
	if c.cfg.Sources.SnapshotGen != nil {
		return c.cfg.Sources.SnapshotGen(ctx, mesh)
	}
	snap, err := c.cfg.Sources.Snapshot(ctx, mesh)
	return snap, 0, err
}

// touchedSet decides, for one pass over a mesh, which proxies the changes
// since their last rendering touch (docs/dataplane.md#xds). It is
// conservative: a change it cannot place touches every proxy.
//   - a Dataplane touches itself, and every proxy when the mesh has
//     MeshFaultInjection policies (clients inject their destinations') or
//     when the mesh's services changed (implicit outbounds);
//   - a policy touches the Dataplanes it selects, before and after the
//     change (MatchedDataplanes); a MeshHTTPRoute or a MeshFaultInjection
//     touches every proxy (other policies target routes; faults are
//     injected by the callers);
//   - anything else (services, gateways, a policy the snapshots do not
//     know) touches every proxy.
type touchedSet struct {
	c       *Controller
	mesh    string
	snap    *policy.MeshSnapshot
	gen     uint64
	matched map[matchedKey]map[string]bool // a nil entry: the snapshot does not hold the policy
	// since are the changes after each generation the proxies were last
	// rendered at (most share one), asked once.
	since map[uint64]changedKeys
}

type changedKeys struct {
	keys []resource.Key
	ok   bool
}

type matchedKey struct {
	key  resource.Key
	snap *policy.MeshSnapshot
}

func newTouchedSet(c *Controller, mesh string, snap *policy.MeshSnapshot, gen uint64) *touchedSet {
	return &touchedSet{c: c, mesh: mesh, snap: snap, gen: gen, matched: map[matchedKey]map[string]bool{}}
}

// touches says whether the changes between last's snapshot and this one
// may change what id gets.
func (t *touchedSet) touches(id Identity, last renderedFrom) bool {
	if t.c.cfg.Sources.ChangedSince == nil || last.gen == 0 || t.gen == 0 {
		return true
	}
	ch, asked := t.since[last.gen]
	if !asked {
		ch.keys, ch.ok = t.c.cfg.Sources.ChangedSince(t.mesh, last.gen, t.gen)
		if t.since == nil {
			t.since = map[uint64]changedKeys{}
		}
		t.since[last.gen] = ch
	}
	keys, ok := ch.keys, ch.ok
	if !ok {
		return true
	}
	proxy := nsName(id.Namespace, id.Name)
	for _, k := range keys {
		if k.Type == "Dataplane" {
			// A Dataplane touches itself; every proxy when clients
			// inject faults, or when the mesh's services changed (they
			// are the implicit outbounds, docs/policy.md#outbounds).
			if nsName(t.snap.NormalizeNamespace(k.Namespace), k.Name) == proxy ||
				t.snap.HasPolicies("MeshFaultInjection") || last.snap.HasPolicies("MeshFaultInjection") ||
				!slices.Equal(t.snap.ServiceNames(), last.snap.ServiceNames()) {
				return true
			}
			continue
		}
		if k.Type == "MeshHTTPRoute" || k.Type == "MeshFaultInjection" {
			return true
		}
		now, knownNow := t.selected(k, t.snap)
		before, knownBefore := t.selected(k, last.snap)
		if (!knownNow && !knownBefore) || now[proxy] || before[proxy] {
			return true
		}
	}
	return false
}

// selected are the Dataplanes a policy selects in s (namespace/name);
// known is false when s does not hold it.
func (t *touchedSet) selected(k resource.Key, s *policy.MeshSnapshot) (map[string]bool, bool) {
	mk := matchedKey{k, s}
	if sel, ok := t.matched[mk]; ok {
		return sel, sel != nil
	}
	dps, err := s.MatchedDataplanes(k.Type, k.Name, k.Namespace)
	if err != nil {
		// Not a policy s holds: created or deleted (the other snapshot
		// says whom it selects), or not a policy at all (when neither
		// knows it, every proxy is touched).
		t.matched[mk] = nil
		return nil, false
	}
	sel := make(map[string]bool, len(dps))
	for _, d := range dps {
		sel[nsName(s.NormalizeNamespace(d.Namespace), d.Name)] = true
	}
	t.matched[mk] = sel
	return sel, true
}

func nsName(ns, name string) string { return ns + "/" + name }

// sharedAssignments are mesh's load assignments of endpoints, built again
// when the endpoints changed.
func (c *Controller) sharedAssignments(mesh string, endpoints map[string][]Endpoint) *LoadAssignments {
	if a := c.assignments[mesh]; a != nil && sameEndpoints(a.endpoints, endpoints) {
		return a
	}
	a := NewLoadAssignments(endpoints, c.cfg.Zone)
	if prev := c.assignments[mesh]; prev != nil {
		a.carryFrom(prev)
	}
	c.assignments[mesh] = a
	return a
}

// sameEndpoints: the same services, each with the very same slice
// (Endpoints hands out new slices on every change).
func sameEndpoints(a, b map[string][]Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !sameSlice(v, w) {
			return false
		}
	}
	return true
}

// sameServices: the same services, each with the same protocol
// (protocolOf), so that a rendering from b differs from one from a in
// its endpoints only.
func sameServices(a, b map[string][]Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok {
			return false
		}
		if (len(v) == 0 || len(w) == 0 || &v[0] != &w[0]) && protocolOf(v) != protocolOf(w) {
			return false
		}
	}
	return true
}

// reassign gives id's proxy its current resources with every cluster's
// endpoints taken from from's assignments; false when its resources do
// not tell them (it is rendered instead).
func (c *Controller) reassign(ctx context.Context, id Identity, from renderedFrom) (bool, error) {
	cur := c.cfg.Server.current(id.NodeID)
	if cur == nil || from.assignments == nil {
		return false, nil
	}
	out, ok, err := cur.withAssignments(from.assignments)
	if err != nil || !ok {
		return false, err
	}
	c.reassigns++
	if out == cur {
		return true, nil // none of its services' endpoints changed
	}
	return true, c.cfg.Server.Set(ctx, id.NodeID, out)
}

// render computes one proxy's resources and hands them to the server.
func (c *Controller) render(ctx context.Context, id Identity, from renderedFrom) error {
	c.renders++
	out, err := c.generate(id, from, c.cfg.Server.current(id.NodeID))
	if err != nil || out == nil {
		c.programmed.forget(id)
		return err
	}
	c.programmed.set(id, out.Touched)
	return c.cfg.Server.Set(ctx, id.NodeID, out)
}

// ProgrammedProblem is the policy's Programmed condition when it is
// False: what a zone reports to the global (docs/dataplane.md#programmed).
// Only policies some proxy leaves part of out are looked at, so a report of
// 100,000 policies costs a lookup each.
func (c *Controller) ProgrammedProblem(snap *policy.MeshSnapshot, mesh, policyType, name, namespace string) (policy.Condition, bool) {
	if !c.programmed.has(mesh, PolicyRef{Type: policyType, Name: name, Namespace: namespace}) {
		return policy.Condition{}, false
	}
	cond, ok := c.Programmed(snap, mesh, policyType, name, namespace)
	if !ok || cond.Status != "False" {
		return policy.Condition{}, false
	}
	return cond, true
}

// Programmed is the Programmed condition of a policy of mesh (namespace ""
// for the system namespace) in snap; false when there is nothing to say.
func (c *Controller) Programmed(snap *policy.MeshSnapshot, mesh, policyType, name, namespace string) (policy.Condition, bool) {
	if !c.cfg.Server.anyConnected() && c.programmed.empty() {
		return policy.Condition{}, false // no proxy: nothing to say, and no selection to compute
	}
	selected := 0
	if snap != nil {
		if dps, err := snap.MatchedDataplanes(policyType, name, namespace); err == nil {
			for _, d := range dps {
				if c.cfg.Server.isConnected(NodeID(mesh, d.Name, snap.NormalizeNamespace(d.Namespace))) {
					selected++
				}
			}
		}
	}
	return c.programmed.condition(mesh, PolicyRef{Type: policyType, Name: name, Namespace: namespace}, selected)
}

// Proxy kinds a Dataplane is rendered for (docs/dataplane.md).
const (
	ProxyGRPC  = "grpc"
	ProxyEnvoy = "envoy"
)

// generate renders a proxy's resources from inputs, for the kind it
// connected as; nil when its Dataplane is not (yet) in the snapshot (an
// agent that joined a moment ago).
func (c *Controller) generate(id Identity, from renderedFrom, prev *Resources) (*Resources, error) {
	kind := id.Kind
	if kind == "" {
		kind = ProxyGRPC
	}
	return c.generateFor(kind, id, from, prev)
}

// generateFor renders id's proxy as kind; prev, when set, is its previous
// rendering, whose unchanged parts are reused (fragment.go).
func (c *Controller) generateFor(kind string, id Identity, from renderedFrom, prev *Resources) (*Resources, error) {
	res := from.snap.Dataplane(id.Name, id.Namespace)
	if res == nil {
		return nil, nil
	}
	var err error
	var dp *Dataplane
	if prev != nil && prev.parsed.res == res && prev.parsed.namespace == id.Namespace {
		dp = prev.parsed.dp // the same resource: parsed by the last rendering
	} else if dp, err = ParseDataplane(res, id.Namespace); err != nil {
		return nil, err
	}
	cfg, err := from.snap.Config(id.Name, id.Namespace)
	if err != nil {
		return nil, err
	}
	in := Input{Dataplane: dp, Zone: c.cfg.Zone, Config: cfg, Endpoints: from.endpoints, MTLS: from.mtls,
		LoadAssignments: from.assignments, Faults: from.faults, AccessLogPipe: id.AccessLogPipe, OTelBackends: from.otel, Previous: prev}
	generate := Generate
	if kind == ProxyEnvoy {
		generate = GenerateEnvoy
	}
	out, err := generate(in)
	if err != nil {
		return nil, err
	}
	out.parsed = parsedDataplane{res: res, namespace: id.Namespace, dp: dp}
	return out, nil
}

// Inspect renders what a Dataplane's proxy of kind (ProxyGRPC,
// ProxyEnvoy) gets from the current inputs, as the controller would (for
// `_xds`, connected or not). namespace is "" for the system namespace.
func (c *Controller) Inspect(ctx context.Context, kind, mesh, name, namespace string) (*Resources, error) {
	snap, err := c.cfg.Sources.Snapshot(ctx, mesh)
	if err != nil {
		return nil, err
	}
	return c.InspectWith(snap, kind, mesh, name, namespace)
}

// InspectWith is Inspect from another snapshot of the mesh than the
// current one (the shadow view, docs/dataplane.md#shadow).
func (c *Controller) InspectWith(snap *policy.MeshSnapshot, kind, mesh, name, namespace string) (*Resources, error) {
	s := c.cfg.Sources
	id := Identity{NodeID: NodeID(mesh, name, namespace), Mesh: mesh, Name: name, Namespace: namespace}
	if c.cfg.Server != nil {
		if last, ok := c.cfg.Server.lastIdentity(id.NodeID); ok {
			// What the node's metadata told the zone (its access log pipe).
			id.AccessLogPipe = last.AccessLogPipe
		}
	}
	out, err := c.generateFor(kind, id, renderedFrom{snap: snap, endpoints: s.Endpoints(mesh), mtls: s.MTLS(mesh), faults: NewFaults(snap),
		otel: otelBackendsOf(snap)}, nil)
	if err == nil && out == nil {
		err = fmt.Errorf("%w: Dataplane %s in mesh %s", policy.ErrNotFound, name, mesh)
	}
	return out, err
}

// meshOTel are a mesh's MeshOpenTelemetryBackends as snap holds them.
type meshOTel struct {
	snap     *policy.MeshSnapshot
	backends []OTelBackend
}

func otelBackendsOf(snap *policy.MeshSnapshot) []OTelBackend {
	return otelBackends(snap.Infrastructure("MeshOpenTelemetryBackend"))
}
