package boltstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// Group commit. bbolt's db.Batch waits MaxBatchDelay before committing, so
// a few writers each waiting for their own answer mostly wait on the timer.
// Instead one committer goroutine takes whatever writes are queued, runs them
// in one transaction and commits (one fsync); the writes that arrive during
// that fsync form the next group. Each write still gets its own revision.
// When writes were already waiting at the end of a commit, the next group
// also waits briefly for the writers just answered (gatherReturning), so
// that a few busy clients share one commit instead of alternating between
// two half-size groups.

// writeReq is one write waiting for the committer. fn may run more than once
// (when a group is retried) and must be idempotent: it derives everything
// from the transaction and overwrites its outputs on each run.
type writeReq struct {
	ctx  context.Context
	fn   func(*writeTx) error
	done chan error
}

// submit hands fn to the committer and waits for the outcome.
func (s *Store) submit(ctx context.Context, fn func(*writeTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	req := &writeReq{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.writes <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return storage.ErrClosed
	}
	// No ctx case here: once the committer holds the request only its
	// answer tells whether the write happened, and a write must never be
	// reported failed after it committed.
	return <-req.done
}

// commitLoop is the only goroutine that opens write transactions for
// resource writes. It returns when the store closes; every request it has
// received gets an answer first.
func (s *Store) commitLoop() {
	defer s.wg.Done()
	group := make([]*writeReq, 0, s.cfg.MaxWriteGroup)
	var (
		next *writeReq // the first write of the next group
		// answered: the writers of the last group, who may write again;
		// others: a write was already waiting when that group committed.
		answered int
		others   bool
		lastTook time.Duration
		wait     = time.NewTimer(time.Hour)
	)
	wait.Stop()
	defer wait.Stop()
	for {
		if next == nil {
			select {
			case <-s.closing:
				return
			case next = <-s.writes:
				others = false
			}
		}
		group = s.gather(append(group[:0], next))
		if others && answered > 0 {
			group = s.gatherReturning(group, len(group)+answered, min(lastTook/2, s.cfg.MaxGroupWait), wait)
		}
		start := time.Now()
		s.commitGroup(group)
		lastTook = time.Since(start)
		answered = len(group)
		clear(group)
		select {
		case next = <-s.writes:
			others = true
		default:
			next, others = nil, false
		}
	}
}

// gatherReturning waits up to d for the group to reach want writes. It is
// called when writes were queued while the previous group committed: the
// writers that group answered are then likely to write again at once (a
// client applying many resources with a few connections), and without the
// wait they would form the next group on their own, so that the writers
// split into two cohorts that alternate, each commit carrying half of them
// (Postgres' commit_delay/commit_siblings is the same idea). A lone writer
// never waits: nothing was queued while its own write committed.
func (s *Store) gatherReturning(group []*writeReq, want int, d time.Duration, t *time.Timer) []*writeReq {
	want = min(want, s.cfg.MaxWriteGroup)
	if d <= 0 || len(group) >= want {
		return group
	}
	t.Reset(d)
	defer t.Stop()
	for len(group) < want {
		select {
		case req := <-s.writes:
			group = append(group, req)
		case <-t.C:
			return group
		case <-s.closing:
			return group
		}
	}
	return group
}

// gather adds the writes already waiting, without waiting for more.
func (s *Store) gather(group []*writeReq) []*writeReq {
	for len(group) < s.cfg.MaxWriteGroup {
		select {
		case req := <-s.writes:
			group = append(group, req)
		default:
			return group
		}
	}
	return group
}

// commitGroup runs reqs in one transaction and answers each. A request that
// fails cleanly (before writing) just gets its error. One that fails after
// writing spoils the transaction: it is rolled back, the culprit is rerun on
// its own so that it reports its own error, and the others are rerun as a
// group, so one caller's conflict never fails another caller's write.
func (s *Store) commitGroup(reqs []*writeReq) {
	for len(reqs) > 0 {
		errs, dirty, err := s.runGroup(reqs)
		switch {
		case err != nil:
			s.log.Error("write transaction failed", "writes", len(reqs), "error", err)
			for _, r := range reqs {
				r.done <- err
			}
			return
		case dirty < 0 || len(reqs) == 1:
			for i, r := range reqs {
				r.done <- errs[i]
			}
			return
		}
		culprit := reqs[dirty]
		reqs = slices.Delete(reqs, dirty, dirty+1)
		s.commitGroup([]*writeReq{culprit})
	}
}

// runGroup returns per-request errors, or dirty >= 0 (transaction rolled
// back) when request dirty failed after writing, or err when the
// transaction itself failed.
func (s *Store) runGroup(reqs []*writeReq) (errs []error, dirty int, err error) {
	tx, err := s.db.Begin(true)
	if err != nil {
		return nil, -1, fmt.Errorf("boltstore: begin write: %w", err)
	}
	w := newWriteTx(tx, s.clock)
	errs = make([]error, len(reqs))
	for i, r := range reqs {
		if errs[i] = r.ctx.Err(); errs[i] != nil {
			continue
		}
		before, rev := w.mutations, w.rev
		if errs[i] = r.fn(w); errs[i] == nil {
			continue
		}
		if w.mutations != before {
			_ = tx.Rollback()
			return errs, i, nil
		}
		w.rev = rev
	}
	if err := w.finish(); err != nil {
		_ = tx.Rollback()
		return nil, -1, fmt.Errorf("boltstore: record revision: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, -1, fmt.Errorf("boltstore: commit: %w", err)
	}
	if w.rev != w.startRev {
		s.recent.publish(w.rev, w.changes)
		s.revision.Store(w.rev)
		s.commits.notify()
	}
	return errs, -1, nil
}

// writeOne applies a single-resource write as its own revision.
func (w *writeTx) writeOne(r *resource.Resource, mode kv.PutMode) (*resource.Resource, storage.Outcome, error) {
	rev := w.rev + 1
	out, outcome, err := w.writeResource(r, mode, rev, 0)
	if err != nil {
		return nil, 0, err
	}
	if outcome != storage.Unchanged {
		w.rev = rev
	}
	return out, outcome, nil
}

// Create implements storage.Store.
func (s *Store) Create(ctx context.Context, r *resource.Resource) (*resource.Resource, error) {
	out, _, err := s.write(ctx, r, kv.ModeCreate)
	return out, err
}

// Update implements storage.Store. Unlike Put it always writes, so it
// always bumps the version and the revision.
func (s *Store) Update(ctx context.Context, r *resource.Resource) (*resource.Resource, error) {
	out, _, err := s.write(ctx, r, kv.ModeUpdate)
	return out, err
}

// Put implements storage.Store.
func (s *Store) Put(ctx context.Context, r *resource.Resource) (*resource.Resource, storage.Outcome, error) {
	return s.write(ctx, r, kv.ModePut)
}

func (s *Store) write(ctx context.Context, r *resource.Resource, mode kv.PutMode) (*resource.Resource, storage.Outcome, error) {
	if err := kv.ValidateResource(r); err != nil {
		return nil, 0, err
	}
	var (
		out     *resource.Resource
		outcome storage.Outcome
	)
	err := s.submit(ctx, func(w *writeTx) (err error) {
		out, outcome, err = w.writeOne(r, mode)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return out, outcome, nil
}

// Delete implements storage.Store.
func (s *Store) Delete(ctx context.Context, key resource.Key, version uint64) error {
	if err := kv.ValidateKey(key); err != nil {
		return err
	}
	return s.submit(ctx, func(w *writeTx) error {
		rev := w.rev + 1
		if err := w.deleteResource(key, version, rev, 0); err != nil {
			return err
		}
		w.rev = rev
		return nil
	})
}

// Apply implements storage.Store.
func (s *Store) Apply(ctx context.Context, b storage.Batch) (*storage.BatchResult, error) {
	if err := kv.ValidateBatch(b); err != nil {
		return nil, err
	}
	var out *storage.BatchResult
	err := s.submit(ctx, func(w *writeTx) (err error) {
		out, err = w.apply(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// broadcaster wakes every goroutine waiting for the next commit. wait
// returns a channel closed by the next notify; taking it before reading the
// log means a commit between the read and the wait is never missed.
type broadcaster struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcaster() *broadcaster {
	return &broadcaster{ch: make(chan struct{})}
}

func (b *broadcaster) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcaster) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}
