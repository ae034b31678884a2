package storagetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// testWatchExact: with no key written twice, catch-up from any revision
// delivers exactly the changes after it, then live changes, nothing else.
func testWatchExact(t *testing.T, f Factory) {
	h := newHarness(t, f)
	rec := &recorder{h: h}
	rec.create(mk("MeshRetry/default//a", `{"v":1}`, "team", "a"))
	rec.create(mk("MeshRetry/default//b", `{"v":1}`))
	rec.apply(storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//c", `{}`), mk("MeshTimeout/default/ns/d", `{}`)}})
	h.clock.Advance(time.Second)
	rec.create(mk("Mesh///default", `{}`))
	rec.put(mk("MeshRetry/other//e", `{"v":1}`))

	tests := []struct {
		name string
		from uint64
		n    int
	}{
		{"from 0", 0, 6},
		{"from 2", 2, 4},
		{"from 3", 3, 2},
		{"from head", 5, 0},
		{"from the future", 99, 0},
	}
	chans := make([]<-chan storage.Event, len(tests))
	for i, tc := range tests {
		chans[i] = h.watch(tc.from)
		checkExact(t, tc.name, rec.hist, tc.from, recvN(t, chans[i], tc.n))
	}
	rec.create(mk("MeshRetry/default//live", `{}`))
	live := rec.hist[len(rec.hist)-1]
	for i, tc := range tests {
		if tc.from >= live.Revision {
			continue
		}
		ev := recv(t, chans[i])
		checkExact(t, tc.name+": next live event", history{live}, 0, []storage.Event{ev})
	}
}

// fixtureWithRewrites writes a history where keys are rewritten, deleted
// and re-created, ending with a single-resource write.
func fixtureWithRewrites(h *harness) *recorder {
	rec := &recorder{h: h}
	rec.create(mk("MeshRetry/default//a", `{"v":1}`, "team", "a"))
	rec.create(mk("MeshRetry/default//b", `{"v":1}`, "team", "b"))
	rec.put(mk("MeshRetry/default//a", `{"v":2}`, "team", "a"))
	rec.del("MeshRetry/default//b")
	h.clock.Advance(time.Second)
	rec.apply(storage.Batch{
		Puts:    []*resource.Resource{mk("MeshRetry/default//c", `{}`), mk("MeshRetry/default//a", `{"v":3}`)},
		Deletes: []resource.Key{key("MeshRetry/default//absent")},
	})
	rec.put(mk("MeshRetry/default//b", `{"v":"again"}`, "team", "b2"))
	rec.put(mk("MeshRetry/default//c", `{}`)) // unchanged: no event
	rec.del("MeshRetry/default//a")
	rec.apply(storage.Batch{
		Puts:    []*resource.Resource{mk("MeshTimeout/default//t", `{}`)},
		Deletes: []resource.Key{key("MeshRetry/default//c"), key("MeshRetry/default//b")},
	})
	rec.create(mk("MeshRetry/default//a", `{"v":"reborn"}`))
	rec.put(mk("MeshTimeout/default//t", `{"v":2}`))
	return rec
}

// testWatchEveryRevision watches from every revision of a history with
// rewrites and deletes: each stream obeys the contract and, replayed onto
// the state at its start, yields the final state.
func testWatchEveryRevision(t *testing.T, f Factory) {
	h := newHarness(t, f)
	rec := fixtureWithRewrites(h)
	head := h.rev()
	final := h.storeState("MeshRetry", "MeshTimeout")
	checkState(t, "history replayed", stateAt(rec.hist, head), final)
	for from := uint64(0); from < head; from++ {
		what := fmt.Sprintf("from %d", from)
		got := recvThrough(t, h.watch(from), head)
		checkStream(t, what, rec.hist, from, got)
		checkState(t, what, replay(stateAt(rec.hist, from), got), final)
	}
}

// testWatchLive: a watcher at the head gets each change as it commits.
func testWatchLive(t *testing.T, f Factory) {
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//before", `{}`))
	rec := &recorder{h: h}
	ch := h.watch(h.rev())
	steps := []struct {
		name  string
		write func()
	}{
		{"create", func() { rec.create(mk("MeshRetry/default//a", `{}`, "k", "v")) }},
		{"update", func() { rec.put(mk("MeshRetry/default//a", `{"v":2}`, "k", "v")) }},
		{"delete", func() { rec.del("MeshRetry/default//a") }},
		{"batch", func() {
			rec.apply(storage.Batch{
				Puts:    []*resource.Resource{mk("MeshRetry/default//x", `{}`), mk("MeshTimeout/default//y", `{}`)},
				Deletes: []resource.Key{key("MeshRetry/default//before")},
			})
		}},
		{"re-create", func() { rec.create(mk("MeshRetry/default//a", `{}`)) }},
	}
	for _, st := range steps {
		n := len(rec.hist)
		st.write()
		checkExact(t, st.name, rec.hist[n:], 0, recvN(t, ch, len(rec.hist)-n))
	}
}

// testWatchDeletes: deletes reach watchers as tombstones with the last
// labels, including deletes of keys that were re-created since.
func testWatchDeletes(t *testing.T, f Factory) {
	h := newHarness(t, f)
	rec := &recorder{h: h}
	rec.create(mk("MeshRetry/default/ns/a", `{"v":1}`, "team", "a", "kuma.io/origin", "zone"))
	rec.create(mk("MeshRetry/default//b", `{}`))
	rec.del("MeshRetry/default/ns/a")
	rec.create(mk("MeshRetry/default/ns/a", `{"v":2}`, "team", "a2"))
	rec.del("MeshRetry/default/ns/a")
	rec.del("MeshRetry/default//b")
	rec.create(mk("MeshRetry/default//sentinel", `{}`))
	head := h.rev()

	got := recvThrough(t, h.watch(0), head)
	checkStream(t, "from 0", rec.hist, 0, got)
	var deletes []storage.Event
	for _, ev := range got {
		if ev.Kind == storage.EventDelete {
			deletes = append(deletes, ev)
		}
	}
	if len(deletes) != 3 {
		t.Fatalf("from 0: %d delete events, want 3", len(deletes))
	}
	first := deletes[0].Resource
	if first.Key() != key("MeshRetry/default/ns/a") || first.Labels.Get("team") != "a" || first.Labels.Get("kuma.io/origin") != "zone" || first.Spec != nil {
		t.Errorf("first tombstone = %+v, want key, labels of the first incarnation and no spec", first)
	}
	got = recvThrough(t, h.watch(1), head)
	checkStream(t, "from 1", rec.hist, 1, got)
	checkState(t, "from 1", replay(stateAt(rec.hist, 1), got), h.storeState("MeshRetry"))
}

// testWatchCompacted: expired tombstones make older revisions unwatchable
// with ErrCompacted, and only those.
func testWatchCompacted(t *testing.T, f Factory) {
	h := newHarness(t, f)
	rec := &recorder{h: h}
	rec.create(mk("MeshRetry/default//a", `{}`))
	rec.create(mk("MeshRetry/default//b", `{}`))
	rec.del("MeshRetry/default//a") // rev 3, expires below
	h.clock.Advance(2 * retention)
	rec.create(mk("MeshRetry/default//c", `{}`))
	rec.del("MeshRetry/default//b") // rev 5, too young

	if c, err := h.s.CompactedRevision(h.ctx); err != nil || c != 0 {
		t.Fatalf("compacted revision %d, %v before any expiry, want 0", c, err)
	}
	h.expire()
	compacted, err := h.s.CompactedRevision(h.ctx)
	if err != nil || compacted < 3 || compacted > 4 {
		t.Fatalf("compacted revision %d, %v after expiring the delete at 3 only; want 3 or 4", compacted, err)
	}
	for _, from := range []uint64{0, compacted - 1} {
		_, err := h.s.Watch(h.ctx, from)
		checkErr(t, fmt.Sprintf("watch from %d", from), err, storage.ErrCompacted)
	}
	ch := h.watch(compacted)
	got := recvThrough(t, ch, 5)
	checkStream(t, "from compacted", rec.hist, compacted, got)
	checkState(t, "from compacted", replay(stateAt(rec.hist, compacted), got), h.storeState("MeshRetry"))

	h.clock.Advance(2 * retention)
	h.expire()
	if c, _ := h.s.CompactedRevision(h.ctx); c != 5 {
		t.Fatalf("compacted revision %d after expiring the delete at 5, want 5", c)
	}
	_, err = h.s.Watch(h.ctx, 4)
	checkErr(t, "watch from 4", err, storage.ErrCompacted)
	fromHead := h.watch(5)
	rec.create(mk("MeshRetry/default//d", `{}`))
	checkExact(t, "live after compaction", rec.hist, 5, recvN(t, fromHead, 1))
	checkExact(t, "earlier watcher unaffected", rec.hist, 5, recvN(t, ch, 1))
}

// testWatchEnds: the channel closes when the context ends.
func testWatchEnds(t *testing.T, f Factory) {
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//a", `{}`))
	ctx, cancel := context.WithCancel(h.ctx)
	ch, err := h.s.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ch)
	cancel()
	expectClosed(t, "after cancel", ch)
	_, err = h.s.Watch(ctx, 0)
	checkErr(t, "watch with a dead context", err, context.Canceled)

	ch = h.watch(0)
	h.close()
	expectClosed(t, "after store close", ch)
}

