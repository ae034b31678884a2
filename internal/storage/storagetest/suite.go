// Package storagetest is the conformance suite for storage.Store: every
// backend runs Run from its own tests and must pass it unchanged. The suite
// is the executable form of the contract documented in package storage.
package storagetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Options is what the suite asks of a store it opens.
type Options struct {
	// Dir holds the store's data; opening again with the same Dir after
	// Close must find the same data (unless Factory.Ephemeral).
	Dir string
	// Clock is the time the store must use for resource times and
	// tombstone expiry.
	Clock *FakeClock
	// TombstoneRetention is how long deletes stay watchable.
	TombstoneRetention time.Duration
}

// Factory tells the suite how to drive a backend.
type Factory struct {
	// Open opens the store kept in o.Dir. The suite closes what it opens.
	Open func(t *testing.T, o Options) (storage.Store, error)
	// ExpireTombstones runs the backend's tombstone expiry pass now.
	ExpireTombstones func(ctx context.Context, s storage.Store) error
	// Ephemeral backends keep nothing across Close; the suite then skips
	// the tests that reopen a store.
	Ephemeral bool
}

// FakeClock is a settable clock, safe for concurrent use. Its readings are
// UTC without a monotonic part, so stored times compare equal to them.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a clock stopped at start.
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{now: start.Round(0).UTC()}
}

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Run runs the whole suite against the backend f opens. Subtests run in
// parallel, each on its own store.
func Run(t *testing.T, f Factory) {
	tests := []struct {
		name       string
		fn         func(*testing.T, Factory)
		persistent bool
	}{
		{"CreateGet", testCreateGet, false},
		{"Update", testUpdate, false},
		{"Put", testPut, false},
		{"Delete", testDelete, false},
		{"Invalid", testInvalid, false},
		{"Isolation", testIsolation, false},
		{"Revisions", testRevisions, false},
		{"ListFilters", testListFilters, false},
		{"ListPagination", testListPagination, false},
		{"Apply", testApply, false},
		{"ApplyAtomic", testApplyAtomic, false},
		{"BatchCheck", testBatchCheck, false},
		{"WatchLast", testWatchLast, false},
		{"Meta", testMeta, false},
		{"WatchExact", testWatchExact, false},
		{"WatchEveryRevision", testWatchEveryRevision, false},
		{"WatchLive", testWatchLive, false},
		{"WatchDeletes", testWatchDeletes, false},
		{"WatchCompacted", testWatchCompacted, false},
		{"WatchEnds", testWatchEnds, false},
		{"WatchSlowConsumer", testWatchSlowConsumer, false},
		{"ConcurrentWriters", testConcurrentWriters, false},
		{"ConcurrentConflicts", testConcurrentConflicts, false},
		{"ConcurrentBatches", testConcurrentBatches, false},
		{"Simulation", testSimulation, false},
		{"Closed", testClosed, false},
		{"Reopen", testReopen, true},
		{"StoreID", testStoreID, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.persistent && f.Ephemeral {
				t.Skip("backend is ephemeral")
			}
			t.Parallel()
			tc.fn(t, f)
		})
	}
}

const (
	retention = time.Hour
	// waitTimeout bounds every wait for a watch event; generous for -race
	// on a loaded CI machine, and only reached when the store is broken.
	waitTimeout = 20 * time.Second
)

func startTime() time.Time { return time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC) }

// harness is one store under test with fatal-on-error helpers.
type harness struct {
	t     *testing.T
	f     Factory
	opts  Options
	clock *FakeClock
	s     storage.Store
	ctx   context.Context
}

func newHarness(t *testing.T, f Factory) *harness {
	t.Helper()
	clock := NewFakeClock(startTime())
	h := &harness{
		t: t, f: f, clock: clock, ctx: t.Context(),
		opts: Options{Dir: t.TempDir(), Clock: clock, TombstoneRetention: retention},
	}
	h.open()
	t.Cleanup(h.close)
	return h
}

func (h *harness) open() {
	h.t.Helper()
	s, err := h.f.Open(h.t, h.opts)
	if err != nil {
		h.t.Fatalf("open store: %v", err)
	}
	h.s = s
}

func (h *harness) close() {
	h.t.Helper()
	if h.s == nil {
		return
	}
	if err := h.s.Close(); err != nil {
		h.t.Errorf("close store: %v", err)
	}
	h.s = nil
}

func (h *harness) reopen() {
	h.t.Helper()
	h.close()
	h.open()
}

func (h *harness) create(r *resource.Resource) *resource.Resource {
	h.t.Helper()
	out, err := h.s.Create(h.ctx, r)
	if err != nil {
		h.t.Fatalf("create %s: %v", r.Key(), err)
	}
	return out
}

