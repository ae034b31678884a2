package boltstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// Streamed applies (storage.Streaming). A cold zone's full snapshot of
// 100,000 resources arrives in 27 chunks over about a second, and writing
// it then took about as long again: the store sat idle while the chunks
// came, and the stream waited for the write once the last one was in. A
// stream is one write request that holds the committer's transaction from
// its first part to Commit and writes each part as it comes, so the
// writing overlaps the receiving and only the commit (spill, write, fsync)
// is left after the last chunk.
//
// While it runs, every other write waits for the committer. The stream
// therefore ends itself, rolled back, when no part or Commit has come for
// Config.StreamIdle, or when it has been open for Config.StreamMax; its
// caller then applies the batch in one Apply.

// streamParts is how many parts a stream buffers before Put waits for the
// committer to take one: enough to keep the committer busy while the
// caller converts the next chunk, few enough to bound what waits in memory.
const streamParts = 4

// errStreamAborted ends a stream its caller aborted.
var errStreamAborted = errors.New("boltstore: apply stream aborted")

// applyStream implements storage.ApplyStream. Put, Commit and Abort are
// called by the stream's one caller goroutine; run is the write request's
// function, called on the committer's goroutine.
type applyStream struct {
	s         *Store
	req       *writeReq
	parts     chan storage.Batch
	commit    chan storage.Batch
	abort     chan struct{}
	abortOnce sync.Once
	// finished is closed when run's first call returns; failure then holds
	// why the stream ended before Commit (nil after Commit).
	finished chan struct{}
	failure  error
	// committed: Commit was called (the caller's side).
	committed bool

	// The committer's side: whether run was called before, the parts it
	// wrote and the Commit batch, kept so that a rerun (commitGroup retries
	// a group that another write spoiled) writes the same again.
	ran     bool
	written []storage.Batch
	rest    *storage.Batch
	result  *storage.BatchResult
}

// BeginApply implements storage.Streaming.
func (s *Store) BeginApply(ctx context.Context) (storage.ApplyStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := newApplyStream(s)
	select {
	case s.writes <- st.req:
		return st, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closing:
		return nil, storage.ErrClosed
	}
}

func newApplyStream(s *Store) *applyStream {
	st := &applyStream{
		s: s, parts: make(chan storage.Batch, streamParts), commit: make(chan storage.Batch),
		abort: make(chan struct{}), finished: make(chan struct{}),
	}
	// The request must run once it is queued, whatever happens to the
	// caller's ctx: only its run closes finished, which Put and Commit
	// wait on.
	st.req = &writeReq{ctx: context.Background(), fn: st.run, done: make(chan error, 1)}
	return st
}

// Put implements storage.ApplyStream.
func (st *applyStream) Put(part storage.Batch) error {
	if st.committed {
		return errors.New("boltstore: apply stream: Put after Commit")
	}
	if len(part.Deletes) > 0 || len(part.Meta) > 0 {
		return fmt.Errorf("%w: a stream's part carries deletes or meta (they belong in Commit)", storage.ErrInvalid)
	}
	if err := kv.ValidateBatch(part); err != nil {
		return err
	}
	select {
	case <-st.abort:
		return errStreamAborted
	case <-st.finished:
		return st.ended()
	default:
	}
	select {
	case st.parts <- part:
		return nil
	case <-st.finished:
		return st.ended()
	}
}

// ended is why the stream's request ended before Commit.
func (st *applyStream) ended() error {
	if st.failure != nil {
		return st.failure
	}
	return errors.New("boltstore: apply stream ended")
}

// Commit implements storage.ApplyStream.
func (st *applyStream) Commit(rest storage.Batch) (*storage.BatchResult, error) {
	if st.committed {
		return nil, errors.New("boltstore: apply stream: second Commit")
	}
	st.committed = true
	if err := kv.ValidateBatch(rest); err != nil {
		st.Abort()
		return nil, err
	}
	select {
	case <-st.abort: // aborted before: its answer says so
	default:
		select {
		case st.commit <- rest:
		case <-st.finished: // ended before Commit: its answer says why
		}
	}
	if err := <-st.req.done; err != nil {
		return nil, err
	}
	return st.result, nil
}

// Abort implements storage.ApplyStream.
func (st *applyStream) Abort() { st.abortOnce.Do(func() { close(st.abort) }) }

