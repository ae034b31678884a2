// Package policyview keeps the zone's policy engine inputs current: it follows
// the store's mesh-scoped resources through one watch and hands out immutable
// policy.MeshSnapshots, rebuilt lazily per mesh when a change touched that
// mesh. Repeated reads of an unchanged mesh reuse the same snapshot (and its
// memos); a rebuild starts from the previous snapshot and the changes since
// (policy.Inputs.Changes), so its cost follows what changed. The view keeps
// no copy of the resources: only the changes since the last build, which
// that build consumes (the snapshot keeps what it needs of each). One
// background loop keeps policy statuses (for reads and for the zone's report
// to the global) current after changes settle.
package policyview

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Store is what the view reads.
type Store interface {
	List(ctx context.Context, opts storage.ListOptions) (*storage.ListResult, error)
	Watch(ctx context.Context, from uint64) (<-chan storage.Event, error)
	Revision(ctx context.Context) (uint64, error)
}

// Config wires a View. Registry, Store and Plane (a zone) are required.
type Config struct {
	Registry *resource.Registry
	Store    Store
	Plane    plane.Plane
	Logger   hclog.Logger
	// Decorate, when set, adds to a status of the report to the global
	// what is known beside the engine (a data plane's Programmed
	// condition); call DecorationsChanged when its answers change.
	Decorate func(snap *policy.MeshSnapshot, st *policy.GlobalPolicyStatus)
}

// View is safe for concurrent use.
type View struct {
	cfg Config

	mu      sync.Mutex
	changed *sync.Cond // signalled whenever applied advances
	applied uint64     // store revision the view reflects
	loaded  bool
	runErr  error
	meshes  map[string]*meshState
	builds  int // snapshots built, for tests and metrics
	// fromChanges counts the builds made from the previous snapshot and
	// the changes since, for tests.
	fromChanges int
	building    map[string]chan struct{}

	// statusKick wakes the status loop (runStatuses) after every applied
	// change; statusWake when a status read finds its mesh stale. Only
	// changes hold a recompute back while they keep coming (settle): a
	// client polling a stale status must not.
	statusKick, statusWake chan struct{}
	// decorations counts DecorationsChanged calls: a report is made again
	// when they moved, even with the same statuses.
	decorations uint64
	// reporting is set by RunStatusReports: every mesh's statuses are then
	// kept current and reported, read or not.
	reporting bool
	// report is the latest status report of the global's policies, by
	// mesh in name order (published: there was one).
	report        []reportMesh
	published     bool
	reportChanged chan struct{}
	// sumSeed seeds the report fingerprints (statusSum).
	sumSeed maphash.Seed
	// statusRuns counts status recomputes of a mesh: the status loop
	// tells a pass that computed from one that found all current (tests
	// read it too).
	statusRuns int
	// next is closed at the next change of any mesh (Changed).
	next chan struct{}
}

// meshState is what the view knows of one mesh. generation bumps on every
// change so a snapshot built from an older generation is never cached over a
// newer one.
type meshState struct {
	generation uint64
	snapshot   *policy.MeshSnapshot
	snapGen    uint64

	// pending are the changes since the snapshot last handed out for a
	// build (snapshot, or the one being built from it): by key, the
	// resource now, nil when deleted. The next build starts from that
	// snapshot and these changes (policy.Inputs.Changes), which at 100,000
	// policies costs what changed instead of what is there. whole says
	// there is no such snapshot (none built yet, or one failed): pending
	// then holds every resource of the mesh, and the next build is made
	// from them. A zone's view used to mirror every resource besides: at
	// 100,000 policies 28 MB of a 106 MB heap, which the snapshot's parses
	// made redundant.
	pending map[resource.Key]*resource.Resource
	whole   bool
	// lost says pending cannot be trusted (a build failed and so did its
	// reload): the next build reloads the mesh from the store first.
	lost bool

	// Policy statuses (StatusSnapshot): the last snapshot whose statuses
	// were computed, and the generation it reflects. Only the status loop
	// and a mesh's first status read write them.
	statusSnap *policy.MeshSnapshot
	statusGen  uint64

	// changes are the keys of the last changes, by the generation they
	// made (ChangedSince), oldest first, at most maxChangeLog.
	changes []changedKey
}

