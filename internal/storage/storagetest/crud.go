package storagetest

import (
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func testCreateGet(t *testing.T, f Factory) {
	h := newHarness(t, f)
	t0 := h.clock.Now()
	tests := []struct {
		name string
		in   *resource.Resource
	}{
		{"mesh scoped", mk("MeshTimeout/default//a", `{"x":1}`, "team", "a")},
		{"namespaced", mk("MeshTimeout/default/ns1/a", `{"x":2}`)},
		{"global scoped", mk("Mesh///default", `{}`)},
		{"with status", func() *resource.Resource {
			r := mk("Dataplane/default//dp", `{"networking":{}}`)
			r.Status = []byte(`{"ok":true}`)
			return r
		}()},
		{"version and times ignored", func() *resource.Resource {
			r := mk("MeshRetry/default//r", `{}`)
			r.Version, r.CreationTime = 42, t0.Add(-time.Hour)
			return r
		}()},
	}
	for _, tc := range tests {
		got := h.create(tc.in)
		want := stamped(tc.in, 1, t0, t0)
		checkRes(t, tc.name+": create result", got, want)
		checkRes(t, tc.name+": get", h.get(tc.in.Key()), want)
		_, err := h.s.Create(h.ctx, tc.in)
		checkErr(t, tc.name+": create again", err, storage.ErrAlreadyExists)
	}
	_, err := h.s.Get(h.ctx, key("MeshTimeout/default//absent"))
	checkErr(t, "get absent", err, storage.ErrNotFound)
	_, err = h.s.Get(h.ctx, key("MeshTimeout/other//a"))
	checkErr(t, "get in another mesh", err, storage.ErrNotFound)
}

func testUpdate(t *testing.T, f Factory) {
	h := newHarness(t, f)
	t0 := h.clock.Now()
	h.create(mk("MeshTimeout/default//a", `{"v":1}`))
	tests := []struct {
		name    string
		in      *resource.Resource
		version uint64
		wantErr error
		wantVer uint64
	}{
		{"no version check", mk("MeshTimeout/default//a", `{"v":2}`), 0, nil, 2},
		{"matching version", mk("MeshTimeout/default//a", `{"v":3}`, "l", "1"), 2, nil, 3},
		{"stale version", mk("MeshTimeout/default//a", `{"v":4}`), 2, storage.ErrConflict, 3},
		{"future version", mk("MeshTimeout/default//a", `{"v":4}`), 9, storage.ErrConflict, 3},
		{"same content still writes", mk("MeshTimeout/default//a", `{"v":3}`, "l", "1"), 3, nil, 4},
		{"absent", mk("MeshTimeout/default//b", `{}`), 0, storage.ErrNotFound, 0},
		{"absent with version", mk("MeshTimeout/default//b", `{}`), 1, storage.ErrNotFound, 0},
	}
	for _, tc := range tests {
		h.clock.Advance(time.Second)
		before := h.rev()
		tc.in.Version = tc.version
		got, err := h.s.Update(h.ctx, tc.in)
		checkErr(t, tc.name, err, tc.wantErr)
		if tc.wantErr != nil {
			if h.rev() != before {
				t.Errorf("%s: failed update moved the revision %d -> %d", tc.name, before, h.rev())
			}
			continue
		}
		want := stamped(tc.in, tc.wantVer, t0, h.clock.Now())
		checkRes(t, tc.name, got, want)
		checkRes(t, tc.name+": get", h.get(tc.in.Key()), want)
		if h.rev() != before+1 {
			t.Errorf("%s: revision %d, want %d", tc.name, h.rev(), before+1)
		}
	}
}

func testPut(t *testing.T, f Factory) {
	h := newHarness(t, f)
	withStatus := func(r *resource.Resource, s string) *resource.Resource {
		r.Status = []byte(s)
		return r
	}
	tests := []struct {
		name     string
		in       *resource.Resource
		version  uint64
		wantErr  error
		want     storage.Outcome
		wantVer  uint64
		modified bool // ModificationTime moves to now
	}{
		{"absent with version", mk("MeshRetry/default//a", `{}`), 1, storage.ErrConflict, 0, 0, false},
		{"create", mk("MeshRetry/default//a", `{"v":1}`, "team", "a"), 0, nil, storage.Created, 1, true},
		{"same content", mk("MeshRetry/default//a", `{"v":1}`, "team", "a"), 0, nil, storage.Unchanged, 1, false},
		{"same content matching version", mk("MeshRetry/default//a", `{"v":1}`, "team", "a"), 1, nil, storage.Unchanged, 1, false},
		{"same content stale version", mk("MeshRetry/default//a", `{"v":1}`, "team", "a"), 5, storage.ErrConflict, 0, 1, false},
		{"spec change", mk("MeshRetry/default//a", `{"v":2}`, "team", "a"), 0, nil, storage.Updated, 2, true},
		{"label change", mk("MeshRetry/default//a", `{"v":2}`, "team", "b"), 2, nil, storage.Updated, 3, true},
		{"labels removed", mk("MeshRetry/default//a", `{"v":2}`), 0, nil, storage.Updated, 4, true},
		{"status change", withStatus(mk("MeshRetry/default//a", `{"v":2}`), `{"s":1}`), 0, nil, storage.Updated, 5, true},
		{"same status", withStatus(mk("MeshRetry/default//a", `{"v":2}`), `{"s":1}`), 0, nil, storage.Unchanged, 5, false},
		{"stale version", mk("MeshRetry/default//a", `{"v":3}`), 4, storage.ErrConflict, 0, 5, false},
	}
	var created, lastMod time.Time
	for _, tc := range tests {
		h.clock.Advance(time.Second)
		before := h.rev()
		tc.in.Version = tc.version
		got, outcome, err := h.s.Put(h.ctx, tc.in)
		checkErr(t, tc.name, err, tc.wantErr)
		wantRev := before
		if tc.wantErr == nil {
			if outcome != tc.want {
				t.Errorf("%s: outcome %s, want %s", tc.name, outcome, tc.want)
			}
			if outcome == storage.Created {
				created = h.clock.Now()
			}
			if tc.modified {
				lastMod = h.clock.Now()
				wantRev++
			}
			want := stamped(tc.in, tc.wantVer, created, lastMod)
			checkRes(t, tc.name, got, want)
			checkRes(t, tc.name+": get", h.get(tc.in.Key()), want)
		}
		if h.rev() != wantRev {
			t.Errorf("%s: revision %d, want %d", tc.name, h.rev(), wantRev)
		}
	}
}

func testDelete(t *testing.T, f Factory) {
	h := newHarness(t, f)
	h.create(mk("MeshRetry/default//a", `{}`))
	h.put(mk("MeshRetry/default//a", `{"v":2}`))
	h.create(mk("MeshRetry/default//b", `{}`))
	tests := []struct {
		name    string
		key     string
		version uint64
		wantErr error
	}{
		{"absent", "MeshRetry/default//zzz", 0, storage.ErrNotFound},
		{"absent with version", "MeshRetry/default//zzz", 1, storage.ErrNotFound},
		{"stale version", "MeshRetry/default//a", 1, storage.ErrConflict},
		{"matching version", "MeshRetry/default//a", 2, nil},
		{"already deleted", "MeshRetry/default//a", 0, storage.ErrNotFound},
		{"no version check", "MeshRetry/default//b", 0, nil},
	}
	for _, tc := range tests {
		before := h.rev()
		err := h.s.Delete(h.ctx, key(tc.key), tc.version)
		checkErr(t, tc.name, err, tc.wantErr)
		wantRev := before
		if tc.wantErr == nil {
			wantRev++
			_, err := h.s.Get(h.ctx, key(tc.key))
			checkErr(t, tc.name+": get after delete", err, storage.ErrNotFound)
		}
		if h.rev() != wantRev {
			t.Errorf("%s: revision %d, want %d", tc.name, h.rev(), wantRev)
		}
	}
	// A re-created resource starts over at version 1 with a new CreationTime.
	h.clock.Advance(time.Minute)
	got := h.create(mk("MeshRetry/default//a", `{}`))
	checkRes(t, "re-create", got, stamped(mk("MeshRetry/default//a", `{}`), 1, h.clock.Now(), h.clock.Now()))
}

func testInvalid(t *testing.T, f Factory) {
	h := newHarness(t, f)
	tests := []struct {
		name string
		call func() error
	}{
		{"create without name", func() error { _, err := h.s.Create(h.ctx, mk("MeshRetry/default//", `{}`)); return err }},
		{"create without type", func() error { _, err := h.s.Create(h.ctx, mk("/default//a", `{}`)); return err }},
		{"create with NUL", func() error { _, err := h.s.Create(h.ctx, mk("MeshRetry/def\x00ault//a", `{}`)); return err }},
		{"nil put", func() error { _, _, err := h.s.Put(h.ctx, nil); return err }},
		{"get without name", func() error { _, err := h.s.Get(h.ctx, key("MeshRetry/default//")); return err }},
		{"delete without type", func() error { return h.s.Delete(h.ctx, key("/default//a"), 0) }},
		{"list without type", func() error { _, err := h.s.List(h.ctx, storage.ListOptions{}); return err }},
		{"list negative offset", func() error {
			_, err := h.s.List(h.ctx, storage.ListOptions{Type: "MeshRetry", Offset: -1})
			return err
		}},
		{"list negative limit", func() error {
			_, err := h.s.List(h.ctx, storage.ListOptions{Type: "MeshRetry", Limit: -1})
			return err
		}},
		{"meta empty key", func() error { _, err := h.s.Meta(h.ctx, ""); return err }},
		{"batch nil put", func() error {
			_, err := h.s.Apply(h.ctx, storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//ok", `{}`), nil}})
			return err
		}},
		{"batch bad delete", func() error {
			_, err := h.s.Apply(h.ctx, storage.Batch{Deletes: []resource.Key{key("MeshRetry/default//")}})
			return err
		}},
		{"batch empty meta key", func() error {
			_, err := h.s.Apply(h.ctx, storage.Batch{Meta: map[string][]byte{"": []byte("x")}})
			return err
		}},
	}
	for _, tc := range tests {
		checkErr(t, tc.name, tc.call(), storage.ErrInvalid)
	}
	if h.rev() != 0 {
		t.Errorf("invalid requests moved the revision to %d", h.rev())
	}
	if n := h.list(storage.ListOptions{Type: "MeshRetry"}).Total; n != 0 {
		t.Errorf("invalid requests stored %d resources", n)
	}
}

// testIsolation: the store keeps no reference to what it is given and hands
// out copies.
func testIsolation(t *testing.T, f Factory) {
	h := newHarness(t, f)
	in := mk("MeshRetry/default//a", `{"v":1}`, "team", "a")
	out := h.create(in)
	in.Labels.Set("team", "changed")
	in.Spec[2] = 'X'
	out.Labels.Set("team", "changed too")
	out.Spec[2] = 'Y'
	got := h.get(key("MeshRetry/default//a"))
	checkRes(t, "after mutating input and output", got, stamped(mk("MeshRetry/default//a", `{"v":1}`, "team", "a"), 1, h.clock.Now(), h.clock.Now()))
	got.Labels.Set("team", "x")
	items := h.list(storage.ListOptions{Type: "MeshRetry"}).Items
	if len(items) != 1 || items[0].Labels.Get("team") != "a" {
		t.Errorf("mutating a Get result changed the store: %+v", items)
	}
}

func testRevisions(t *testing.T, f Factory) {
	h := newHarness(t, f)
	if r := h.rev(); r != 0 {
		t.Fatalf("empty store at revision %d", r)
	}
	steps := []struct {
		name  string
		write func()
		bump  bool
	}{
		{"create", func() { h.create(mk("MeshRetry/default//a", `{}`)) }, true},
		{"put new", func() { h.put(mk("MeshRetry/default//b", `{}`)) }, true},
		{"put unchanged", func() { h.put(mk("MeshRetry/default//b", `{}`)) }, false},
		{"put changed", func() { h.put(mk("MeshRetry/default//b", `{"x":1}`)) }, true},
		{"update", func() { _, _ = h.s.Update(h.ctx, mk("MeshRetry/default//a", `{}`)) }, true},
		{"failed create", func() { _, _ = h.s.Create(h.ctx, mk("MeshRetry/default//a", `{}`)) }, false},
		{"batch of three", func() {
			h.apply(storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//c", `{}`), mk("MeshRetry/default//d", `{}`)},
				Deletes: []resource.Key{key("MeshRetry/default//a")}})
		}, true},
		{"batch of unchanged puts, absent deletes and meta", func() {
			h.apply(storage.Batch{Puts: []*resource.Resource{mk("MeshRetry/default//c", `{}`)},
				Deletes: []resource.Key{key("MeshRetry/default//a")}, Meta: map[string][]byte{"k": []byte("v")}})
		}, false},
		{"empty batch", func() { h.apply(storage.Batch{}) }, false},
		{"delete", func() { h.del(key("MeshRetry/default//c"), 0) }, true},
		{"failed delete", func() { _ = h.s.Delete(h.ctx, key("MeshRetry/default//c"), 0) }, false},
	}
	for _, st := range steps {
		before := h.rev()
		st.write()
		want := before
		if st.bump {
			want++
		}
		if got := h.rev(); got != want {
			t.Errorf("%s: revision %d -> %d, want %d", st.name, before, got, want)
		}
	}
}
