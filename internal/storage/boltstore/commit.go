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
// in one transaction and commits (bbolt's fsyncs); the writes that arrive
// during that commit form the next group. Each write still gets its own revision.
// When the writers just answered are likely to write again, the next group
// waits briefly for them (lastGroup.target), so that a few busy clients
// share one commit instead of alternating between a group of one and a
// group of the rest.

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
		next    *writeReq // the first write of the next group
		arrived time.Time // when next arrived, if the committer was idle
		last    lastGroup
		wait    = time.NewTimer(time.Hour)
	)
	wait.Stop()
	defer wait.Stop()
	for {
		if next == nil {
			select {
			case <-s.closing:
				return
			case next = <-s.writes:
				arrived = time.Now()
			}
		}
		group = s.gather(append(group[:0], next))
		if want, d := last.target(len(group), arrived, s.cfg.MaxGroupWait); want > len(group) {
			group = s.gatherReturning(group, want, d, wait)
		}
		start := time.Now()
		s.commitGroup(group)
		end := time.Now()
		last = lastGroup{answered: len(group), took: end.Sub(start), ended: end}
		if s.cfg.Commits != nil {
			s.cfg.Commits.ObserveCommit(len(group), last.took)
		}
		clear(group)
		select {
		case next = <-s.writes:
			last.queued, arrived = true, time.Time{}
		default:
			next = nil
		}
	}
}

// lastGroup is what the committer remembers of the group it committed last,
// to size the next one.
type lastGroup struct {
	answered int           // writers it answered
	took     time.Duration // its commit's duration
	ended    time.Time     // when they were answered
	// queued: a write was already waiting when it committed, so the next
	// group started at once with that write (arrived is then zero).
	queued bool
}

// target says how many writes the next group should wait for (want; none
// when want <= have) and for how long at most, given that have writes are
// in hand and the group's first write arrived at arrived (zero when it was
// already queued).
//
// The writers a group answered are likely to write again at once (a client
// applying many resources over a few connections). Without a wait the first
// of them to come back would be committed alone, and the rest, back during
// that commit, would form the next group: the writers split into cohorts
// that alternate, the commits carrying one writer, then all the others
// (measured with 8 HTTP clients: groups of 1 and 8 in turn, 4.5 writes per
// commit). Postgres' commit_delay/commit_siblings is the same idea. The wait
// is at most the last commit's duration and maxWait: never longer than the
// commit it saves, and idle (no disk, no CPU) while it lasts. Two cases
// wait:
//   - writes were queued when the last group committed: those are other
//     writers, and the answered ones will join them;
//   - the first write came back within a commit's duration after a group of
//     several writers was answered: it is one of them, and so are the next.
//
// A lone writer never waits: its group answered only itself, and nothing
// else was queued. Nor does a write after a pause.
func (g lastGroup) target(have int, arrived time.Time, maxWait time.Duration) (want int, wait time.Duration) {
	wait = min(g.took, maxWait)
	switch {
	case wait <= 0 || g.answered == 0:
		return 0, 0
	case g.queued:
		return have + g.answered, wait
	case g.answered > 1 && arrived.Sub(g.ended) < g.took:
		return g.answered, wait
	}
	return 0, 0
}

// gatherReturning waits up to d for the group to reach want writes (capped
// by MaxWriteGroup); see lastGroup.target for when and why.
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
	w := newWriteTx(tx, s.clock, s.cfg.Sealer)
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
