package storagetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

const writers = 8

// parallel runs fn(i) for i in [0, n) on n goroutines and waits.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fn(i) })
	}
	wg.Wait()
}

// testConcurrentWriters: every acknowledged concurrent write is stored and
// has its own revision; revisions have no gaps; watchers, live and catching
// up, see every write once, in revision order.
func testConcurrentWriters(t *testing.T, f Factory) {
	const perWriter = 40
	h := newHarness(t, f)
	live := h.watch(0)
	acked := make([][]*resource.Resource, writers)
	parallel(writers, func(w int) {
		for i := range perWriter {
			out, err := h.s.Create(h.ctx, mk(fmt.Sprintf("MeshRetry/m%d//r%03d", w%3, w*perWriter+i), fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)))
			if err != nil {
				t.Errorf("writer %d: create %d: %v", w, i, err)
				return
			}
			acked[w] = append(acked[w], out)
		}
	})
	if t.Failed() {
		return
	}
	const total = writers * perWriter
	if r := h.rev(); r != total {
		t.Fatalf("revision %d after %d writes", r, total)
	}
	if n := h.list(storage.ListOptions{Type: "MeshRetry"}).Total; n != total {
		t.Fatalf("%d resources stored, want %d", n, total)
	}
	for _, rs := range acked {
		for _, r := range rs {
			checkRes(t, "acknowledged write", h.get(r.Key()), r)
		}
	}
	for name, ch := range map[string]<-chan storage.Event{"live": live, "from 0": h.watch(0)} {
		events := recvN(t, ch, total)
		for i, ev := range events {
			if ev.Kind != storage.EventPut || ev.Revision != uint64(i+1) {
				t.Fatalf("%s: event %d is %v at revision %d, want a put at %d", name, i, ev.Kind, ev.Revision, i+1)
			}
			checkRes(t, name, ev.Resource, h.get(ev.Resource.Key()))
		}
	}
}

type counterSpec struct {
	N int `json:"n"`
}

// testConcurrentConflicts: optimistic concurrency under contention. Writers
// increment one counter with read-modify-write retried on ErrConflict; no
// increment is lost or doubled, and a conflicting write never fails or
// delays the others' unrelated writes.
func testConcurrentConflicts(t *testing.T, f Factory) {
	const increments = 10
	h := newHarness(t, f)
	counter := key("MeshRetry/default//counter")
	h.create(mk("MeshRetry/default//counter", `{"n":0}`))
	conflicts := make([]int, writers)
	parallel(writers, func(w int) {
		for i := range increments {
			n, err := increment(h, counter)
			conflicts[w] += n
			if err != nil {
				t.Errorf("writer %d: increment: %v", w, err)
				return
			}
			if _, _, err := h.s.Put(h.ctx, mk(fmt.Sprintf("MeshRetry/default//w%d-%d", w, i), `{}`)); err != nil {
				t.Errorf("writer %d: unrelated put beside conflicts: %v", w, err)
				return
			}
		}
	})
	if t.Failed() {
		return
	}
	got := h.get(counter)
	var spec counterSpec
	if err := json.Unmarshal(got.Spec, &spec); err != nil {
		t.Fatal(err)
	}
	const total = writers * increments
	if spec.N != total || got.Version != total+1 {
		t.Errorf("counter n=%d version=%d, want n=%d version=%d", spec.N, got.Version, total, total+1)
	}
	if r := h.rev(); r != 1+2*total {
		t.Errorf("revision %d, want %d", r, 1+2*total)
	}
	sum := 0
	for _, c := range conflicts {
		sum += c
	}
	t.Logf("%d conflicts retried", sum)
}

// increment adds one to the counter, retrying on conflict; it returns the
// number of conflicts it met.
func increment(h *harness, k resource.Key) (int, error) {
	for conflicts := 0; ; conflicts++ {
		cur, err := h.s.Get(h.ctx, k)
		if err != nil {
			return conflicts, err
		}
		var spec counterSpec
		if err := json.Unmarshal(cur.Spec, &spec); err != nil {
			return conflicts, err
		}
		next := cur.Clone()
		next.Spec = fmt.Appendf(nil, `{"n":%d}`, spec.N+1)
		_, err = h.s.Update(h.ctx, next)
		if !errors.Is(err, storage.ErrConflict) {
			return conflicts, err
		}
	}
}

// testConcurrentBatches: batches that fail on a version conflict, running
// beside good batches and single writes, write nothing and fail nothing
// else; revisions stay gap-free with one per successful batch.
func testConcurrentBatches(t *testing.T, f Factory) {
	const rounds = 10
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//guard", `{}`))
	parallel(writers, func(w int) {
		for i := range rounds {
			if w%2 == 0 {
				if _, _, err := h.s.Put(h.ctx, mk(fmt.Sprintf("MeshRetry/single//w%d-%d", w, i), `{}`)); err != nil {
					t.Errorf("writer %d: put: %v", w, err)
				}
				continue
			}
			b := storage.Batch{}
			for j := range 3 {
				b.Puts = append(b.Puts, mk(fmt.Sprintf("MeshRetry/batch//w%d-%d-%d", w, i, j), `{}`))
			}
			if i%2 == 1 {
				bad := mk("MeshRetry/default//guard", `{"changed":true}`)
				bad.Version = 99
				b.Puts = append(b.Puts, bad)
			}
			_, err := h.s.Apply(h.ctx, b)
			switch {
			case i%2 == 1 && !errors.Is(err, storage.ErrConflict):
				t.Errorf("writer %d: conflicting batch: error %v, want ErrConflict", w, err)
			case i%2 == 0 && err != nil:
				t.Errorf("writer %d: batch: %v", w, err)
			}
		}
	})
	if t.Failed() {
		return
	}
	singles, batches := writers/2*rounds, writers/2*rounds/2
	head := uint64(1 + singles + batches)
	if r := h.rev(); r != head {
		t.Fatalf("revision %d, want %d", r, head)
	}
	for w := 1; w < writers; w += 2 {
		for i := range rounds {
			_, err := h.s.Get(h.ctx, key(fmt.Sprintf("MeshRetry/batch//w%d-%d-0", w, i)))
			if i%2 == 1 {
				checkErr(t, "resource of a failed batch", err, storage.ErrNotFound)
			} else {
				checkErr(t, "resource of a good batch", err, nil)
			}
		}
	}
	if g := h.get(key("MeshRetry/default//guard")); g.Version != 1 {
		t.Errorf("guard written by a failed batch: version %d", g.Version)
	}
	events := recvN(t, h.watch(0), 1+singles+3*batches)
	var prev uint64
	perRev := map[uint64]int{}
	for _, ev := range events {
		if ev.Revision < prev || ev.Revision > prev+1 {
			t.Fatalf("revision %d after %d: out of order or a gap", ev.Revision, prev)
		}
		prev = ev.Revision
		perRev[ev.Revision]++
	}
	if prev != head {
		t.Errorf("watch ended at revision %d, want %d", prev, head)
	}
	for rev, n := range perRev {
		if n != 1 && n != 3 {
			t.Errorf("revision %d has %d changes, want 1 (single) or 3 (batch)", rev, n)
		}
	}
}
