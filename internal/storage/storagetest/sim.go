package storagetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// testSimulation applies a seeded random sequence of operations to the
// store and to the model, comparing every answer and the whole content
// after each step; at the end, watch streams (live from the start, from 0,
// from a random revision) replayed must give the store's content. A
// failure names the seed and step so it can be replayed.
func testSimulation(t *testing.T, f Factory) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			runSimulation(t, f, seed, 250)
		})
	}
}

// The simulation's types and meta keys; functions so that nothing
// package-level is mutable.
func simTypes() []string { return []string{"MeshRetry", "MeshTimeout"} }
func simMeta() []string  { return []string{"peer/a", "peer/b"} }

func pick[T any](rng *rand.Rand, from []T) T { return from[rng.IntN(len(from))] }

type sim struct {
	t   *testing.T
	h   *harness
	m   *model
	rng *rand.Rand
	ops int
}

func runSimulation(t *testing.T, f Factory, seed uint64, steps int) {
	h := newHarness(t, f)
	s := &sim{t: t, h: h, m: newModel(h.clock), rng: rand.New(rand.NewPCG(seed, 0x5eed))}
	live := h.watch(0)
	ops := []struct {
		weight int
		run    func()
	}{
		{12, s.create}, {12, s.update}, {25, s.put}, {12, s.delete}, {15, s.apply},
		{6, s.advance}, {8, s.list}, {5, s.get}, {5, s.readMeta},
	}
	total := 0
	for _, op := range ops {
		total += op.weight
	}
	for step := range steps {
		s.ops = step
		n := s.rng.IntN(total)
		for _, op := range ops {
			if n -= op.weight; n < 0 {
				op.run()
				break
			}
		}
		s.checkAll()
		if t.Failed() {
			t.Fatalf("seed %d diverged at step %d", seed, step)
		}
	}
	s.finalWatches(live)
}

// Keys come from a small space so that operations collide.
func (s *sim) randKey() resource.Key {
	return resource.Key{
		Type:      pick(s.rng, simTypes()),
		Mesh:      []string{"default", "other"}[s.rng.IntN(2)],
		Namespace: []string{"", "ns"}[s.rng.IntN(2)],
		Name:      []string{"a", "b", "c"}[s.rng.IntN(3)],
	}
}

func (s *sim) randResource() *resource.Resource {
	k := s.randKey()
	r := &resource.Resource{Type: k.Type, Mesh: k.Mesh, Namespace: k.Namespace, Name: k.Name}
	r.Spec = []byte([]string{`{"v":1}`, `{"v":2}`, `{"to":[{"x":true}]}`}[s.rng.IntN(3)])
	r.Labels = []resource.Labels{{}, resource.LabelsOf("team", "a"), resource.LabelsOf("team", "b"),
		resource.LabelsOf("team", "a", "env", "prod")}[s.rng.IntN(4)]
	if s.rng.IntN(5) == 0 {
		r.Status = []byte(`{"ok":true}`)
	}
	r.Version = s.randVersion(k)
	return r
}

// randVersion is mostly 0 (no check), often the current version, sometimes
// a wrong one.
func (s *sim) randVersion(k resource.Key) uint64 {
	var cur uint64
	if r := s.m.items[k]; r != nil {
		cur = r.Version
	}
	switch n := s.rng.IntN(10); {
	case n < 6:
		return 0
	case n < 9 && cur > 0:
		return cur
	default:
		return cur + 1 + uint64(s.rng.IntN(3))
	}
}

func (s *sim) compare(op string, gotErr, wantErr error) bool {
	s.t.Helper()
	switch {
	case wantErr == nil && gotErr != nil:
		s.t.Errorf("step %d %s: error %v, model succeeded", s.ops, op, gotErr)
	case wantErr != nil && !errors.Is(gotErr, wantErr):
		s.t.Errorf("step %d %s: error %v, model says %v", s.ops, op, gotErr, wantErr)
	}
	return wantErr == nil && gotErr == nil
}

func (s *sim) write(name string, mode writeMode) {
	r := s.randResource()
	var want *resource.Resource
	var wantO storage.Outcome
	wantErr := s.m.single(func(tx *modelTx) (err error) {
		want, wantO, err = tx.write(r, mode)
		return err
	})
	var got *resource.Resource
	var gotO storage.Outcome
	var err error
	switch mode {
	case writeCreate:
		got, err = s.h.s.Create(s.h.ctx, r)
		gotO = wantO
	case writeUpdate:
		got, err = s.h.s.Update(s.h.ctx, r)
		gotO = wantO
	case writePut:
		got, gotO, err = s.h.s.Put(s.h.ctx, r)
	}
	what := fmt.Sprintf("%s %s v%d", name, r.Key(), r.Version)
	if s.compare(what, err, wantErr) {
		checkRes(s.t, what, got, want)
		if gotO != wantO {
			s.t.Errorf("step %d %s: outcome %s, model says %s", s.ops, what, gotO, wantO)
		}
	}
}