// changedKey is one change: the generation it made and its key.
type changedKey struct {
	gen uint64
	key resource.Key
}

// maxChangeLog bounds each mesh's change log: a reader further behind
// than that is told to start over (ChangedSince's ok is false).
const maxChangeLog = 4096

// note records that the resource of key is now r (nil: deleted).
func (m *meshState) note(key resource.Key, r *resource.Resource) {
	if isShadow(r) {
		r = nil // not applied: shown in the shadow view only
	}
	if r == nil && m.whole {
		delete(m.pending, key)
		return
	}
	m.pending[key] = r
}

// takeInputs hands out m's current generation for a build: the previous
// snapshot and the changes since, or every resource when there is no such
// snapshot. Changes count from the snapshot that build makes on.
func (m *meshState) takeInputs() buildInputs {
	in := buildInputs{gen: m.generation}
	if m.whole {
		in.resources = make([]*resource.Resource, 0, len(m.pending))
		for _, r := range m.pending {
			in.resources = append(in.resources, r)
		}
	} else {
		in.prev, in.changes = m.snapshot, &policy.Changes{}
		for k, r := range m.pending {
			if r == nil {
				in.changes.Deleted = append(in.changes.Deleted, k)
			} else {
				in.changes.Put = append(in.changes.Put, r)
			}
		}
	}
	m.pending, m.whole = map[resource.Key]*resource.Resource{}, false
	return in
}

// StatusDebounce is how long the view waits after a change before it
// recomputes a mesh's policy statuses in the background, so that a burst of
// writes costs one recompute.
const StatusDebounce = 100 * time.Millisecond

