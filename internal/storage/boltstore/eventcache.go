package boltstore

import (
	"sync"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// eventCache shares decoded change-log entries among watchers that read
// bbolt. Watchers at the head of the log read the committer's mirror
// (recentLog) and decode nothing; the others (catching up on older
// revisions, or behind the mirror after a burst) often read the same
// entries within milliseconds of each other, and each decoded all of them
// on its own: a zone runs three watchers (its policy view, its sync
// session to the global, the console's change feed), the global one per
// zone session and two more.
//
// An entry's event never changes: a log entry names a resource whose
// record carries that entry (a rewrite drops the older entry and logs a new
// one), and a tombstone is written once. The resources are shared, as every
// storage.Event consumer already treats them as immutable (resource.Resource
// is immutable by contract). Last is not cached: it depends on which entry
// follows in the reader's snapshot.
//
// It holds the most recent capacity entries (oldest out first). Safe for
// concurrent use.
type eventCache struct {
	mu    sync.Mutex
	byKey map[logKey]storage.Event
	ring  []logKey
	next  int // the ring slot to overwrite
}

// eventCacheSize is two watch chunks: watchers at the head read within
// milliseconds of each other.
const eventCacheSize = 2 * defaultWatchChunk

func newEventCache(capacity int) *eventCache {
	return &eventCache{byKey: make(map[logKey]storage.Event, capacity), ring: make([]logKey, 0, capacity)}
}

func (c *eventCache) get(k logKey) (storage.Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ev, ok := c.byKey[k]
	return ev, ok
}

// put caches ev for k and returns the cached event (Last unset): when
// another watcher decoded the entry first (both missed, both decoded), that
// one, so every reader of an entry shares one resource.
func (c *eventCache) put(k logKey, ev storage.Event) storage.Event {
	ev.Last = false
	c.mu.Lock()
	defer c.mu.Unlock()
	if cached, ok := c.byKey[k]; ok {
		return cached
	}
	if len(c.ring) < cap(c.ring) {
		c.ring = append(c.ring, k)
	} else {
		delete(c.byKey, c.ring[c.next])
		c.ring[c.next] = k
		c.next = (c.next + 1) % len(c.ring)
	}
	c.byKey[k] = ev
	return ev
}
