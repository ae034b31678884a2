package etcdstore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// Group commit, as in boltstore: one committer goroutine per Store takes the
// writes queued meanwhile and commits them in one etcd transaction that
// compares head's mod revision (optimistic concurrency: another replica's
// write in between fails the compare and the group reruns on fresh reads).
// Each write keeps its own store revision. A group never exceeds the
// cluster's transaction limits and never writes a key twice.

type writeReq struct {
	ctx  context.Context
	fn   func(*writeTx) error
	done chan error
	// keys the request will read (its resources and their meshes, which
	// admission checks): the group reads them all in one round trip
	// before running the requests, instead of one Get each.
	keys []resource.Key
}

func (s *Store) submit(ctx context.Context, keys []resource.Key, fn func(*writeTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	req := &writeReq{ctx: ctx, fn: fn, done: make(chan error, 1), keys: keys}
	select {
	case s.writes <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return storage.ErrClosed
	}
	return <-req.done
}

// maxGroup bounds the requests of one group (each has at least one op).
const maxGroup = 256

func (s *Store) commitLoop() {
	defer s.wg.Done()
	var carry []*writeReq
	for {
		if len(carry) == 0 {
			select {
			case <-s.closing:
				return
			case req := <-s.writes:
				carry = append(carry, req)
			}
		}
		group := s.gather(carry)
		carry = s.commitGroup(group)
	}
}

func (s *Store) gather(group []*writeReq) []*writeReq {
	for len(group) < maxGroup {
		select {
		case req := <-s.writes:
			group = append(group, req)
		default:
			return group
		}
	}
	return group
}

// commitGroup commits as many of reqs as fit in one transaction, answers
// them, and returns the ones left for the next group.
func (s *Store) commitGroup(reqs []*writeReq) []*writeReq {
	for attempt := 0; ; attempt++ {
		w, accepted, errs, rest, err := s.runGroup(reqs)
		if err != nil {
			for _, r := range reqs {
				r.done <- err
			}
			return nil
		}
		{
			var ok bool
			ok, err = s.commit(w)
			if err == nil && !ok {
				// Another writer moved head: rerun on fresh reads.
				s.log.Debug("write group lost a race, retrying", "attempt", attempt)
				if s.isClosed() {
					err = storage.ErrClosed
				} else {
					time.Sleep(time.Duration(min(attempt, 20)) * time.Millisecond)
					continue
				}
			}
		}
		for i, r := range reqs {
			if slices.Contains(rest, r) {
				continue
			}
			e := errs[i]
			if e == nil && accepted[i] {
				e = err
			}
			r.done <- e
		}
		return rest
	}
}

// runGroup runs each request on a fresh writeTx. It returns the tx, which
// requests made it in (accepted) or failed alone (errs), and the ones that
// did not fit (rest, for the next group); err fails the whole group.
func (s *Store) runGroup(reqs []*writeReq) (w *writeTx, accepted []bool, errs []error, rest []*writeReq, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	h, headRev, loaded, err := s.prefetch(ctx, reqs)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	w = &writeTx{s: s, ctx: ctx, loaded: loaded, changes: map[string]*change{},
		meta: map[string][]byte{}, startRev: h.rev, rev: h.rev, ops: 1, bytes: 64, headModRev: headRev}
	accepted, errs = make([]bool, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		if len(rest) > 0 {
			rest = append(rest, r) // keep the order of writes
			continue
		}
		if errs[i] = r.ctx.Err(); errs[i] != nil {
			continue
		}
		cp := w.save()
		ferr := r.fn(w)
		switch {
		case errors.Is(ferr, errTouchedTwice) && i > 0:
			w.restore(cp)
			rest = append(rest, r)
		case ferr != nil && isStoreFailure(ferr):
			return nil, nil, nil, nil, ferr
		case ferr != nil:
			w.restore(cp)
			errs[i] = ferr
		case w.ops > s.cfg.MaxTxnOps || w.bytes > s.cfg.MaxTxnBytes-txnOverhead:
			w.restore(cp)
			if w.ops > 1 || len(w.meta) > 0 || len(w.changes) > 0 {
				rest = append(rest, r)
				continue
			}
			errs[i] = s.tooLarge()
		default:
			accepted[i] = true
		}
	}
	return w, accepted, errs, rest, nil
}

// prefetch reads head and every key the requests name in read-only
// transactions of at most MaxTxnOps gets (head in the first). Values read
// after head may be newer than it: the commit's compare on head then fails
// and the group reruns, so this is only ever an optimisation.
func (s *Store) prefetch(ctx context.Context, reqs []*writeReq) (head, int64, map[string]*resource.Resource, error) {
	loaded := map[string]*resource.Resource{}
	var encs []string
	for _, r := range reqs {
		for _, k := range r.keys {
			enc := string(kv.EncodeKey(k))
			if _, ok := loaded[enc]; !ok {
				loaded[enc] = nil
				encs = append(encs, enc)
			}
		}
	}
	var h head
	var headRev int64
	first := true
	for first || len(encs) > 0 {
		n := min(len(encs), s.cfg.MaxTxnOps-1)
		ops := make([]clientv3.Op, 0, n+1)
		if first {
			ops = append(ops, clientv3.OpGet(s.l.head()))
		}
		for _, enc := range encs[:n] {
			ops = append(ops, clientv3.OpGet(s.l.resource([]byte(enc))))
		}
		resp, err := s.readTxn(ctx, ops...)
		if err != nil {
			return head{}, 0, nil, s.wrapErr(err)
		}
		for i, r := range resp.Responses {
			kvs := r.GetResponseRange().Kvs
			if first && i == 0 {
				if len(kvs) == 1 {
					if h, err = decodeHead(kvs[0].Value); err != nil {
						return head{}, 0, nil, fmt.Errorf("etcdstore: %w", err)
					}
					headRev = kvs[0].ModRevision
				}
				continue
			}
			if len(kvs) == 1 {
				enc, _ := s.l.resourceKey(kvs[0].Key)
				_, res, err := decodeValue(s.cfg.Sealer, kvs[0].Value)
				if err != nil {
					return head{}, 0, nil, fmt.Errorf("etcdstore: resource %q: %w", enc, err)
				}
				loaded[string(enc)] = res
			}
		}
		encs, first = encs[n:], false
	}
	return h, headRev, loaded, nil
}

// readKeys are the keys a write of r reads: r itself and its mesh.
func readKeys(rs ...*resource.Resource) []resource.Key {
	out := make([]resource.Key, 0, 2*len(rs))
	for _, r := range rs {
		out = append(out, r.Key())
		if r.Mesh != "" {
			out = append(out, resource.Key{Type: "Mesh", Name: r.Mesh})
		}
	}
	return out
}

// isStoreFailure tells an etcd failure (the whole group fails) from a
// request's own refusal.
func isStoreFailure(err error) bool {
	return errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrClosed) || errors.Is(err, kv.ErrCorrupt)
}