// New checks cfg. Call Run to start following the store.
func New(cfg Config) (*View, error) {
	if cfg.Registry == nil || cfg.Store == nil {
		return nil, errors.New("policyview: Registry and Store are required")
	}
	if err := cfg.Plane.Check(); err != nil || !cfg.Plane.IsZone() {
		return nil, fmt.Errorf("policyview: Plane must be a zone (%v)", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	v := &View{cfg: cfg, meshes: map[string]*meshState{}, building: map[string]chan struct{}{}, next: make(chan struct{}),
		statusKick: make(chan struct{}, 1), statusWake: make(chan struct{}, 1), sumSeed: maphash.MakeSeed()}
	v.changed = sync.NewCond(&v.mu)
	return v, nil
}

// Run loads every relevant resource, then applies the store's watch until ctx
// ends. It returns the error that stopped it (nil on ctx end).
func (v *View) Run(ctx context.Context) error {
	statusesDone := make(chan struct{})
	go func() {
		defer close(statusesDone)
		v.runStatuses(ctx)
	}()
	defer func() { <-statusesDone }()
	err := v.run(ctx)
	v.mu.Lock()
	if err == nil {
		err = ctx.Err()
	}
	v.runErr = fmt.Errorf("policy view stopped: %w", err)
	v.changed.Broadcast()
	v.mu.Unlock()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (v *View) run(ctx context.Context) error {
	// Revision first, then the lists: anything written in between is
	// replayed by the watch, and applying a newer state twice is harmless.
	rev, err := v.cfg.Store.Revision(ctx)
	if err != nil {
		return err
	}
	if err := v.loadAll(ctx, rev); err != nil {
		return err
	}
	events, err := v.cfg.Store.Watch(ctx, rev)
	if err != nil {
		return err
	}
	for ev := range events {
		v.apply(ev)
	}
	return ctx.Err()
}

// relevant says whether a type feeds the engine: the mesh-scoped types
// but the control plane's own (certificate requests, endpoint summaries),
// whose frequent changes would rebuild snapshots for nothing.
func (v *View) relevant(typeName string) bool {
	d, ok := v.cfg.Registry.Lookup(typeName)
	return ok && d.Scope == resource.ScopeMesh && !d.SystemOnly
}

func (v *View) loadAll(ctx context.Context, rev uint64) error {
	meshes := map[string]*meshState{}
	if err := v.list(ctx, "", func(r *resource.Resource) { meshOf(meshes, r.Mesh).note(r.Key(), r) }); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.meshes = meshes
	v.applied = rev
	v.loaded = true
	close(v.next)
	v.next = make(chan struct{})
	v.changed.Broadcast()
	v.kickStatuses()
	return nil
}

// list calls fn with every resource of the relevant types in the store, of
// mesh ("" for every mesh).
func (v *View) list(ctx context.Context, mesh string, fn func(*resource.Resource)) error {
	for _, name := range v.cfg.Registry.Names() {
		if !v.relevant(name) {
			continue
		}
		res, err := v.cfg.Store.List(ctx, storage.ListOptions{Type: name, Mesh: mesh})
		if err != nil {
			return fmt.Errorf("load %s: %w", name, err)
		}
		for _, r := range res.Items {
			fn(r)
		}
	}
	return nil
}

func meshOf(meshes map[string]*meshState, mesh string) *meshState {
	m := meshes[mesh]
	if m == nil {
		m = &meshState{pending: map[resource.Key]*resource.Resource{}, whole: true}
		meshes[mesh] = m
	}
	return m
}

func (v *View) apply(ev storage.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ev.Revision > v.applied {
		v.applied = ev.Revision
	}
	defer v.changed.Broadcast()
	r := ev.Resource
	if r == nil || !v.relevant(r.Type) {
		return
	}
	m := meshOf(v.meshes, r.Mesh)
	m.generation++
	if len(m.changes) == maxChangeLog {
		m.changes = append(m.changes[:0], m.changes[maxChangeLog/2:]...)
	}
	m.changes = append(m.changes, changedKey{m.generation, r.Key()})
	v.kickStatuses()
	close(v.next)
	v.next = make(chan struct{})
	if ev.Kind == storage.EventDelete {
		m.note(r.Key(), nil)
		return
	}
	m.note(r.Key(), r)
}

// waitFor blocks until the view reflects revision rev (or it stopped).
func (v *View) waitFor(ctx context.Context, rev uint64) error {
	stop := context.AfterFunc(ctx, func() {
		v.mu.Lock()
		v.changed.Broadcast()
		v.mu.Unlock()
	})
	defer stop()
	v.mu.Lock()
	defer v.mu.Unlock()
	for !v.loaded || v.applied < rev {
		if v.runErr != nil {
			return v.runErr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		v.changed.Wait()
	}
	return nil
}

// SnapshotGen is Snapshot with the generation the snapshot reflects (the
// xDS rendering asks ChangedSince what changed between two).
func (v *View) SnapshotGen(ctx context.Context, mesh string) (*policy.MeshSnapshot, uint64, error) {
	return v.latest(ctx, mesh)
}

// ChangedSince lists the keys of mesh's resources changed after
// generation from, up to generation to; ok is false when the log no
// longer reaches back to from (the caller treats everything as changed).
func (v *View) ChangedSince(mesh string, from, to uint64) (keys []resource.Key, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.meshes[mesh]
	if m == nil || from > to {
		return nil, false
	}
	if from == to {
		return nil, true
	}
	if len(m.changes) == 0 || m.changes[0].gen > from+1 {
		return nil, false
	}
	for _, c := range m.changes {
		if c.gen > from && c.gen <= to {
			keys = append(keys, c.key)
		}
	}
	return keys, true
}

// Snapshot returns the current snapshot of mesh, reflecting every write the
// store had committed when it was called (read-your-writes for the API).
func (v *View) Snapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, error) {
	snap, _, err := v.latest(ctx, mesh)
	return snap, err
}

// latest returns the snapshot of mesh (and its generation) reflecting every
// write the store had committed when it was called.
func (v *View) latest(ctx context.Context, mesh string) (*policy.MeshSnapshot, uint64, error) {
	rev, err := v.cfg.Store.Revision(ctx)
	if err != nil {
		return nil, 0, err
	}
	if err := v.waitFor(ctx, rev); err != nil {
		return nil, 0, err
	}
	return v.currentSnapshot(ctx, mesh)
}

// currentSnapshot returns the snapshot of mesh's current generation (and
// that generation), building it or waiting for the caller that is.
func (v *View) currentSnapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, uint64, error) {
	for {
		snap, in, wait := v.cached(mesh)
		if snap != nil {
			return snap, in.gen, nil
		}
		if wait != nil {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
		}
		snap, gen, err := v.build(ctx, mesh, in)
		return snap, gen, err
	}
}

// buildInputs are what one build of a mesh's snapshot starts from: its
// generation, and either every resource or the previous snapshot and the
// changes since; or, with reload, neither: the mesh is to be loaded from the
// store first.
type buildInputs struct {
	gen       uint64
	resources []*resource.Resource
	changes   *policy.Changes
	prev      *policy.MeshSnapshot
	reload    bool
}

// cached returns a fresh snapshot (with its generation), or the inputs to
// build one (and claims the build), or a channel to wait on while another
// caller builds.
func (v *View) cached(mesh string) (*policy.MeshSnapshot, buildInputs, chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := meshOf(v.meshes, mesh)
	if m.snapshot != nil && m.snapGen == m.generation {
		return m.snapshot, buildInputs{gen: m.snapGen}, nil
	}
	if ch, ok := v.building[mesh]; ok {
		return nil, buildInputs{}, ch
	}
	v.building[mesh] = make(chan struct{})
	if m.lost {
		return nil, buildInputs{reload: true}, nil
	}
	return nil, m.takeInputs(), nil
}

// build builds mesh's snapshot from in and records it; the caller claimed
// the build (cached), so builds of one mesh never overlap. A build that
// fails is not expected (the changes are the view's own record; a mesh's
// builds take turns, so no two start from one snapshot): it is done again
// from the store's contents, which the mesh is reloaded from.
func (v *View) build(ctx context.Context, mesh string, in buildInputs) (*policy.MeshSnapshot, uint64, error) {
	var snap *policy.MeshSnapshot
	var err error
	if !in.reload {
		snap, err = v.newSnapshot(mesh, in)
		if err != nil {
			v.cfg.Logger.Warn("policy snapshot failed; reloading the mesh from the store", "mesh", mesh, "error", err)
		}
	}
	if in.reload || err != nil {
		if in, err = v.reload(ctx, mesh); err == nil {
			snap, err = v.newSnapshot(mesh, in)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	close(v.building[mesh])
	delete(v.building, mesh)
	m := meshOf(v.meshes, mesh)
	if err != nil {
		// The changes noted since count from a snapshot that does not
		// exist: the next build reloads.
		m.snapshot, m.lost, m.pending = nil, true, map[resource.Key]*resource.Resource{}
		return nil, 0, fmt.Errorf("build policy snapshot of mesh %q: %w", mesh, err)
	}
	v.builds++
	if in.changes != nil {
		v.fromChanges++
	}
	m.snapshot, m.snapGen = snap, in.gen
	return snap, in.gen, nil
}

// reload lists mesh's resources from the store and hands them out as the
// inputs of a build from every resource. It holds v.mu meanwhile, so no
// change is applied in between: the store is at least as new as the view,
// and the changes the watch still delivers are replayed over the list,
// which converges as at startup (run).
func (v *View) reload(ctx context.Context, mesh string) (buildInputs, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := meshOf(v.meshes, mesh)
	m.pending, m.whole, m.lost = map[resource.Key]*resource.Resource{}, true, false
	if err := v.list(ctx, mesh, func(r *resource.Resource) { m.note(r.Key(), r) }); err != nil {
		m.lost = true
		return buildInputs{}, err
	}
	return m.takeInputs(), nil
}

// isShadow says r is a policy labelled kuma.io/effect: shadow.
func isShadow(r *resource.Resource) bool {
	return r != nil && r.Labels.Get(resource.LabelEffect) == resource.EffectShadow
}

// ShadowSnapshot builds mesh's snapshot as if its shadow policies were
// applied too (docs/dataplane.md#shadow): built afresh from the store on
// each call, never kept, never the one proxies get.
func (v *View) ShadowSnapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, error) {
	var rs []*resource.Resource
	if err := v.list(ctx, mesh, func(r *resource.Resource) { rs = append(rs, r) }); err != nil {
		return nil, err
	}
	return policy.NewMeshSnapshot(policy.Inputs{Registry: v.cfg.Registry, Mesh: mesh, Zone: v.cfg.Plane.Zone,
		SystemNamespace: v.cfg.Plane.SystemNamespace, Resources: rs})
}

func (v *View) newSnapshot(mesh string, in buildInputs) (*policy.MeshSnapshot, error) {
	return policy.NewMeshSnapshot(policy.Inputs{
		Registry: v.cfg.Registry, Mesh: mesh, Zone: v.cfg.Plane.Zone, SystemNamespace: v.cfg.Plane.SystemNamespace,
		Resources: in.resources, Changes: in.changes, Previous: in.prev,
	})
}

// Changed returns a channel closed at the next change of a mesh's
// resources (the xDS rendering follows it).
func (v *View) Changed() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.next
}

// Meshes lists the meshes the view holds resources of.
func (v *View) Meshes() []string { return v.meshNames() }

// Builds counts snapshots built so far.
func (v *View) Builds() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.builds
}

// StatusSnapshot returns the snapshot of mesh whose policy statuses are
// computed, without waiting for the latest changes: policy status is
// derived data shown beside the resources, and a read must never pay a
// rebuild. The status loop (runStatuses) recomputes a mesh whose statuses
// have been read once after its changes settle, so statuses follow changes
// within about StatusDebounce plus a rebuild, without polling. Only the
// first call for a mesh builds synchronously.
func (v *View) StatusSnapshot(ctx context.Context, mesh string) (*policy.MeshSnapshot, error) {
	v.mu.Lock()
	m := meshOf(v.meshes, mesh)
	snap, stale := m.statusSnap, m.statusGen != m.generation
	v.mu.Unlock()
	if snap != nil {
		if stale {
			wake(v.statusWake) // in case the change's kick came before the mesh was wanted
		}
		return snap, nil
	}
	snap, gen, err := v.latest(ctx, mesh)
	if err != nil {
		return nil, err
	}
	snap.ComputeStatuses()
	v.storeStatus(mesh, snap, gen)
	wake(v.statusWake) // in case the mesh changed meanwhile
	return snap, nil
}

// storeStatus records snap, whose statuses are computed and which reflects
// generation gen of mesh, unless a newer one is recorded.
func (v *View) storeStatus(mesh string, snap *policy.MeshSnapshot, gen uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := meshOf(v.meshes, mesh)
	if m.statusSnap == nil || gen >= m.statusGen {
		m.statusSnap, m.statusGen = snap, gen
	}
}

func (v *View) kickStatuses() { wake(v.statusKick) }

// DecorationsChanged says Config.Decorate's answers may have changed: the
// report to the global is made again (after the usual settling).
func (v *View) DecorationsChanged() {
	v.mu.Lock()
	v.decorations++
	v.mu.Unlock()
	wake(v.statusKick)
}

// reportList is a mesh's part of the report: the global policies'
// statuses, decorated.
func (v *View) reportList(snap *policy.MeshSnapshot) []policy.GlobalPolicyStatus {
	list := snap.GlobalPolicyStatuses()
	if v.cfg.Decorate != nil {
		for i := range list {
			v.cfg.Decorate(snap, &list[i])
		}
	}
	return list
}

// wake signals c without blocking (a signal already pending suffices).
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// RunStatusReports keeps the report of the global's policies' statuses in
// every mesh current until ctx ends (GlobalPolicyStatuses): from now on the
// status loop recomputes every mesh after its changes, read or not. A zone
// connected to a global runs it; its sync client sends the report.
func (v *View) RunStatusReports(ctx context.Context) error {
	v.mu.Lock()
	v.reporting = true
	v.mu.Unlock()
	wake(v.statusWake)
	<-ctx.Done()
	return nil
}

// StatusReportMaxDelay bounds how long a stream of writes can hold status
// recomputes back (settle). Statuses are derived data that reads never wait
// for; during a sustained stream of writes a zone recomputed all of them
// every second (about 0.1 s of CPU at 10,000 policies), which with ten zone
// processes on two cores took half the machine (profile of the ten-zone
// PUT phase: the status loop 29% of a zone's CPU). Once writes stop,
// statuses follow within StatusDebounce plus a rebuild, as before.
const StatusReportMaxDelay = 5 * time.Second

// runStatuses is the one place policy statuses are recomputed in the
// background (for reads and for the report), so a change costs one
// computation however many consumers there are. It runs until ctx ends.
func (v *View) runStatuses(ctx context.Context) {
	var took time.Duration              // the last recompute's duration
	reported := map[string]reportedAt{} // mesh → what its last report was made from
	byMesh := map[string]reportMesh{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-v.statusKick:
		case <-v.statusWake:
		}
		if !v.settle(ctx, took) {
			return
		}
		runs := v.StatusRuns()
		start := time.Now()
		if !v.recomputeStatuses(ctx, reported, byMesh) {
			return
		}
		pass := time.Since(start)
		computed := v.StatusRuns() != runs
		took = passCost(took, pass, computed)
		v.cfg.Logger.Debug("policy statuses recomputed", "took", pass, "computed", computed)
	}
}

