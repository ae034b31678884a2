package storagetest

import (
	"context"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// testReopen: everything survives Close and Open: resources with their
// versions and times, the revision, meta, the change log (watch from 0 and
// from the middle) and the compacted revision; writes continue from there.
func testReopen(t *testing.T, f Factory) {
	h := newHarness(t, f)
	rec := fixtureWithRewrites(h)
	rec.del("MeshTimeout/default//t")
	rec.create(mk("MeshTimeout/default//t2", `{}`))
	h.apply(storage.Batch{Meta: map[string][]byte{"peer/global": []byte("1234")}})
	h.clock.Advance(2 * retention)
	rec.create(mk("MeshRetry/default//late", `{}`))
	h.expire()
	compacted, err := h.s.CompactedRevision(h.ctx)
	if err != nil || compacted == 0 {
		t.Fatalf("compacted revision %d, %v: the expiry pass should have dropped old deletes", compacted, err)
	}
	head := h.rev()
	before := h.storeState("MeshRetry", "MeshTimeout")

	h.reopen()
	if r := h.rev(); r != head {
		t.Errorf("revision %d after reopen, want %d", r, head)
	}
	if c, err := h.s.CompactedRevision(h.ctx); err != nil || c != compacted {
		t.Errorf("compacted revision %d, %v after reopen, want %d", c, err, compacted)
	}
	checkState(t, "after reopen", h.storeState("MeshRetry", "MeshTimeout"), before)
	if m, err := h.s.Meta(h.ctx, "peer/global"); err != nil || string(m) != "1234" {
		t.Errorf("meta after reopen = %q, %v", m, err)
	}
	_, err = h.s.Watch(h.ctx, compacted-1)
	checkErr(t, "watch below compacted after reopen", err, storage.ErrCompacted)
	for _, from := range []uint64{compacted, (compacted + head) / 2} {
		got := recvThrough(t, h.watch(from), head)
		checkStream(t, "after reopen", rec.hist, from, got)
		checkState(t, "after reopen", replay(stateAt(rec.hist, from), got), before)
	}
	live := h.watch(head)
	rec.create(mk("MeshRetry/default//after", `{}`))
	if r := h.rev(); r != head+1 {
		t.Errorf("first write after reopen at revision %d, want %d", r, head+1)
	}
	checkExact(t, "live after reopen", rec.hist, head, recvN(t, live, 1))
}

// testClosed: a closed store refuses everything with ErrClosed and closing
// again is harmless.
func testClosed(t *testing.T, f Factory) {
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//a", `{}`))
	s, ctx := h.s, h.ctx
	h.close()
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	k := key("MeshRetry/default//a")
	tests := []struct {
		name string
		call func() error
	}{
		{"get", func() error { _, err := s.Get(ctx, k); return err }},
		{"list", func() error { _, err := s.List(ctx, storage.ListOptions{Type: "MeshRetry"}); return err }},
		{"create", func() error { _, err := s.Create(ctx, mk("MeshRetry/default//b", `{}`)); return err }},
		{"update", func() error { _, err := s.Update(ctx, mk("MeshRetry/default//a", `{}`)); return err }},
		{"put", func() error { _, _, err := s.Put(ctx, mk("MeshRetry/default//b", `{}`)); return err }},
		{"delete", func() error { return s.Delete(ctx, k, 0) }},
		{"apply", func() error {
			_, err := s.Apply(ctx, storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//b", `{}`)}})
			return err
		}},
		{"meta", func() error { _, err := s.Meta(ctx, "x"); return err }},
		{"revision", func() error { _, err := s.Revision(ctx); return err }},
		{"compacted revision", func() error { _, err := s.CompactedRevision(ctx); return err }},
		{"watch", func() error { _, err := s.Watch(ctx, 0); return err }},
		{"expire", func() error { return f.ExpireTombstones(context.Background(), s) }},
	}
	for _, tc := range tests {
		checkErr(t, tc.name, tc.call(), storage.ErrClosed)
	}
}

// testStoreID: a store keeps its id across reopening; a new store (another
// directory) gets another.
func testStoreID(t *testing.T, f Factory) {
	h := newHarness(t, f)
	id := h.s.ID()
	if len(id) < 16 {
		t.Fatalf("store id %q is too short to be unique", id)
	}
	h.reopen()
	if got := h.s.ID(); got != id {
		t.Fatalf("store id changed on reopen: %q, was %q", got, id)
	}
	other := newHarness(t, f)
	if other.s.ID() == id {
		t.Fatalf("two stores share id %q", id)
	}
}