func (s *Store) tooLarge() error {
	return fmt.Errorf("%w: one write may hold at most %d etcd operations and %d bytes (the cluster's --max-txn-ops and "+
		"--max-request-bytes; raise both there and in --etcd-max-txn-ops / --etcd-max-txn-bytes, or split the write)",
		storage.ErrTooLarge, s.cfg.MaxTxnOps-1, s.cfg.MaxTxnBytes-txnOverhead)
}

// commit writes the group in one transaction guarded by head's mod
// revision. ok=false: head moved, nothing was written. When etcd does not
// answer, commit rereads head to learn whether the transaction landed, so a
// committed write is never reported failed.
func (s *Store) commit(w *writeTx) (ok bool, err error) {
	if len(w.changes) == 0 && len(w.meta) == 0 {
		return true, nil
	}
	var ops []clientv3.Op
	var headVal []byte
	if w.rev != w.startRev {
		now := kv.NormalizeTime(s.cfg.Clock.Now())
		h := head{rev: w.rev, time: now.UnixNano()}
		for _, enc := range w.ordered() {
			if c := w.changes[enc]; c.res == nil {
				tomb := *c.tomb
				tomb.ModificationTime = now
				h.deletes = append(h.deletes, headDelete{rev: c.rev, tomb: &tomb})
			}
		}
		headVal = encodeHead(h)
		ops = append(ops, clientv3.OpPut(s.l.head(), string(headVal)))
	}
	ops = append(ops, w.changeOps()...)
	for k, v := range w.meta {
		ops = append(ops, clientv3.OpPut(s.l.meta(k), string(v)))
	}
	// The same guarded transaction is retried through transient errors
	// (a leader election): if an earlier attempt was applied after all, the
	// retry fails its compare (head moved) and head's history shows our
	// value; raft orders the attempts, so once a retry is evaluated the
	// earlier one's fate is settled.
	guard := clientv3.Compare(clientv3.ModRevision(s.l.head()), "=", w.headModRev)
	var resp *clientv3.TxnResponse
	attempts := 0
	err = s.withRetry(context.Background(), func(cctx context.Context) (err error) {
		attempts++
		resp, err = s.cli.Txn(cctx).If(guard).Then(ops...).Commit()
		return err
	})
	switch {
	case err == nil && resp.Succeeded:
		return true, nil
	case err == nil && (attempts == 1 || headVal == nil):
		return false, nil // another writer moved head first (meta alone is safe to rewrite)
	case err == nil:
		cctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
		defer cancel()
		ok, cerr := s.committed(cctx, headVal, w.rev)
		if cerr != nil {
			return s.resolve(headVal, w.rev, cerr)
		}
		return ok, nil
	case headVal == nil:
		return false, s.wrapErr(err)
	}
	return s.resolve(headVal, w.rev, err)
}

