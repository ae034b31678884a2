package policyview_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/policyview"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

// testZone is the zone the views of the tests serve.
var testZone = plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvKubernetes, SystemNamespace: plane.DefaultSystemNamespace}

func dataplane(name, service string) *resource.Resource {
	return &resource.Resource{Type: "Dataplane", Mesh: "default", Name: name,
		Spec: []byte(`{"networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"` + service + `"}}]}}`)}
}

func timeout(name, idle string) *resource.Resource {
	return &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name,
		Labels: resource.NewLabels(map[string]string{resource.LabelOrigin: "zone", resource.LabelPolicyRole: "system"}),
		Spec:   []byte(`{"targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"` + idle + `"}}]}`)}
}

func TestViewFollowsTheStore(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, v, done := startView(ctx, t, dataplane("web-1", "web"), timeout("t1", "1h"))

	idle := func() string {
		t.Helper()
		snap, err := v.Snapshot(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		ev, err := snap.EvaluateInbound("web-1", "", 8080, map[string]string{"kuma.io/service": "x"})
		if err != nil {
			t.Fatal(err)
		}
		p, ok := ev.Policies["MeshTimeout"]
		if !ok {
			return ""
		}
		var conf struct {
			IdleTimeout string `json:"idleTimeout"`
		}
		if err := json.Unmarshal(p.Conf, &conf); err != nil {
			t.Fatal(err)
		}
		return conf.IdleTimeout
	}

	if got := idle(); got != "1h" {
		t.Fatalf("idleTimeout = %q, want 1h", got)
	}
	builds := v.Builds()
	for i := 0; i < 5; i++ {
		idle()
	}
	if v.Builds() != builds {
		t.Errorf("unchanged mesh rebuilt: %d builds, want %d", v.Builds(), builds)
	}

	// Read-your-writes: a change is visible to the next read at once.
	if _, _, err := store.Put(ctx, timeout("t1", "2h")); err != nil {
		t.Fatal(err)
	}
	if got := idle(); got != "2h" {
		t.Errorf("after update idleTimeout = %q, want 2h", got)
	}
	if v.Builds() != builds+1 {
		t.Errorf("builds = %d, want %d", v.Builds(), builds+1)
	}
	// A change in another mesh does not rebuild this one.
	if _, err := store.Create(ctx, &resource.Resource{Type: "Mesh", Name: "other", Spec: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if got := idle(); got != "2h" || v.Builds() != builds+1 {
		t.Errorf("unrelated write rebuilt the mesh: idle %q builds %d", got, v.Builds())
	}
	if err := store.Delete(ctx, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "t1"}, 0); err != nil {
		t.Fatal(err)
	}
	if got := idle(); got != "" {
		t.Errorf("after delete idleTimeout = %q, want none", got)
	}
	if err := store.Delete(ctx, resource.Key{Type: "Dataplane", Mesh: "default", Name: "web-1"}, 0); err != nil {
		t.Fatal(err)
	}
	snap, err := v.Snapshot(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snap.Rules("web-1", ""); !errors.Is(err, policy.ErrNotFound) {
		t.Errorf("deleted dataplane: err = %v, want ErrNotFound", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestStatusSnapshotNeverWaits: the first status read builds; later reads
// return at once with the last computed statuses, and the view catches up
// in the background after a change.
func TestStatusSnapshotNeverWaits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, v, done := startView(ctx, t, timeout("t1", "1h"))
	reason := func() string {
		st, err := meshTimeoutStatus(ctx, t, v, "t1")
		if err != nil {
			return "absent"
		}
		return st.Conditions[0].Status + "/" + st.Conditions[0].Reason
	}
	if got := reason(); got != "False/TargetNotFound" {
		t.Fatalf("without Dataplanes: %s", got)
	}
	if _, err := store.Create(ctx, dataplane("web-1", "web")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for reason() != "True/Accepted" {
		if time.Now().After(deadline) {
			t.Fatalf("status did not follow the new Dataplane: %s", reason())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

// TestOneStatusComputationServesReadsAndReports: with the report running
// and statuses read through the API path, a burst of changes costs one
// background recompute (not one per consumer, nor one per change), and both
// the report and StatusSnapshot reflect the burst's end.
func TestOneStatusComputationServesReadsAndReports(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, v, done := startView(ctx, t, dataplane("web-1", "web"), global("g1", "1h"))
	go func() { _ = v.RunStatusReports(ctx) }()
	reportHas := func(names ...string) bool {
		report, _ := v.GlobalPolicyStatuses()
		var got []string
		for _, st := range report {
			got = append(got, st.Name)
		}
		slices.Sort(got) // the report is in the engine's order
		return slices.Equal(got, names)
	}
	waitUntil(t, "first report", func() bool { return reportHas("g1") })
	if _, err := v.StatusSnapshot(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	runs := v.StatusRuns()
	// One batch: its 20 events arrive together, whatever the machine's
	// speed (separate writes more than StatusDebounce apart would be two
	// bursts).
	var burst storage.Batch
	for i := range 20 {
		burst.Puts = append(burst.Puts, global(fmt.Sprintf("g%02d", i+2), fmt.Sprintf("%ds", i+1)))
	}
	if _, err := store.Apply(ctx, burst); err != nil {
		t.Fatal(err)
	}
	var all []string
	for i := range 21 {
		all = append(all, fmt.Sprintf("g%02d", i+1))
	}
	all[0] = "g1"
	slices.Sort(all)
	waitUntil(t, "report after the burst", func() bool { return reportHas(all...) })
	waitUntil(t, "statuses after the burst", func() bool {
		snap, err := v.StatusSnapshot(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		_, err = snap.PolicyStatus("MeshTimeout", "g21", "")
		return err == nil
	})
	time.Sleep(3 * policyview.StatusDebounce) // anything still scheduled runs
	if got := v.StatusRuns() - runs; got != 1 {
		t.Errorf("a burst of 20 changes cost %d status recomputes, want 1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// awaitCollected fails the test unless collected closes within a few
// collections.
func awaitCollected(t *testing.T, collected <-chan struct{}, msg string) {
	t.Helper()
	for range 50 {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal(msg)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReportOnlyWhenStatusesChange: a change that leaves every status as it
// was (a new timeout value) publishes no new report, yet the report then
// reads the new snapshot and the one it was made from can be collected (a
// report used to be a list of its own; holding a snapshot instead must not
// pin old ones); a change of a status publishes one.
func TestReportOnlyWhenStatusesChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, v, _ := startView(ctx, t, dataplane("web-1", "web"), global("g1", "1h"))
	go func() { _ = v.RunStatusReports(ctx) }()
	waitUntil(t, "first report", func() bool { r, _ := v.GlobalPolicyStatuses(); return len(r) == 1 })
	first, changed := v.GlobalPolicyStatuses()
	old, err := v.StatusSnapshot(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	collected := make(chan struct{})
	runtime.AddCleanup(old, func(ch chan struct{}) { close(ch) }, collected)
	old = nil
	runs := v.StatusRuns()
	if _, _, err := store.Put(ctx, global("g1", "2h")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "recompute after the change", func() bool { return v.StatusRuns() > runs })
	select {
	case <-changed:
		t.Fatal("a change that left every status as it was published a new report")
	case <-time.After(2 * policyview.StatusDebounce):
	}
	if again, _ := v.GlobalPolicyStatuses(); !reflect.DeepEqual(again, first) {
		t.Fatalf("report %+v, want %+v", again, first)
	}
	awaitCollected(t, collected, "the snapshot of the first report is still reachable")
	// g2 loses idleTimeout to g1 (the smaller name wins): a status changes.
	if _, _, err := store.Put(ctx, global("g2", "3h")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("a new policy's status was not reported")
	}
	if r, _ := v.GlobalPolicyStatuses(); len(r) != 2 {
		t.Errorf("report has %d statuses, want 2", len(r))
	}
}

// TestDecorationsChangeTheReport: what a decorator adds (a data plane's
// Programmed condition) is in the report, and when its answers change
// (DecorationsChanged) a new report is published though no status did.
func TestDecorationsChangeTheReport(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	programmed := ""
	decorate := func(_ *policy.MeshSnapshot, st *policy.GlobalPolicyStatus) {
		mu.Lock()
		defer mu.Unlock()
		if programmed != "" && st.LocalName != "" {
			st.Conditions = append(slices.Clip(st.Conditions), policy.Condition{Type: "Programmed", Status: "False", Reason: programmed})
		}
	}
	_, v, _ := startViewWith(ctx, t, decorate, dataplane("web-1", "web"), global("g1", "1h"))
	go func() { _ = v.RunStatusReports(ctx) }()
	waitUntil(t, "first report", func() bool { r, _ := v.GlobalPolicyStatuses(); return len(r) == 1 })
	first, changed := v.GlobalPolicyStatuses()
	for _, c := range first[0].Conditions {
		if c.Type == "Programmed" {
			t.Fatalf("a Programmed condition before the decorator gave one: %+v", first[0])
		}
	}
	mu.Lock()
	programmed = "PartiallyProgrammed"
	mu.Unlock()
	v.DecorationsChanged()
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no new report after the decorations changed")
	}
	r, _ := v.GlobalPolicyStatuses()
	last := r[0].Conditions[len(r[0].Conditions)-1]
	if last.Type != "Programmed" || last.Reason != "PartiallyProgrammed" {
		t.Fatalf("report %+v lacks the decorator's condition", r[0])
	}
}

// TestPollingDoesNotHoldStatusesBack: a client polling a stale status as
// fast as it can does not count as a stream of changes; the statuses follow
// a change within StatusDebounce and a rebuild.
func TestPollingDoesNotHoldStatusesBack(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, v, _ := startView(ctx, t, timeout("t1", "1h"))
	accepted := func() bool {
		st, err := meshTimeoutStatus(ctx, t, v, "t1")
		return err == nil && st.Conditions[0].Status == "True"
	}
	if accepted() {
		t.Fatal("accepted without a Dataplane")
	}
	if _, err := store.Create(ctx, dataplane("web-1", "web")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for !accepted() {
		if time.Since(start) > 5*time.Second {
			t.Fatal("status did not follow the new Dataplane")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if took := time.Since(start); took > 750*time.Millisecond { // StatusDebounce and a rebuild, not a held-back recompute
		t.Errorf("polling held the recompute back: the status followed after %s", took)
	}
}

// global is a MeshTimeout synced from the global.
func global(name, idle string) *resource.Resource {
	r := timeout(name, idle)
	r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal})
	return r
}

// startView opens a store holding rs and runs a view of it until ctx ends;
// done yields Run's result.
func startView(ctx context.Context, t *testing.T, rs ...*resource.Resource) (*boltstore.Store, *policyview.View, <-chan error) {
	t.Helper()
	return startViewWith(ctx, t, nil, rs...)
}

// startViewWith is startView with a report decorator.
func startViewWith(ctx context.Context, t *testing.T, decorate func(*policy.MeshSnapshot, *policy.GlobalPolicyStatus),
	rs ...*resource.Resource) (*boltstore.Store, *policyview.View, <-chan error) {
	t.Helper()
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, r := range rs {
		if _, err := store.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	v, err := policyview.New(policyview.Config{Registry: resource.NewDefaultRegistry(), Store: store, Plane: testZone, Decorate: decorate})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	return store, v, done
}

// meshTimeoutStatus reads a MeshTimeout's status in mesh default through
// StatusSnapshot (which never waits).
func meshTimeoutStatus(ctx context.Context, t *testing.T, v *policyview.View, name string) (*policy.PolicyStatus, error) {
	t.Helper()
	snap, err := v.StatusSnapshot(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	return snap.PolicyStatus("MeshTimeout", name, "")
}

// TestSnapshotsFromChangesMatchTheStore: random writes (MeshTimeouts,
// Dataplanes, now and then a MeshService, which needs a full build), each
// batch read back at once: the view's snapshot, built from the previous one
// and the changes, answers as one built from the store's contents.
func TestSnapshotsFromChangesMatchTheStore(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, v, done := startView(ctx, t, dataplane("web-1", "web"), timeout("t0", "1s"))
	reg := resource.NewDefaultRegistry()
	rng := rand.New(rand.NewPCG(5, 8))
	for round := 0; round < 60; round++ {
		for range 1 + rng.IntN(5) {
			var err error
			switch n := rng.IntN(12); {
			case n == 0:
				_, _, err = store.Put(ctx, &resource.Resource{Type: "MeshService", Mesh: "default", Name: fmt.Sprintf("svc-%d", rng.IntN(2)),
					Spec: []byte(`{"selector":{"dataplaneTags":{"app":"web"}},"ports":[{"port":80,"targetPort":8080,"appProtocol":"http"}]}`)})
			case n == 1:
				_, _, err = store.Put(ctx, dataplane(fmt.Sprintf("web-%d", 2+rng.IntN(2)), "web"))
			case n < 4:
				err = store.Delete(ctx, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("t%d", rng.IntN(8))}, 0)
				if errors.Is(err, storage.ErrNotFound) {
					err = nil
				}
			default:
				_, _, err = store.Put(ctx, timeout(fmt.Sprintf("t%d", rng.IntN(8)), fmt.Sprintf("%ds", rng.IntN(100))))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		snap, err := v.Snapshot(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		var all []*resource.Resource
		for _, typ := range []string{"MeshTimeout", "Dataplane", "MeshService"} {
			list, err := store.List(ctx, storage.ListOptions{Type: typ})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, list.Items...)
		}
		fresh, err := policy.NewMeshSnapshot(policy.Inputs{SystemNamespace: "kuma-system", Registry: reg, Mesh: "default", Zone: "zone-1", Resources: all})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := everyAnswer(t, snap), everyAnswer(t, fresh); got != want {
			t.Fatalf("round %d: the view answers\n%s\nthe store's contents\n%s", round, got, want)
		}
	}
	if v.BuildsFromChanges() < 30 {
		t.Fatalf("%d of %d builds were from changes", v.BuildsFromChanges(), v.Builds())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// everyAnswer renders the rules of every Dataplane and every policy status.
func everyAnswer(t *testing.T, s *policy.MeshSnapshot) string {
	t.Helper()
	var out []any
	for _, dp := range s.Dataplanes() {
		r, err := s.Rules(dp.Name, dp.Namespace)
		out = append(out, dp.Name, r, fmt.Sprint(err))
	}
	out = append(out, s.GlobalPolicyStatuses())
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFailedBuildReloadsTheMesh: a build that fails (here, a change of
// another mesh's resource noted in this one, which the view never does)
// reloads the mesh from the store and builds from that: the snapshot
// answers as the store's contents.
func TestFailedBuildReloadsTheMesh(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, v, done := startView(ctx, t, dataplane("web-1", "web"), timeout("t0", "1s"))
	if _, err := v.Snapshot(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Put(ctx, timeout("t1", "2s")); err != nil {
		t.Fatal(err)
	}
	stray := timeout("stray", "3s")
	stray.Mesh = "other"
	v.NoteForTest("default", stray)
	snap, err := v.Snapshot(ctx, "default")
	if err != nil {
		t.Fatalf("a failed build was not recovered: %v", err)
	}
	for _, name := range []string{"t0", "t1"} {
		if st, err := snap.PolicyStatus("MeshTimeout", name, ""); err != nil || st == nil {
			t.Errorf("%s after the reload: %v, %v", name, st, err)
		}
	}
	if names := snap.Dataplanes(); len(names) != 1 {
		t.Errorf("Dataplanes after the reload: %v", names)
	}
	if _, err := snap.PolicyStatus("MeshTimeout", "stray", ""); err == nil {
		t.Error("the stray change is in the snapshot after the reload")
	}
	// Later changes are built from the reloaded snapshot.
	from := v.BuildsFromChanges()
	if _, _, err := store.Put(ctx, timeout("t2", "4s")); err != nil {
		t.Fatal(err)
	}
	snap, err = v.Snapshot(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := snap.PolicyStatus("MeshTimeout", "t2", ""); err != nil || st == nil {
		t.Errorf("t2 after the reload: %v, %v", st, err)
	}
	if v.BuildsFromChanges() != from+1 {
		t.Errorf("the build after the reload was not from changes")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestPassCost: a status pass that computed nothing leaves the waits as the
// last real pass set them.
func TestPassCost(t *testing.T) {
	for _, tc := range []struct {
		last, pass time.Duration
		computed   bool
		want       time.Duration
	}{
		{last: 0, pass: 300 * time.Millisecond, computed: true, want: 300 * time.Millisecond},
		{last: 300 * time.Millisecond, pass: 5 * time.Microsecond, computed: false, want: 300 * time.Millisecond},
		{last: 300 * time.Millisecond, pass: 80 * time.Millisecond, computed: true, want: 80 * time.Millisecond},
		{last: 0, pass: 5 * time.Microsecond, computed: false, want: 0},
	} {
		if got := policyview.PassCost(tc.last, tc.pass, tc.computed); got != tc.want {
			t.Errorf("passCost(%v, %v, %v) = %v, want %v", tc.last, tc.pass, tc.computed, got, tc.want)
		}
	}
}