// testWatchSlowConsumer: a watcher nobody reads never blocks writers and,
// read later, misses nothing.
func testWatchSlowConsumer(t *testing.T, f Factory) {
	h := newHarness(t, f)
	ch := h.watch(0)
	rec := &recorder{h: h}
	// A write blocked by the unread watcher would hang the test; fail fast
	// instead (t.Fatal is not allowed off the test goroutine).
	watchdog := time.AfterFunc(waitTimeout, func() { panic("storagetest: writers blocked by a watcher that is not read") })
	for i := range 300 {
		name := fmt.Sprintf("MeshRetry/default//r%03d", i%40)
		if _, err := h.s.Get(h.ctx, key(name)); err == nil && i%7 == 6 {
			rec.del(name)
			continue
		}
		rec.put(mk(name, fmt.Sprintf(`{"i":%d}`, i)))
	}
	rec.create(mk("MeshRetry/default//sentinel", `{}`))
	watchdog.Stop()
	got := recvThrough(t, ch, h.rev())
	checkStream(t, "slow consumer", rec.hist, 0, got)
	checkState(t, "slow consumer", replay(nil, got), h.storeState("MeshRetry"))
}

// testWatchLast: Last marks exactly the last event of each revision, for a
// multi-resource batch too, whether watched live or replayed.
func testWatchLast(t *testing.T, f Factory) {
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//a", `{}`))
	from := h.rev()
	live := h.watch(from)
	h.apply(storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//b", `{}`), mk("MeshRetry/default//c", `{}`)},
		Deletes: []resource.Key{key("MeshRetry/default//a")}})
	h.create(mk("MeshRetry/default//d", `{}`))
	for name, ch := range map[string]<-chan storage.Event{"live": live, "replayed": h.watch(from)} {
		got := recvN(t, ch, 4)
		var lasts []bool
		for _, ev := range got {
			lasts = append(lasts, ev.Last)
		}
		if want := []bool{false, false, true, true}; !slices.Equal(lasts, want) {
			t.Errorf("%s: Last flags %v, want %v", name, lasts, want)
		}
	}
}
