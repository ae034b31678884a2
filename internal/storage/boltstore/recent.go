package boltstore

import (
	"bytes"
	"slices"
	"sort"
	"sync"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// recentLog mirrors the tail of the change log in memory: the entries of the
// last commits, published by the committer right after each commit with the
// resources it wrote. Watchers at the head of the log (nearly all of them: a
// zone's policy view, its sync session and console feed; the global's
// session per zone) read a commit from here, without a read transaction and
// without decoding what was just encoded. Before it, every watcher opened a
// read transaction per commit (a hundred per change on a global with a
// hundred zones), and the first one decoded each entry (a cold zone decoded
// the 10,000 resources it had just written: about 15% of its CPU over its
// first 5 s).
//
// It is an exact mirror of the log's surviving entries from revision from
// on: a commit that rewrites or deletes a key drops that key's older entry
// from the log, and drop removes it here too, so a watcher reads the same
// events from here as from bbolt. Entries below from are read from bbolt.
// Tombstone expiry removes only entries below every watcher's position and
// below the compacted revision, which no watcher reads again, so it needs
// no mirror.
//
// Resources are shared with the writer's caller and every watcher; they are
// immutable by contract (resource.Resource).
//
// Safe for concurrent use: one committer publishes, many watchers read.
type recentLog struct {
	mu   sync.RWMutex
	from uint64 // every surviving entry of a revision >= from is held
	head uint64 // the last revision published
	// entries are in log order; base is the sequence number of entries[0]
	// and pos maps a held key to its sequence number.
	entries []recentEntry
	base    uint64
	pos     map[logKey]uint64
	// limit bounds the entries held (at most twice limit, then trimmed to
	// limit), except that the last commit is always held whole (a cold
	// zone's first commit holds every resource, and its watchers read all
	// of them next).
	limit int
}

type recentEntry struct {
	key     logKey
	ev      storage.Event // Last unset: it depends on what follows
	dropped bool          // rewritten or deleted by a later change
}

// recentLimit is two watch chunks (the mirror holds up to four): every
// watcher at the head reads a commit within milliseconds of it.
const recentLimit = 2 * defaultWatchChunk

// newRecentLog starts empty at the store's revision: everything up to it is
// read from bbolt.
func newRecentLog(revision uint64, limit int) *recentLog {
	return &recentLog{from: revision + 1, head: revision, pos: map[logKey]uint64{}, limit: limit}
}

// logChange is one change a write transaction made to the log, in order: a
// new entry (ev set) or the removal of an older one (a rewrite or delete of
// its key).
type logChange struct {
	key     logKey
	ev      storage.Event
	dropped bool
}

// publish adds the log changes of the commit that reached revision head.
// Only the committer calls it, after the commit and before watchers are
// told, in revision order.
func (r *recentLog) publish(head uint64, changes []logChange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := r.base + uint64(len(r.entries)) // this commit's first sequence number
	// One allocation for a large commit (a cold zone's 100,000 puts), not
	// a copy at every quarter of growth.
	r.entries = slices.Grow(r.entries, len(changes))
	for _, c := range changes {
		if c.dropped {
			if seq, ok := r.pos[c.key]; ok {
				r.entries[seq-r.base].dropped = true
				r.entries[seq-r.base].ev = storage.Event{} // let the resource go
				delete(r.pos, c.key)
			}
			continue
		}
		r.pos[c.key] = r.base + uint64(len(r.entries))
		r.entries = append(r.entries, recentEntry{key: c.key, ev: c.ev})
	}
	r.head = head
	r.trim(first)
}

// trim drops the oldest revisions once more than twice limit entries are
// held, down to limit, keeping every entry from sequence number keep on (the
// last commit). Trimming copies what remains, so it waits for limit entries
// to drop rather than copying the whole mirror at every commit.
func (r *recentLog) trim(keep uint64) {
	if len(r.entries) <= 2*r.limit {
		return
	}
	cut := 0
	for cut < len(r.entries) && r.base+uint64(cut) < keep && len(r.entries)-cut > r.limit {
		// Drop a whole revision, so that from names a complete one.
		rev := r.entries[cut].key.revision()
		for cut < len(r.entries) && r.entries[cut].key.revision() == rev {
			cut++
		}
	}
	r.dropFront(cut)
}

// release drops the revisions every watcher has read (those <= floor) once
// more than twice limit entries are held, so that a large last commit (a
// cold zone's first holds every resource) is not kept until the next
// commit. The expiry loop calls it.
func (r *recentLog) release(floor uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) <= 2*r.limit {
		return
	}
	cut := 0
	for cut < len(r.entries) && r.entries[cut].key.revision() <= floor {
		cut++
	}
	r.dropFront(cut)
}

// dropFront drops the first cut entries, which end a revision, and copies
// what remains so the dropped entries' array (and the resources it points
// to) can be collected.
func (r *recentLog) dropFront(cut int) {
	if cut == 0 {
		return
	}
	for _, e := range r.entries[:cut] {
		delete(r.pos, e.key)
	}
	r.from = max(r.from, r.entries[cut-1].key.revision()+1)
	r.entries = append(make([]recentEntry, 0, max(len(r.entries)-cut, r.limit)), r.entries[cut:]...)
	r.base += uint64(cut)
}

// read returns up to max events from next on, as readLog would read them
// from bbolt, and what readLog then records: the key to read next and the
// position (every entry of a revision <= pos has been read). ok is false
// when next's revision is older than the mirror: the caller reads bbolt.
func (r *recentLog) read(next logKey, max int) (events []storage.Event, after logKey, pos uint64, more, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if next.revision() < r.from {
		return nil, next, 0, false, false
	}
	after, pos = next, r.head
	i := sort.Search(len(r.entries), func(i int) bool { return !r.entries[i].key.less(next) })
	for ; i < len(r.entries); i++ {
		e := r.entries[i]
		if e.dropped {
			continue
		}
		if len(events) == max {
			// Entries of e's revision may remain unread.
			return events, after, e.key.revision() - 1, true, true
		}
		ev := e.ev
		ev.Last = r.lastOfRevision(i)
		events = append(events, ev)
		after = e.key.successor()
	}
	return events, after, pos, false, true
}

// lastOfRevision reports whether no surviving entry of entries[i]'s
// revision follows it. Every revision up to head is held whole.
func (r *recentLog) lastOfRevision(i int) bool {
	rev := r.entries[i].key.revision()
	for j := i + 1; j < len(r.entries); j++ {
		if r.entries[j].key.revision() != rev {
			return true
		}
		if !r.entries[j].dropped {
			return false
		}
	}
	return true
}

func (k logKey) less(o logKey) bool { return bytes.Compare(k[:], o[:]) < 0 }