func (h *harness) put(r *resource.Resource) (*resource.Resource, storage.Outcome) {
	h.t.Helper()
	out, o, err := h.s.Put(h.ctx, r)
	if err != nil {
		h.t.Fatalf("put %s: %v", r.Key(), err)
	}
	return out, o
}

func (h *harness) get(k resource.Key) *resource.Resource {
	h.t.Helper()
	out, err := h.s.Get(h.ctx, k)
	if err != nil {
		h.t.Fatalf("get %s: %v", k, err)
	}
	return out
}

func (h *harness) del(k resource.Key, version uint64) {
	h.t.Helper()
	if err := h.s.Delete(h.ctx, k, version); err != nil {
		h.t.Fatalf("delete %s: %v", k, err)
	}
}

func (h *harness) apply(b storage.Batch) *storage.BatchResult {
	h.t.Helper()
	out, err := h.s.Apply(h.ctx, b)
	if err != nil {
		h.t.Fatalf("apply: %v", err)
	}
	return out
}

func (h *harness) rev() uint64 {
	h.t.Helper()
	r, err := h.s.Revision(h.ctx)
	if err != nil {
		h.t.Fatalf("revision: %v", err)
	}
	return r
}

func (h *harness) list(opts storage.ListOptions) *storage.ListResult {
	h.t.Helper()
	out, err := h.s.List(h.ctx, opts)
	if err != nil {
		h.t.Fatalf("list %+v: %v", opts, err)
	}
	return out
}

func (h *harness) expire() {
	h.t.Helper()
	if err := h.f.ExpireTombstones(h.ctx, h.s); err != nil {
		h.t.Fatalf("expire tombstones: %v", err)
	}
}

func (h *harness) watch(from uint64) <-chan storage.Event {
	h.t.Helper()
	ch, err := h.s.Watch(h.ctx, from)
	if err != nil {
		h.t.Fatalf("watch from %d: %v", from, err)
	}
	return ch
}

// mk builds a resource from "Type/mesh/namespace/name", a spec and label
// key/value pairs.
func mk(path, spec string, kv ...string) *resource.Resource {
	k := key(path)
	r := &resource.Resource{Type: k.Type, Mesh: k.Mesh, Namespace: k.Namespace, Name: k.Name}
	if spec != "" {
		r.Spec = []byte(spec)
	}
	if len(kv) > 0 {
		r.Labels = resource.LabelsOf(kv...)
	}
	return r
}

func key(path string) resource.Key {
	p := strings.SplitN(path, "/", 4)
	for len(p) < 4 {
		p = append(p, "")
	}
	return resource.Key{Type: p[0], Mesh: p[1], Namespace: p[2], Name: p[3]}
}

// diff describes how got differs from want ("" when equal). nil and empty
// labels, spec and status are equal; times are compared as instants.
func diff(got, want *resource.Resource) string {
	switch {
	case got == nil || want == nil:
		if got != want {
			return fmt.Sprintf("got %v, want %v", got, want)
		}
		return ""
	case got.Key() != want.Key():
		return fmt.Sprintf("key %s, want %s", got.Key(), want.Key())
	case !got.Labels.Equal(want.Labels):
		return fmt.Sprintf("%s: labels %v, want %v", got.Key(), got.Labels, want.Labels)
	case !bytes.Equal(got.Spec, want.Spec):
		return fmt.Sprintf("%s: spec %s, want %s", got.Key(), got.Spec, want.Spec)
	case !bytes.Equal(got.Status, want.Status):
		return fmt.Sprintf("%s: status %s, want %s", got.Key(), got.Status, want.Status)
	case got.Version != want.Version:
		return fmt.Sprintf("%s: version %d, want %d", got.Key(), got.Version, want.Version)
	case !got.CreationTime.Equal(want.CreationTime):
		return fmt.Sprintf("%s: creationTime %s, want %s", got.Key(), got.CreationTime, want.CreationTime)
	case !got.ModificationTime.Equal(want.ModificationTime):
		return fmt.Sprintf("%s: modificationTime %s, want %s", got.Key(), got.ModificationTime, want.ModificationTime)
	}
	return ""
}

func checkRes(t *testing.T, what string, got, want *resource.Resource) {
	t.Helper()
	if d := diff(got, want); d != "" {
		t.Errorf("%s: %s", what, d)
	}
}

// stamped is in with the fields a store sets on a write.
func stamped(in *resource.Resource, version uint64, created, modified time.Time) *resource.Resource {
	r := in.Clone()
	r.Version, r.CreationTime, r.ModificationTime = version, created, modified
	return r
}

// checkErr fails unless err matches want (nil: no error).
func checkErr(t *testing.T, what string, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Errorf("%s: unexpected error %v", what, err)
	case want != nil && !errors.Is(err, want):
		t.Errorf("%s: error %v, want errors.Is %v", what, err, want)
	}
}