// run is the stream's write request. Its first call writes the parts as
// they come until Commit, Abort or a limit; a rerun (the transaction was
// rolled back for another write of the group) writes what the first
// wrote, and Commit's batch, again, or fails as the first did.
func (st *applyStream) run(w *writeTx) error {
	if st.ran {
		if st.rest == nil {
			return st.failure // without writing: a clean failure
		}
		return st.replay(w)
	}
	st.ran = true
	defer close(st.finished)
	err := st.receive(w)
	st.failure = err
	if errors.Is(err, storage.ErrStreamAbandoned) {
		st.s.log.Warn("apply stream rolled back: its writer went quiet or took too long", "error", err, "parts", len(st.written))
	}
	return err
}

// receive writes parts as they come (see run).
func (st *applyStream) receive(w *writeTx) error {
	idle := time.NewTimer(st.s.cfg.StreamIdle)
	defer idle.Stop()
	limit := time.NewTimer(st.s.cfg.StreamMax)
	defer limit.Stop()
	bw := st.begin(w)
	defer func() { w.owned = false }() // the group's other writes are not
	var extra []resource.Key
	for {
		select {
		case part := <-st.parts:
			if err := st.writeNew(bw, part, &extra); err != nil {
				return err
			}
			idle.Reset(st.s.cfg.StreamIdle)
		case rest := <-st.commit:
			// Every Put returned before Commit was called, so the parts
			// not yet taken are all in the buffer.
			for len(st.parts) > 0 {
				if err := st.writeNew(bw, <-st.parts, &extra); err != nil {
					return err
				}
			}
			st.rest = &rest
			return st.finish(bw, extra)
		case <-st.abort:
			return errStreamAborted
		case <-idle.C:
			return fmt.Errorf("%w: no part for %s", storage.ErrStreamAbandoned, st.s.cfg.StreamIdle)
		case <-limit.C:
			return fmt.Errorf("%w: open for %s", storage.ErrStreamAbandoned, st.s.cfg.StreamMax)
		case <-st.s.closing:
			return storage.ErrClosed
		}
	}
}

// replay writes the first run's parts and Commit's batch again.
func (st *applyStream) replay(w *writeTx) error {
	bw := st.begin(w)
	defer func() { w.owned = false }()
	var extra []resource.Key
	for _, part := range st.written {
		more, err := writePart(bw, part)
		if err != nil {
			return err
		}
		extra = append(extra, more...)
	}
	return st.finish(bw, extra)
}

// writeNew writes a part the first run receives, and records it (for a
// replay) and its Check's deletions.
func (st *applyStream) writeNew(bw *batchWriter, part storage.Batch, extra *[]resource.Key) error {
	st.written = append(st.written, part)
	more, err := writePart(bw, part)
	*extra = append(*extra, more...)
	return err
}

func (st *applyStream) begin(w *writeTx) *batchWriter {
	w.resources.FillPercent = bulkFill // for the whole commit: see "Page fill"
	w.owned = true
	return w.newBatch()
}

// writePart runs part's Check, then writes its puts; it returns the
// Check's deletions, which finish applies.
func writePart(bw *batchWriter, part storage.Batch) ([]resource.Key, error) {
	more, err := kv.BatchDeletes(storage.Batch{Check: part.Check}, bw.w)
	if err != nil {
		return nil, err
	}
	return more, bw.puts(part.Puts, nil, nil)
}

// finish writes Commit's batch, then every part Check's deletions.
func (st *applyStream) finish(bw *batchWriter, extra []resource.Key) error {
	rest := *st.rest
	deletes, err := kv.BatchDeletes(rest, bw.w)
	if err != nil {
		return err
	}
	res := &storage.BatchResult{Outcomes: make([]storage.Outcome, len(rest.Puts)), Stored: make([]*resource.Resource, len(rest.Puts))}
	bw.w.owned = rest.Owned
	if err := bw.puts(rest.Puts, res.Outcomes, res.Stored); err != nil {
		return err
	}
	if err := bw.rest(slices.Concat(deletes, extra), rest.Meta); err != nil { // deletes may be the caller's slice
		return err
	}
	res.Revision, res.Deleted = bw.finish(), bw.deleted
	st.result = res
	return nil
}