// passCost is the duration settle's waits grow with after a status pass
// that took pass, given the one before (last): a pass that computed no
// mesh's statuses (they were current) says nothing of what the next one
// costs, so the last real pass's duration stands. Taking every pass's, a
// no-op pass set the waits back to the debounce: at 100,000 policies the
// next real pass (a third of a second of CPU and more) then started 100
// ms after a change, beside the API reads that follow one.
func passCost(last, pass time.Duration, computed bool) time.Duration {
	if !computed {
		return last
	}
	return pass
}

// settle waits until no change has arrived for StatusDebounce, or
// StatusReportMaxDelay has passed: a burst of thousands of writes costs a
// recompute every few seconds instead of one per debounce window (which
// took a third of a zone's CPU while 10,000 policies streamed in). Both
// waits grow with the last recompute's duration (took), so that at a size
// where one recompute takes seconds (100,000 policies) they still use at
// most about a tenth of the CPU while writes stream in. It reports false
// when ctx ended.
func (v *View) settle(ctx context.Context, took time.Duration) bool {
	quiet := max(StatusDebounce, took)
	maxDelay := max(StatusReportMaxDelay, 10*took)
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(quiet):
		}
		select {
		case <-v.statusKick:
			if time.Since(start) < maxDelay {
				continue // still changing
			}
		default:
		}
		return true
	}
}

