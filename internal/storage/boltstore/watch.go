package boltstore

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// Watch design: each watcher is a goroutine with its own cursor into the
// change log. It reads a bounded chunk in a short read transaction (or, at
// the head of the log, from the in-memory mirror of the last commits: see
// recentLog), sends the events, and when it reaches the end of the log
// waits for the next commit. Writers never wait for watchers (a slow
// consumer only delays its own goroutine) and nothing is lost, because the
// log keeps every live key's latest write and every delete until expiry,
// and expiry holds back for watchers that have not read that far (see
// ExpireTombstones).

const (
	// defaultWatchChunk bounds the log entries read per read transaction,
	// so a watcher catching up on a large log never holds a transaction
	// (and with it bbolt's remap lock) for long.
	defaultWatchChunk = 512
	// watchBuffer decouples the watcher goroutine from its consumer.
	watchBuffer = 64
)

// watcher is one Watch call. pos is published for the expiry pass: every
// log entry at a revision <= pos has been read, so dropping it is safe.
type watcher struct {
	pos atomic.Uint64
}

// Watch implements storage.Store. The channel is closed when ctx ends, the
// store closes, or the log cannot be read (logged as an error).
func (s *Store) Watch(ctx context.Context, from uint64) (<-chan storage.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := &watcher{}
	w.pos.Store(from)
	// Registering under mu, which ExpireTombstones holds for its whole
	// pass, means either expiry sees this watcher's position or this check
	// sees the compacted revision that the pass produced.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, storage.ErrClosed
	}
	if c := s.compacted.Load(); from < c {
		s.mu.Unlock()
		return nil, fmt.Errorf("watch from revision %d: history compacted up to %d: %w", from, c, storage.ErrCompacted)
	}
	s.watchers[w] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()

	ch := make(chan storage.Event, watchBuffer)
	go s.runWatcher(ctx, w, ch)
	return ch, nil
}

func (s *Store) runWatcher(ctx context.Context, w *watcher, ch chan<- storage.Event) {
	defer s.wg.Done()
	defer close(ch)
	defer s.unregister(w)
	next := makeLogKey(w.pos.Load()+1, 0)
	for {
		wake := s.commits.wait()
		events, more, err := s.readLog(w, &next)
		if err != nil {
			s.log.Error("watch stopped: cannot read the change log", "position", w.pos.Load(), "error", err)
			return
		}
		for _, ev := range events {
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			}
		}
		if more {
			continue
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
	}
}

func (s *Store) unregister(w *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watchers, w)
}

// watchFloor is the lowest position of any watcher (MaxUint64 with none).
// Callers hold s.mu.
func (s *Store) watchFloor() uint64 {
	floor := uint64(math.MaxUint64)
	for w := range s.watchers {
		floor = min(floor, w.pos.Load())
	}
	return floor
}

// readLog reads up to s.watchChunk log entries from *next on, advances *next
// past them and publishes the watcher's position. more reports that the
// chunk filled up before the end of the log. A watcher at the head reads the
// in-memory mirror of the last commits; one further behind reads bbolt.
func (s *Store) readLog(w *watcher, next *logKey) (events []storage.Event, more bool, err error) {
	if events, after, pos, more, ok := s.recent.read(*next, s.watchChunk); ok {
		*next = after
		w.pos.Store(max(w.pos.Load(), pos))
		return events, more, nil
	}
	return s.readStoredLog(w, next)
}

// readStoredLog is readLog from a bbolt read transaction.
func (s *Store) readStoredLog(w *watcher, next *logKey) (events []storage.Event, more bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		resources := tx.Bucket([]byte(bucketResources))
		c := tx.Bucket([]byte(bucketLog)).Cursor()
		k, v := c.Seek(next[:])
		for k != nil {
			lk, err := parseLogKey(k)
			if err != nil {
				return err
			}
			if len(events) == s.watchChunk {
				// Entries of revision lk may remain unread.
				more = true
				w.pos.Store(max(w.pos.Load(), lk.revision()-1))
				return nil
			}
			ev, ok := s.events.get(lk)
			if !ok {
				if ev, err = decodeEvent(s.cfg.Sealer, resources, lk, v); err != nil {
					return err
				}
				ev = s.events.put(lk, ev)
			}
			// A revision commits atomically, so this snapshot holds all of
			// its remaining entries: the event is the revision's last when
			// the next entry (if any) belongs to a later revision.
			nk, nv := c.Next()
			if nk == nil {
				ev.Last = true
			} else if nlk, err := parseLogKey(nk); err != nil {
				return err
			} else {
				ev.Last = nlk.revision() != lk.revision()
			}
			events = append(events, ev)
			*next = lk.successor()
			k, v = nk, nv
		}
		// The log is read up to this snapshot's revision: later entries
		// will all carry higher revisions.
		w.pos.Store(max(w.pos.Load(), getUint64(tx.Bucket([]byte(bucketMeta)), metaKeyRevision)))
		return nil
	})
	return events, more, err
}

func (k logKey) successor() logKey {
	rev, idx := k.revision(), k.index()
	if idx == math.MaxUint32 {
		return makeLogKey(rev+1, 0)
	}
	return makeLogKey(rev, idx+1)
}

// decodeEvent turns a log entry into an event. A put entry names its key;
// the resource is read from the same snapshot, where it is exactly the
// state that entry recorded because a rewrite drops the older entry.
func decodeEvent(sealer *kv.Sealer, resources *bolt.Bucket, lk logKey, v []byte) (storage.Event, error) {
	if len(v) == 0 {
		return storage.Event{}, fmt.Errorf("boltstore: log entry %d: %w: empty", lk.revision(), kv.ErrCorrupt)
	}
	switch v[0] {
	case opPut:
		rec, err := loadRecord(sealer, resources, v[1:])
		switch {
		case err != nil:
			return storage.Event{}, err
		case rec == nil || rec.log != lk:
			return storage.Event{}, fmt.Errorf("boltstore: log entry %d names %q, which is not at that entry: %w", lk.revision(), v[1:], kv.ErrCorrupt)
		}
		return storage.Event{Kind: storage.EventPut, Revision: lk.revision(), Resource: rec.res}, nil
	case opDelete:
		r, err := kv.DecodeResource(v[1:])
		if err != nil {
			return storage.Event{}, fmt.Errorf("boltstore: tombstone %d: %w", lk.revision(), err)
		}
		return storage.Event{Kind: storage.EventDelete, Revision: lk.revision(), Resource: r}, nil
	}
	return storage.Event{}, fmt.Errorf("boltstore: log entry %d: %w: op %q", lk.revision(), kv.ErrCorrupt, v[0])
}