func (s *sim) create() { s.write("create", writeCreate) }
func (s *sim) update() { s.write("update", writeUpdate) }
func (s *sim) put()    { s.write("put", writePut) }

func (s *sim) delete() {
	k := s.randKey()
	v := s.randVersion(k)
	wantErr := s.m.single(func(tx *modelTx) error { return tx.del(k, v) })
	s.compare(fmt.Sprintf("delete %s v%d", k, v), s.h.s.Delete(s.h.ctx, k, v), wantErr)
}

func (s *sim) apply() {
	var b storage.Batch
	for range 1 + s.rng.IntN(4) {
		b.Puts = append(b.Puts, s.randResource())
	}
	for range s.rng.IntN(3) {
		b.Deletes = append(b.Deletes, s.randKey())
	}
	if s.rng.IntN(2) == 0 {
		b.Meta = map[string][]byte{pick(s.rng, simMeta()): fmt.Appendf(nil, "%d", s.ops)}
	}
	want, wantErr := s.m.apply(b)
	got, err := s.h.s.Apply(s.h.ctx, b)
	if s.compare("apply", err, wantErr) {
		checkBatchResult(s.t, fmt.Sprintf("step %d apply", s.ops), got, want)
	}
}

func (s *sim) advance() {
	s.h.clock.Advance(time.Duration(1+s.rng.IntN(5000)) * time.Millisecond)
}

func (s *sim) list() {
	opts := storage.ListOptions{
		Type:   pick(s.rng, simTypes()),
		Mesh:   []string{"", "default", "other"}[s.rng.IntN(3)],
		Labels: []map[string]string{nil, {"team": "a"}, {"env": "prod"}}[s.rng.IntN(3)],
		Offset: s.rng.IntN(4),
		Limit:  s.rng.IntN(4),
	}
	if ns := s.rng.IntN(3); ns > 0 {
		opts.Namespace = ptr([]string{"", "ns"}[ns-1])
	}
	got := s.h.list(opts)
	want := s.m.list(opts)
	what := fmt.Sprintf("step %d list %+v", s.ops, opts)
	if got.Total != want.Total || !slices.Equal(keysOf(got.Items), keysOf(want.Items)) {
		s.t.Errorf("%s: %v (total %d), model %v (total %d)", what, keysOf(got.Items), got.Total, keysOf(want.Items), want.Total)
		return
	}
	for i := range got.Items {
		checkRes(s.t, what, got.Items[i], want.Items[i])
	}
}

func (s *sim) get() {
	k := s.randKey()
	got, err := s.h.s.Get(s.h.ctx, k)
	want := s.m.items[k]
	var wantErr error
	if want == nil {
		wantErr = storage.ErrNotFound
	}
	if s.compare("get "+k.String(), err, wantErr) {
		checkRes(s.t, fmt.Sprintf("step %d get", s.ops), got, want)
	}
}

func (s *sim) readMeta() {
	k := pick(s.rng, simMeta())
	got, err := s.h.s.Meta(s.h.ctx, k)
	want, ok := s.m.meta[k]
	var wantErr error
	if !ok {
		wantErr = storage.ErrNotFound
	}
	if s.compare("meta "+k, err, wantErr) && string(got) != string(want) {
		s.t.Errorf("step %d meta %s = %q, model %q", s.ops, k, got, want)
	}
}

// checkAll compares the revision and the whole content with the model.
func (s *sim) checkAll() {
	if r := s.h.rev(); r != s.m.rev {
		s.t.Errorf("step %d: revision %d, model %d", s.ops, r, s.m.rev)
	}
	checkState(s.t, fmt.Sprintf("step %d", s.ops), s.h.storeState(simTypes()...), s.m.items)
}

func (s *sim) finalWatches(live <-chan storage.Event) {
	sentinel := &resource.Resource{Type: "MeshRetry", Mesh: "default", Name: "sentinel", Spec: []byte(`{}`)}
	if err := s.m.single(func(tx *modelTx) error { _, _, err := tx.write(sentinel, writePut); return err }); err != nil {
		s.t.Fatal(err)
	}
	s.h.put(sentinel)
	head := s.m.rev
	mid := uint64(s.rng.IntN(int(head)))
	streams := []struct {
		name string
		from uint64
		ch   <-chan storage.Event
	}{
		{"live from the start", 0, live},
		{"catch-up from 0", 0, s.h.watch(0)},
		{fmt.Sprintf("catch-up from %d", mid), mid, s.h.watch(mid)},
	}
	for _, st := range streams {
		got := recvThrough(s.t, st.ch, head)
		checkStream(s.t, st.name, s.m.hist, st.from, got)
		checkState(s.t, st.name, replay(stateAt(s.m.hist, st.from), got), s.m.items)
	}
}