// recomputeStatuses brings every mesh whose statuses are wanted (read once,
// or reported) up to date, then publishes the report when reporting and a
// mesh's statuses changed. It reports false when ctx ended.
func (v *View) recomputeStatuses(ctx context.Context, reported map[string]reportedAt, byMesh map[string]reportMesh) bool {
	changed, refreshed := false, false
	for _, mesh := range v.meshNames() {
		v.mu.Lock()
		m := meshOf(v.meshes, mesh)
		wanted, reporting := m.statusSnap != nil || v.reporting, v.reporting
		current := m.statusSnap != nil && m.statusGen == m.generation
		v.mu.Unlock()
		if !wanted {
			continue
		}
		if !current {
			snap, gen, err := v.currentSnapshot(ctx, mesh)
			if err != nil {
				if ctx.Err() != nil {
					return false
				}
				v.cfg.Logger.Warn("policy statuses not computed", "mesh", mesh, "error", err)
				continue
			}
			snap.ComputeStatuses()
			v.storeStatus(mesh, snap, gen)
			v.mu.Lock()
			v.statusRuns++
			v.mu.Unlock()
		}
		if !reporting {
			continue
		}
		v.mu.Lock()
		snap, gen, decorations := m.statusSnap, m.statusGen, v.decorations
		v.mu.Unlock()
		at := reportedAt{gen, decorations}
		if r, ok := reported[mesh]; ok && r == at {
			continue
		}
		reported[mesh] = at
		sum := statusSum(v.sumSeed, v.reportList(snap))
		prev, had := byMesh[mesh]
		// The newest snapshot, even when its statuses are the same: the
		// report must not keep an older one alive.
		byMesh[mesh] = reportMesh{snap: snap, sum: sum}
		refreshed = true
		if had && prev.sum == sum {
			// Most changes (a new timeout value, say) change no status: the
			// zone does not send the global megabytes it already has.
			continue
		}
		changed = true
	}
	if refreshed {
		v.publishReport(byMesh, changed)
	}
	return true
}