// resolve learns whether a transaction whose answer was lost committed. Its
// head value is unique (it carries the commit time), so it committed exactly
// when the write group that reached store revision rev wrote that value —
// found in head's history even if later writes moved head since.
func (s *Store) resolve(headVal []byte, rev uint64, cause error) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*s.cfg.RequestTimeout)
	defer cancel()
	for {
		committed, err := s.committed(ctx, headVal, rev)
		if err == nil {
			if committed {
				return true, nil
			}
			return false, s.wrapErr(cause)
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("%w: etcd did not answer a commit and its outcome could not be learned: %v", storage.ErrUnavailable, cause)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Store) committed(ctx context.Context, headVal []byte, rev uint64) (bool, error) {
	cur, _, err := s.readHead(ctx, 0)
	if err != nil {
		return false, err
	}
	if cur.rev < rev {
		return false, nil // no group reached rev: ours did not commit
	}
	at, err := s.startRevision(ctx, rev-1) // the group holding rev
	if err != nil {
		return false, err
	}
	resp, err := s.get(ctx, s.l.head(), clientv3.WithRev(at))
	if err != nil {
		return false, s.wrapErr(err)
	}
	return len(resp.Kvs) == 1 && bytes.Equal(resp.Kvs[0].Value, headVal), nil
}

// ordered returns the changed keys by revision, then in the order they were
// made, so that a watcher sees each revision's changes together.
func (w *writeTx) ordered() []string {
	encs := make([]string, 0, len(w.changes))
	for enc := range w.changes {
		encs = append(encs, enc)
	}
	slices.SortFunc(encs, func(a, b string) int {
		ca, cb := w.changes[a], w.changes[b]
		if ca.rev != cb.rev {
			return cmp.Compare(ca.rev, cb.rev)
		}
		return ca.order - cb.order
	})
	return encs
}

// changeOps are the etcd operations of the group's changes. A delete of a
// key etcd does not hold (put and deleted by one batch) needs none: head
// carries it.
func (w *writeTx) changeOps() []clientv3.Op {
	encs := w.ordered()
	ops := make([]clientv3.Op, 0, len(encs))
	for _, enc := range encs {
		c := w.changes[enc]
		switch {
		case c.res != nil:
			ops = append(ops, clientv3.OpPut(w.s.l.resource([]byte(enc)), string(c.value)))
		case c.prev != nil:
			ops = append(ops, clientv3.OpDelete(w.s.l.resource([]byte(enc))))
		}
	}
	return ops
}

// Create implements storage.Store.
func (s *Store) Create(ctx context.Context, r *resource.Resource) (*resource.Resource, error) {
	out, _, err := s.write(ctx, r, kv.ModeCreate)
	return out, err
}

// Update implements storage.Store.
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
	err := s.submit(ctx, readKeys(r), func(w *writeTx) (err error) {
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
	return s.submit(ctx, []resource.Key{key}, func(w *writeTx) error { return w.deleteOne(key, version) })
}

// Apply implements storage.Store.
func (s *Store) Apply(ctx context.Context, b storage.Batch) (*storage.BatchResult, error) {
	if err := kv.ValidateBatch(b); err != nil {
		return nil, err
	}
	var out *storage.BatchResult
	keys := append(readKeys(b.Puts...), b.Deletes...)
	err := s.submit(ctx, keys, func(w *writeTx) (err error) {
		out, err = w.apply(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
