package boltstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// openTempStore opens a store with cfg in a test's temporary directory,
// closed when the test ends.
func openTempStore(t *testing.T, cfg Config) *Store {
	t.Helper()
	cfg.Path = filepath.Join(t.TempDir(), "s.db")
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// streamPart is part p of a stream: n MeshTimeouts named from p*n on.
func streamPart(p, n int) storage.Batch {
	b := storage.Batch{Puts: make([]*resource.Resource, n)}
	for i := range b.Puts {
		b.Puts[i] = benchResource(p*n+i, 0)
	}
	return b
}

func listCount(t *testing.T, s *Store) int {
	t.Helper()
	res, err := s.List(context.Background(), storage.ListOptions{Type: "MeshTimeout"})
	if err != nil {
		t.Fatal(err)
	}
	return res.Total
}

// TestStreamAppliesAsOneBatch: a stream's parts are invisible until
// Commit, which makes them, Commit's deletes and meta one revision, seen by
// a watcher as one revision's events.
func TestStreamAppliesAsOneBatch(t *testing.T) {
	ctx := context.Background()
	s := openTempStore(t, Config{})
	old, _, err := s.Put(ctx, benchResource(9999, 0))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	events, err := s.Watch(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.BeginApply(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for p := range 3 {
		if err := st.Put(streamPart(p, 100)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // let the committer write some parts
	if n := listCount(t, s); n != 1 {
		t.Errorf("before Commit a reader sees %d resources, want the 1 stored before", n)
	}
	res, err := st.Commit(storage.Batch{Deletes: []resource.Key{old.Key()}, Meta: map[string][]byte{"m": []byte("v")}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Revision != rev+1 || res.Deleted != 1 {
		t.Errorf("Commit: revision %d, deleted %d; want %d, 1", res.Revision, res.Deleted, rev+1)
	}
	if n := listCount(t, s); n != 300 {
		t.Errorf("after Commit: %d resources, want 300", n)
	}
	if v, err := s.Meta(ctx, "m"); err != nil || string(v) != "v" {
		t.Errorf("meta: %q, %v", v, err)
	}
	for i := range 301 {
		select {
		case ev := <-events:
			if ev.Revision != res.Revision {
				t.Fatalf("event %d at revision %d, want %d", i, ev.Revision, res.Revision)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d events of the stream's revision, want 301", i)
		}
	}
	st.Abort() // after Commit: nothing
}

// TestStreamHoldsOtherWrites: a write issued while a stream is open is
// committed after it, at the next revision.
func TestStreamHoldsOtherWrites(t *testing.T) {
	ctx := context.Background()
	s := openTempStore(t, Config{})
	st, err := s.BeginApply(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(streamPart(0, 10)); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, _, err := s.Put(ctx, benchResource(5000, 0)); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
		t.Fatal("a write committed while a stream was open")
	case <-time.After(100 * time.Millisecond):
	}
	res, err := st.Commit(storage.Batch{})
	if err != nil {
		t.Fatal(err)
	}
	<-done
	if rev, err := s.Revision(ctx); err != nil || rev != res.Revision+1 {
		t.Errorf("after the held write: revision %d (%v), want %d", rev, err, res.Revision+1)
	}
}

// TestStreamEnds: a stream that is abandoned, aborted, vetoed by a part's
// Check or cut off by Close writes nothing, says why, and frees the writer.
func TestStreamEnds(t *testing.T) {
	veto := errors.New("vetoed")
	tests := []struct {
		name string
		cfg  Config
		run  func(*Store, storage.ApplyStream)
		want error
	}{
		{"idle", Config{StreamIdle: 50 * time.Millisecond}, func(_ *Store, st storage.ApplyStream) {
			time.Sleep(200 * time.Millisecond)
		}, storage.ErrStreamAbandoned},
		{"open too long", Config{StreamMax: 100 * time.Millisecond}, func(_ *Store, st storage.ApplyStream) {
			for p := 1; p < 10; p++ {
				time.Sleep(20 * time.Millisecond)
				_ = st.Put(streamPart(p, 10)) // fails once the stream ended; Commit says why
			}
		}, storage.ErrStreamAbandoned},
		{"aborted", Config{}, func(_ *Store, st storage.ApplyStream) { st.Abort() }, errStreamAborted},
		{"vetoed", Config{}, func(_ *Store, st storage.ApplyStream) {
			part := streamPart(1, 10)
			part.Check = func(storage.TxReader) ([]resource.Key, error) { return nil, veto }
			if err := st.Put(part); err != nil {
				panic(err)
			}
		}, veto},
		{"store closed", Config{}, func(s *Store, st storage.ApplyStream) {
			time.Sleep(20 * time.Millisecond)
			s.Close()
		}, storage.ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := openTempStore(t, tt.cfg)
			st, err := s.BeginApply(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Put(streamPart(0, 10)); err != nil {
				t.Fatal(err)
			}
			tt.run(s, st)
			if _, err := st.Commit(storage.Batch{}); !errors.Is(err, tt.want) {
				t.Fatalf("Commit: %v, want %v", err, tt.want)
			}
			if tt.want == storage.ErrClosed {
				return
			}
			if n := listCount(t, s); n != 0 {
				t.Errorf("%d resources stored, want none", n)
			}
			if _, _, err := s.Put(ctx, benchResource(1, 0)); err != nil {
				t.Errorf("a write after the stream: %v", err)
			}
		})
	}
}

// TestStreamRerun: when another write in the stream's group spoils the
// transaction, the group is rerun without it, and the stream writes its
// parts and Commit's batch again.
func TestStreamRerun(t *testing.T) {
	ctx := context.Background()
	s := openTempStore(t, Config{})
	st := newApplyStream(s)
	spoiler := &writeReq{ctx: ctx, done: make(chan error, 1), fn: func(w *writeTx) error {
		if err := w.put(w.userMeta, []byte("spoiled"), []byte("yes")); err != nil {
			return err
		}
		return errors.New("fails after writing")
	}}
	// The committer is idle (nothing else writes): run the two as one
	// group, the stream first, as commitLoop would have gathered them.
	go s.commitGroup([]*writeReq{st.req, spoiler})
	for p := range 2 {
		if err := st.Put(streamPart(p, 50)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := st.Commit(storage.Batch{Meta: map[string][]byte{"m": []byte("v")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-spoiler.done; err == nil {
		t.Error("the spoiling write succeeded")
	}
	if n := listCount(t, s); n != 100 || res.Revision != 1 {
		t.Errorf("after the rerun: %d resources at revision %d, want 100 at 1", n, res.Revision)
	}
	if v, err := s.Meta(ctx, "m"); err != nil || string(v) != "v" {
		t.Errorf("meta of the replayed Commit: %q, %v", v, err)
	}
	if v, _ := s.Meta(ctx, "spoiled"); v != nil {
		t.Errorf("the spoiling write's meta was kept: %q", v)
	}
}

// TestStreamMatchesApply: random batches (keys given more than once,
// deletes of present and absent keys, meta) streamed in random parts leave
// a store exactly as one Apply of the same batch leaves another: the same
// resources, versions, revision and meta.
func TestStreamMatchesApply(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 5))
	for round := range 20 {
		applied, streamed := openTempStore(t, Config{}), openTempStore(t, Config{})
		for _, s := range []*Store{applied, streamed} {
			seed := storage.Batch{}
			for i := range 40 {
				seed.Puts = append(seed.Puts, benchResource(i*3, 0))
			}
			if _, err := s.Apply(ctx, seed); err != nil {
				t.Fatal(err)
			}
		}
		var b storage.Batch
		for range 1 + rng.IntN(2000) {
			b.Puts = append(b.Puts, benchResource(rng.IntN(200), rng.IntN(3)))
		}
		for range rng.IntN(30) {
			b.Deletes = append(b.Deletes, benchResource(rng.IntN(200), 0).Key())
		}
		b.Meta = map[string][]byte{"round": []byte(strconv.Itoa(round))}
		want, err := applied.Apply(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		st, err := streamed.BeginApply(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for rest := b.Puts; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(600))
			if err := st.Put(storage.Batch{Puts: rest[:n]}); err != nil {
				t.Fatal(err)
			}
			rest = rest[n:]
		}
		got, err := st.Commit(storage.Batch{Deletes: b.Deletes, Meta: b.Meta})
		if err != nil {
			t.Fatal(err)
		}
		if got.Revision != want.Revision || got.Deleted != want.Deleted {
			t.Fatalf("round %d: streamed revision %d, deleted %d; applied %d, %d", round, got.Revision, got.Deleted, want.Revision, want.Deleted)
		}
		if a, s := storeDump(t, applied), storeDump(t, streamed); a != s {
			t.Fatalf("round %d: the stores differ\napplied:\n%s\nstreamed:\n%s", round, a, s)
		}
	}
}

// storeDump renders a store's MeshTimeouts (name, version, spec) and meta.
func storeDump(t *testing.T, s *Store) string {
	t.Helper()
	list, err := s.List(context.Background(), storage.ListOptions{Type: "MeshTimeout"})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, r := range list.Items {
		fmt.Fprintf(&b, "%s v%d %s\n", r.Name, r.Version, r.Spec)
	}
	m, err := s.Meta(context.Background(), "round")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "meta %s\n", m)
	return b.String()
}
