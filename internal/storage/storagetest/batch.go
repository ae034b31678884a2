package storagetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func testApply(t *testing.T, f Factory) {
	h := newHarness(t, f)
	t0 := h.clock.Now()
	h.create(mk("MeshRetry/default//a", `{"v":1}`))
	h.create(mk("MeshRetry/default//b", `{"v":1}`))
	h.create(mk("MeshRetry/default//e", `{"v":1}`))
	h.clock.Advance(time.Minute)
	t1 := h.clock.Now()

	a2 := mk("MeshRetry/default//a", `{"v":2}`)
	a2.Version = 1
	res := h.apply(storage.Batch{
		Puts:    []*resource.Resource{a2, mk("MeshRetry/default//c", `{"v":1}`), mk("MeshRetry/default//b", `{"v":1}`)},
		Deletes: []resource.Key{key("MeshRetry/default//absent"), key("MeshRetry/default//e")},
		Meta:    map[string][]byte{"peer": []byte("42")},
	})
	want := &storage.BatchResult{Revision: 4, Outcomes: []storage.Outcome{storage.Updated, storage.Created, storage.Unchanged}, Deleted: 1}
	checkBatchResult(t, "mixed batch", res, want)
	checkRes(t, "updated in batch", h.get(key("MeshRetry/default//a")), stamped(mk("MeshRetry/default//a", `{"v":2}`), 2, t0, t1))
	checkRes(t, "created in batch", h.get(key("MeshRetry/default//c")), stamped(mk("MeshRetry/default//c", `{"v":1}`), 1, t1, t1))
	checkRes(t, "unchanged in batch", h.get(key("MeshRetry/default//b")), stamped(mk("MeshRetry/default//b", `{"v":1}`), 1, t0, t0))
	_, err := h.s.Get(h.ctx, key("MeshRetry/default//e"))
	checkErr(t, "deleted in batch", err, storage.ErrNotFound)

	// Later entries see earlier ones: puts in order, then deletes.
	res = h.apply(storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//f", `{"v":1}`), mk("MeshRetry/default//f", `{"v":2}`)}})
	checkBatchResult(t, "same key twice", res, &storage.BatchResult{Revision: 5, Outcomes: []storage.Outcome{storage.Created, storage.Updated}})
	checkRes(t, "same key twice", h.get(key("MeshRetry/default//f")), stamped(mk("MeshRetry/default//f", `{"v":2}`), 2, t1, t1))
	res = h.apply(storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//g", `{}`)}, Deletes: []resource.Key{key("MeshRetry/default//g")}})
	checkBatchResult(t, "put then delete", res, &storage.BatchResult{Revision: 6, Outcomes: []storage.Outcome{storage.Created}, Deleted: 1})
	_, err = h.s.Get(h.ctx, key("MeshRetry/default//g"))
	checkErr(t, "put then delete", err, storage.ErrNotFound)

	res = h.apply(storage.Batch{Deletes: []resource.Key{key("MeshRetry/default//g")}})
	checkBatchResult(t, "nothing to do", res, &storage.BatchResult{Revision: 6, Outcomes: []storage.Outcome{}})
}

func checkBatchResult(t *testing.T, what string, got, want *storage.BatchResult) {
	t.Helper()
	if got.Revision != want.Revision || got.Deleted != want.Deleted || !slices.Equal(got.Outcomes, want.Outcomes) {
		t.Errorf("%s: result %+v, want %+v", what, got, want)
	}
}

// snapshot is everything observable about a small store, to compare before
// and after a failed write.
type snapshot struct {
	rev   uint64
	items []*resource.Resource
}

func (h *harness) snapshot(types ...string) snapshot {
	h.t.Helper()
	s := snapshot{rev: h.rev()}
	for _, typ := range types {
		s.items = append(s.items, h.list(storage.ListOptions{Type: typ}).Items...)
	}
	return s
}

func checkSnapshot(t *testing.T, what string, got, want snapshot) {
	t.Helper()
	if got.rev != want.rev {
		t.Errorf("%s: revision %d, want %d", what, got.rev, want.rev)
	}
	if !slices.Equal(keysOf(got.items), keysOf(want.items)) {
		t.Fatalf("%s: resources %v, want %v", what, keysOf(got.items), keysOf(want.items))
	}
	for i := range got.items {
		checkRes(t, what, got.items[i], want.items[i])
	}
}

func testApplyAtomic(t *testing.T, f Factory) {
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//a", `{"v":1}`))
	h.create(mk("MeshRetry/default//b", `{"v":1}`))
	h.create(mk("MeshTimeout/default//t", `{"v":1}`))
	withVersion := func(r *resource.Resource, v uint64) *resource.Resource {
		r.Version = v
		return r
	}
	tests := []struct {
		name  string
		batch storage.Batch
	}{
		{"conflict on the last put", storage.Batch{
			Puts: []*resource.Resource{
				mk("MeshRetry/default//new", `{}`),
				mk("MeshTimeout/default//t", `{"v":2}`),
				withVersion(mk("MeshRetry/default//a", `{"v":2}`), 7),
			},
			Deletes: []resource.Key{key("MeshRetry/default//b")},
			Meta:    map[string][]byte{"peer": []byte("1")},
		}},
		{"conflict on the first put", storage.Batch{
			Puts: []*resource.Resource{
				withVersion(mk("MeshRetry/default//b", `{"v":2}`), 2),
				mk("MeshRetry/default//new", `{}`),
			},
			Deletes: []resource.Key{key("MeshRetry/default//a")},
		}},
		{"version for an absent resource", storage.Batch{
			Puts: []*resource.Resource{
				mk("MeshRetry/default//a", `{"v":9}`),
				withVersion(mk("MeshRetry/default//absent", `{}`), 1),
			},
		}},
		{"second write of a key with the first's version", storage.Batch{
			Puts: []*resource.Resource{
				withVersion(mk("MeshRetry/default//a", `{"v":3}`), 1),
				withVersion(mk("MeshRetry/default//a", `{"v":4}`), 1),
			},
		}},
	}
	for _, tc := range tests {
		before := h.snapshot("MeshRetry", "MeshTimeout")
		_, err := h.s.Apply(h.ctx, tc.batch)
		checkErr(t, tc.name, err, storage.ErrConflict)
		checkSnapshot(t, tc.name, h.snapshot("MeshRetry", "MeshTimeout"), before)
		_, err = h.s.Meta(h.ctx, "peer")
		checkErr(t, tc.name+": meta", err, storage.ErrNotFound)
	}
	// The store still takes writes after failed batches.
	a := mk("MeshRetry/default//a", `{"v":3}`)
	a.Version = 1
	res := h.apply(storage.Batch{Puts: []*resource.Resource{a}})
	checkBatchResult(t, "after failures", res, &storage.BatchResult{Revision: 4, Outcomes: []storage.Outcome{storage.Updated}})
}

func testMeta(t *testing.T, f Factory) {
	h := newHarness(t, f)
	_, err := h.s.Meta(h.ctx, "peer/global")
	checkErr(t, "absent", err, storage.ErrNotFound)

	h.apply(storage.Batch{Meta: map[string][]byte{"peer/global": []byte("17"), "empty": {}}})
	h.apply(storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//a", `{}`)}, Meta: map[string][]byte{"other": []byte("x")}})
	h.apply(storage.Batch{Meta: map[string][]byte{"peer/global": []byte("18")}})
	tests := []struct{ key, want string }{
		{"peer/global", "18"},
		{"empty", ""},
		{"other", "x"},
	}
	for _, tc := range tests {
		got, err := h.s.Meta(h.ctx, tc.key)
		checkErr(t, "meta "+tc.key, err, nil)
		if string(got) != tc.want {
			t.Errorf("meta %q = %q, want %q", tc.key, got, tc.want)
		}
	}
	got, _ := h.s.Meta(h.ctx, "peer/global")
	got[0] = 'X'
	if again, _ := h.s.Meta(h.ctx, "peer/global"); string(again) != "18" {
		t.Errorf("mutating a Meta result changed the store: %q", again)
	}
	if r := h.rev(); r != 1 {
		t.Errorf("revision %d after meta-only batches and one put, want 1", r)
	}
}

// testBatchCheck: Batch.Check runs in the write's transaction, sees what is
// committed, vetoes cleanly, and extends the batch with deletions.
func testBatchCheck(t *testing.T, f Factory) {
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//a", `{"v":1}`))
	h.create(mk("MeshRetry/default//b", `{"v":1}`))
	h.create(mk("MeshRetry/other//c", `{"v":1}`))
	before := h.snapshot("MeshRetry")

	veto := errors.New("vetoed")
	_, err := h.s.Apply(h.ctx, storage.Batch{
		Puts: []*resource.Resource{mk("MeshRetry/default//new", `{}`)},
		Check: func(tx storage.TxReader) ([]resource.Key, error) {
			if _, err := tx.Get(key("MeshRetry/default//a")); err != nil {
				return nil, err
			}
			if _, err := tx.Get(key("MeshRetry/default//absent")); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("check: get of an absent key: %v, want ErrNotFound", err)
			}
			return nil, veto
		},
	})
	checkErr(t, "vetoed batch", err, veto)
	checkSnapshot(t, "vetoed batch", h.snapshot("MeshRetry"), before)

	// A cascade computed inside the transaction: delete every MeshRetry of
	// mesh default, and put one.
	res, err := h.s.Apply(h.ctx, storage.Batch{
		Puts: []*resource.Resource{mk("MeshRetry/other//d", `{"v":1}`)},
		Check: func(tx storage.TxReader) ([]resource.Key, error) {
			list, err := tx.List(storage.ListOptions{Type: "MeshRetry", Mesh: "default"})
			if err != nil {
				return nil, err
			}
			var keys []resource.Key
			for _, r := range list.Items {
				keys = append(keys, r.Key())
			}
			return keys, nil
		},
	})
	if err != nil {
		t.Fatalf("cascade: %v", err)
	}
	if res.Deleted != 2 || len(res.Stored) != 1 || res.Stored[0].Name != "d" || res.Stored[0].Version != 1 {
		t.Errorf("cascade: result %+v (stored %v), want 2 deleted and d stored at version 1", res, res.Stored)
	}
	for _, k := range []string{"MeshRetry/default//a", "MeshRetry/default//b"} {
		_, err := h.s.Get(h.ctx, key(k))
		checkErr(t, "cascade deleted "+k, err, storage.ErrNotFound)
	}
	h.get(key("MeshRetry/other//c"))
}