// reportedAt is what a mesh's report was made from: its statuses'
// generation and the decorations' count.
type reportedAt struct{ gen, decorations uint64 }

// reportMesh is one mesh's part of the status report: the snapshot whose
// statuses it is, and their fingerprint, which tells a new report from
// one the global has. The list itself is made when the report is read:
// kept, it was 8 MB of a zone's heap at 100,000 global policies, beside
// the statuses the snapshot holds anyway.
type reportMesh struct {
	snap *policy.MeshSnapshot
	sum  uint64
}

// statusSum fingerprints a mesh's report: every field of every status, in
// order, each string length-prefixed so that no two lists share a sum but
// by a 64-bit collision.
func statusSum(seed maphash.Seed, list []policy.GlobalPolicyStatus) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	count := func(n int) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(n))
		_, _ = h.Write(b[:])
	}
	str := func(s string) {
		count(len(s))
		_, _ = h.WriteString(s)
	}
	for _, st := range list {
		str(st.Type)
		str(st.Mesh)
		str(st.Name)
		count(len(st.Conditions))
		for _, c := range st.Conditions {
			str(c.Type)
			str(c.Status)
			str(c.Reason)
			str(c.Message)
		}
	}
	return h.Sum64()
}

// StatusRuns counts background status recomputes of a mesh.
func (v *View) StatusRuns() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.statusRuns
}

