package etcdstore

import (
	"context"
	"fmt"
	"math"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// watchBuffer decouples the etcd watch from the consumer.
const watchBuffer = 64

// Watch implements storage.Store. It finds the etcd revision of the write
// group holding store revision from+1 (startRevision), watches head and the
// resources from there, and turns each etcd revision into store events:
// puts carry their store revision in the value, deletes get theirs from the
// head written in the same transaction. The channel closes when ctx ends,
// the store closes, or etcd cancels the watch (its history was compacted
// under it, or the cluster is gone): the next Watch reports why.
func (s *Store) Watch(ctx context.Context, from uint64) (<-chan storage.Event, error) {
	if err := s.readErr(ctx); err != nil {
		return nil, err
	}
	start, err := s.startRevision(ctx, from)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, s.l.head(), clientv3.WithRange(s.l.watchEnd()), clientv3.WithRev(start))
	ch := make(chan storage.Event, watchBuffer)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return nil, storage.ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(ch)
		defer cancel()
		s.runWatch(wctx, from, wch, ch)
	}()
	return ch, nil
}

func (s *Store) runWatch(ctx context.Context, from uint64, wch clientv3.WatchChan, ch chan<- storage.Event) {
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-s.closing:
			return
		case resp, ok = <-wch:
		}
		if !ok {
			return
		}
		if err := resp.Err(); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("store watch ended by etcd", "from", from, "error", err, "compacted_at", resp.CompactRevision)
			}
			return
		}
		events, err := s.toEvents(resp.Events, from)
		if err != nil {
			s.log.Error("store watch stopped: undecodable change", "error", err)
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
	}
}

// toEvents converts one watch response (whole etcd revisions) into store
// events after from. Puts come from the resources' etcd events; deletes from
// the head of their transaction, after the puts of the same store revision
// (a batch's puts apply before its deletes). etcd's delete events only
// remove keys and are skipped.
func (s *Store) toEvents(evs []*clientv3.Event, from uint64) ([]storage.Event, error) {
	var out []storage.Event
	var pending []headDelete // the current transaction's deletes not yet sent
	emit := func(ev storage.Event) {
		if ev.Revision <= from {
			return
		}
		if n := len(out); n > 0 && out[n-1].Revision != ev.Revision {
			out[n-1].Last = true
		}
		out = append(out, ev)
	}
	flush := func(upTo uint64) { // deletes of revisions before upTo
		for len(pending) > 0 && pending[0].rev < upTo {
			emit(storage.Event{Kind: storage.EventDelete, Revision: pending[0].rev, Resource: pending[0].tomb})
			pending = pending[1:]
		}
	}
	for _, e := range evs {
		enc, isResource := s.l.resourceKey(e.Kv.Key)
		if !isResource {
			flush(math.MaxUint64)
			h, err := decodeHead(e.Kv.Value)
			if err != nil {
				return nil, err
			}
			pending = h.deletes
			continue
		}
		if e.Type != clientv3.EventTypePut {
			continue
		}
		rev, r, err := decodeValue(s.cfg.Sealer, e.Kv.Value)
		if err != nil {
			return nil, fmt.Errorf("resource %q: %w", enc, err)
		}
		flush(rev)
		emit(storage.Event{Kind: storage.EventPut, Revision: rev, Resource: r})
	}
	flush(math.MaxUint64)
	if n := len(out); n > 0 {
		out[n-1].Last = true
	}
	return out, nil
}

// startRevision returns the etcd revision to watch from so that every change
// after store revision from is seen: the revision of the write group that
// holds from+1. head's history is searched (binary search over etcd
// revisions; head's value only grows), starting at the compaction mark.
func (s *Store) startRevision(ctx context.Context, from uint64) (int64, error) {
	compacted, compactedAt, err := s.compactedMark(ctx)
	if err != nil {
		return 0, err
	}
	if from < compacted {
		return 0, fmt.Errorf("watch from revision %d: history compacted up to %d: %w", from, compacted, storage.ErrCompacted)
	}
	cur, curAt, err := s.readHead(ctx, 0)
	if err != nil {
		return 0, err
	}
	if from >= cur.rev {
		return curAt + 1, nil // only live changes (curAt is 0 for an empty store)
	}
	lo, hi := max(compactedAt, 1), curAt
	for lo < hi {
		mid := lo + (hi-lo)/2
		h, at, err := s.readHead(ctx, mid)
		if err != nil {
			return 0, err
		}
		if h.rev > from {
			hi = at
		} else {
			lo = mid + 1
		}
	}
	return hi, nil
}
