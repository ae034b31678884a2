package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// TestRecentLogMirrorsTheLog: the events a watcher reads from the in-memory
// mirror are exactly those it would read from bbolt (resources, revisions,
// Last, chunk ends and positions), after rewrites and deletes within one
// commit group and within one batch, and with a mirror trimmed to a few
// entries (watchers then switch between bbolt and the mirror).
func TestRecentLogMirrorsTheLog(t *testing.T) {
	for _, limit := range []int{1 << 20, 5, 1} {
		t.Run(fmt.Sprintf("limit_%d", limit), func(t *testing.T) {
			s, err := Open(Config{Path: filepath.Join(t.TempDir(), "s.db"), Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.recent = newRecentLog(s.revision.Load(), limit) // before any write
			writeMixedHistory(t, s)
			for _, chunk := range []int{1, 3, 512} {
				s.watchChunk = chunk
				fromMirror := readWholeLog(t, s, s.readLog)
				fromBolt := readWholeLog(t, s, s.readStoredLog)
				if len(fromBolt) == 0 {
					t.Fatal("the log is empty")
				}
				if !reflect.DeepEqual(fromMirror, fromBolt) {
					for i := range max(len(fromMirror), len(fromBolt)) {
						var m, b logRead
						if i < len(fromMirror) {
							m = fromMirror[i]
						}
						if i < len(fromBolt) {
							b = fromBolt[i]
						}
						if !reflect.DeepEqual(m, b) {
							t.Fatalf("chunk %d, read %d: mirror %+v, bbolt %+v", chunk, i, m, b)
						}
					}
				}
			}
			if limit == 1<<20 {
				return
			}
			// The mirror refuses what it no longer holds.
			if _, _, _, _, ok := s.recent.read(makeLogKey(1, 0), 512); ok {
				t.Error("a trimmed mirror served revision 1")
			}
		})
	}
}

// logRead is what one readLog call returned and recorded.
type logRead struct {
	events []storage.Event
	more   bool
	pos    uint64
}

// readWholeLog reads the log from its start with read until a call returns
// no events, the way a watcher does.
func readWholeLog(t *testing.T, s *Store, read func(*watcher, *logKey) ([]storage.Event, bool, error)) []logRead {
	t.Helper()
	w := &watcher{}
	next := makeLogKey(1, 0)
	var out []logRead
	for {
		events, more, err := read(w, &next)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, logRead{events: events, more: more, pos: w.pos.Load()})
		if len(events) == 0 {
			return out
		}
	}
}

// writeMixedHistory writes creates, updates, unchanged puts, deletes, one
// batch that rewrites and deletes what an earlier write of its group wrote,
// and concurrent writers to shared keys (one commit group rewriting a key).
func writeMixedHistory(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	res := func(name, spec string) *resource.Resource {
		return &resource.Resource{Type: "Mesh", Name: name, Labels: resource.NewLabels(map[string]string{"k": spec}), Spec: []byte(`{"v":"` + spec + `"}`)}
	}
	for i := range 12 {
		if _, _, err := s.Put(ctx, res(fmt.Sprintf("m%d", i), "a")); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Put(ctx, res("m0", "a")); err != nil { // unchanged: no entry
		t.Fatal(err)
	}
	if err := s.Delete(ctx, resource.Key{Type: "Mesh", Name: "m11"}, 0); err != nil {
		t.Fatal(err)
	}
	batch := storage.Batch{
		Puts:    []*resource.Resource{res("m1", "b"), res("m2", "b"), res("m20", "b")},
		Deletes: []resource.Key{{Type: "Mesh", Name: "m3"}, {Type: "Mesh", Name: "m4"}},
	}
	if _, err := s.Apply(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				name := fmt.Sprintf("m%d", 5+i%3)
				var err error
				if (g+i)%7 == 6 {
					err = s.Delete(ctx, resource.Key{Type: "Mesh", Name: name}, 0)
				} else {
					_, _, err = s.Put(ctx, res(name, fmt.Sprintf("g%d-%d", g, i)))
				}
				if err != nil && !errors.Is(err, storage.ErrNotFound) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if _, err := s.Apply(ctx, storage.Batch{Puts: []*resource.Resource{res("m9", "c")}, Deletes: []resource.Key{{Type: "Mesh", Name: "m10"}}}); err != nil {
		t.Fatal(err)
	}
}

// TestRecentLogDropsWhatACommitRewrote: an entry a later change drops (its
// key rewritten or deleted, in the same commit or a later one) is never
// read, and Last falls on the revision's last surviving entry.
func TestRecentLogDropsWhatACommitRewrote(t *testing.T) {
	r := newRecentLog(0, 100)
	put := putChange
	drop := func(rev uint64, idx uint32) logChange { return logChange{key: makeLogKey(rev, idx), dropped: true} }
	// Revision 1: a, b. Revision 2 (one commit with revision 3): a again
	// (drops 1/0), c then c again at revision 3 (drops 2/1).
	r.publish(1, []logChange{put(1, 0, "a"), put(1, 1, "b")})
	r.publish(3, []logChange{drop(1, 0), put(2, 0, "a"), put(2, 1, "c"), drop(2, 1), put(3, 0, "c")})
	events, after, pos, more, ok := r.read(makeLogKey(1, 0), 10)
	if !ok || more || pos != 3 || after != makeLogKey(3, 1) {
		t.Fatalf("read: ok %v more %v pos %d after %x", ok, more, pos, after)
	}
	var got []string
	for _, ev := range events {
		got = append(got, fmt.Sprintf("%d:%s:%v", ev.Revision, ev.Resource.Name, ev.Last))
	}
	want := []string{"1:b:true", "2:a:true", "3:c:true"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	// A chunk that ends inside the log reports the position before the
	// first unread entry's revision.
	if events, after, pos, more, _ := r.read(makeLogKey(1, 0), 2); len(events) != 2 || !more || pos != 2 || after != makeLogKey(2, 1) {
		t.Fatalf("chunk of 2: %d events, more %v, pos %d, after %x", len(events), more, pos, after)
	}
}

// TestRecentLogKeepsTheLastCommitWhole: trimming drops whole revisions from
// the front and never the last commit, however large.
func TestRecentLogKeepsTheLastCommitWhole(t *testing.T) {
	r := newRecentLog(0, 2)
	r.publish(1, commitOf(1, 1))
	r.publish(2, commitOf(2, 5))
	if _, _, _, _, ok := r.read(makeLogKey(1, 0), 10); ok {
		t.Error("revision 1 is still served after trimming")
	}
	events, _, pos, _, ok := r.read(makeLogKey(2, 0), 10)
	if !ok || len(events) != 5 || pos != 2 {
		t.Fatalf("the last commit: ok %v, %d events, pos %d", ok, len(events), pos)
	}
	if len(r.pos) != 5 {
		t.Errorf("%d keys indexed, want 5", len(r.pos))
	}
}

// BenchmarkWatchersReadACommit is what the watchers at the head of the log
// spend reading one commit of one resource: from the in-memory mirror or,
// as before it, from a read transaction each (the first decoding the entry,
// the others sharing that decode through the event cache). 3 watchers is a
// zone (view, sync session, console feed); 100 a global with 100 zones.
func BenchmarkWatchersReadACommit(b *testing.B) {
	for _, watchers := range []int{3, 100} {
		for _, path := range []string{"mirror", "bbolt"} {
			b.Run(fmt.Sprintf("watchers=%d/%s", watchers, path), func(b *testing.B) {
				s, err := Open(Config{Path: filepath.Join(b.TempDir(), "s.db"), Logger: testLogger(b)})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				read := s.readLog
				if path == "bbolt" {
					read = s.readStoredLog
				}
				ws := make([]*watcher, watchers)
				next := make([]logKey, watchers)
				for i := range ws {
					ws[i], next[i] = &watcher{}, makeLogKey(1, 0)
				}
				ctx := context.Background()
				r := &resource.Resource{Type: "Mesh", Name: "default", Labels: resource.NewLabels(map[string]string{"team": "a"}),
					Spec: []byte(`{"mtls":{"enabledBackend":"ca-1","backends":[{"name":"ca-1","type":"builtin"}]}}`)}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer()
					r.Labels = resource.NewLabels(map[string]string{"n": fmt.Sprint(i)})
					if _, _, err := s.Put(ctx, r); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					for j, w := range ws {
						events, _, err := read(w, &next[j])
						if err != nil || len(events) != 1 {
							b.Fatalf("watcher %d: %d events, %v", j, len(events), err)
						}
					}
				}
			})
		}
	}
}

// TestRecentLogReleasesWhatEveryWatcherRead: a last commit larger than
// twice the limit is dropped once every watcher has read it, and the mirror
// then serves from the next revision on.
func TestRecentLogReleasesWhatEveryWatcherRead(t *testing.T) {
	r := newRecentLog(0, 1)
	r.publish(1, commitOf(1, 5))
	r.release(0) // a watcher has not read revision 1
	if events, _, _, _, ok := r.read(makeLogKey(1, 0), 10); !ok || len(events) != 5 {
		t.Fatalf("before every watcher read it: ok %v, %d events", ok, len(events))
	}
	r.release(1)
	if _, _, _, _, ok := r.read(makeLogKey(1, 0), 10); ok {
		t.Error("revision 1 still served after every watcher read it")
	}
	if len(r.entries) != 0 || len(r.pos) != 0 {
		t.Errorf("%d entries, %d keys held", len(r.entries), len(r.pos))
	}
	events, _, pos, _, ok := r.read(makeLogKey(2, 0), 10)
	if !ok || len(events) != 0 || pos != 1 {
		t.Fatalf("at the head: ok %v, %d events, pos %d", ok, len(events), pos)
	}
	r.publish(2, commitOf(2, 1))
	if events, _, _, _, ok := r.read(makeLogKey(2, 0), 10); !ok || len(events) != 1 || !events[0].Last {
		t.Fatalf("the next commit: ok %v, %d events", ok, len(events))
	}
}

// putChange is a logged put of Mesh name as change idx of revision rev.
func putChange(rev uint64, idx uint32, name string) logChange {
	return logChange{key: makeLogKey(rev, idx), ev: storage.Event{Kind: storage.EventPut, Revision: rev,
		Resource: &resource.Resource{Type: "Mesh", Name: name}}}
}

// commitOf is a commit of n puts at revision rev.
func commitOf(rev uint64, n int) []logChange {
	var out []logChange
	for i := range n {
		out = append(out, putChange(rev, uint32(i), fmt.Sprint(i)))
	}
	return out
}