// GlobalPolicyStatuses returns the latest report (nil before the first) and
// a channel closed when a newer one replaces it. The list is made from the
// meshes' status snapshots at each call; the caller owns it.
func (v *View) GlobalPolicyStatuses() ([]policy.GlobalPolicyStatus, <-chan struct{}) {
	v.mu.Lock()
	if v.reportChanged == nil {
		v.reportChanged = make(chan struct{})
	}
	parts, published, changed := v.report, v.published, v.reportChanged
	v.mu.Unlock()
	if !published {
		return nil, changed
	}
	var all []policy.GlobalPolicyStatus
	for _, part := range parts {
		if list := v.reportList(part.snap); all == nil {
			all = list // the one mesh's list as it is, in the common case
		} else {
			all = append(all, list...)
		}
	}
	if all == nil {
		all = []policy.GlobalPolicyStatus{} // non-nil: an empty report clears the previous one
	}
	return all, changed
}

// publishReport publishes the report of every mesh's statuses, and tells
// the report's readers when it changed.
func (v *View) publishReport(byMesh map[string]reportMesh, changed bool) {
	parts := make([]reportMesh, 0, len(byMesh))
	for _, mesh := range sortedMeshes(byMesh) {
		parts = append(parts, byMesh[mesh])
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.report = parts
	if !changed && v.published {
		return
	}
	v.published = true
	if v.reportChanged != nil {
		close(v.reportChanged)
	}
	v.reportChanged = make(chan struct{})
}

func sortedMeshes(m map[string]reportMesh) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (v *View) meshNames() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]string, 0, len(v.meshes))
	for name := range v.meshes {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}
