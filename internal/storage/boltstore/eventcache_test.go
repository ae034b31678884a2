package boltstore

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func TestEventCacheEvictsOldest(t *testing.T) {
	c := newEventCache(2)
	for rev := uint64(1); rev <= 3; rev++ {
		c.put(makeLogKey(rev, 0), storage.Event{Kind: storage.EventPut, Revision: rev, Last: true})
	}
	if _, ok := c.get(makeLogKey(1, 0)); ok {
		t.Error("the oldest entry is still cached")
	}
	for rev := uint64(2); rev <= 3; rev++ {
		ev, ok := c.get(makeLogKey(rev, 0))
		if !ok || ev.Revision != rev {
			t.Errorf("entry %d: %v, %v", rev, ev, ok)
		}
		if ev.Last {
			t.Errorf("entry %d: Last cached (it depends on the reader's snapshot)", rev)
		}
	}
}

// TestEventCacheKeepsTheFirstDecode: two watchers that both missed an entry
// and decoded it end up with the first decode, so they share one resource
// (TestWatchersShareDecodedEvents failed in CI when both decoded at once).
func TestEventCacheKeepsTheFirstDecode(t *testing.T) {
	c := newEventCache(4)
	k := makeLogKey(1, 0)
	first := &resource.Resource{Type: "Mesh", Name: "default"}
	second := &resource.Resource{Type: "Mesh", Name: "default"}
	if got := c.put(k, storage.Event{Kind: storage.EventPut, Revision: 1, Resource: first, Last: true}); got.Resource != first || got.Last {
		t.Fatalf("first put returned %+v", got)
	}
	if got := c.put(k, storage.Event{Kind: storage.EventPut, Revision: 1, Resource: second}); got.Resource != first {
		t.Fatalf("second put returned its own decode %p, want the cached %p", got.Resource, first)
	}
}

// TestWatchersShareDecodedEvents: two watchers at the head get the same
// decoded resource for an entry (decoded once), with Last set by each
// reader.
func TestWatchersShareDecodedEvents(t *testing.T) {
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "s.db"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := s.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	mesh := &resource.Resource{Type: "Mesh", Name: "default"}
	if _, _, err := s.Put(ctx, mesh); err != nil {
		t.Fatal(err)
	}
	var got [2]storage.Event
	for i, ch := range []<-chan storage.Event{a, b} {
		select {
		case got[i] = <-ch:
		case <-ctx.Done():
			t.Fatal("no event")
		}
	}
	if got[0].Resource != got[1].Resource || !got[0].Last || !got[1].Last || got[0].Resource.Name != "default" {
		t.Fatalf("events %+v and %+v: want one shared resource, both Last", got[0], got[1])
	}
}
