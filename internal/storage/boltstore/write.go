package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// writeTx is one write transaction, shared by every request of a commit
// group. Only the committer goroutine uses it.
//
// Each request function must either succeed or fail with a precondition
// error (not found, exists, conflict, invalid) before its first bucket write;
// mutations counts bucket writes so that the committer can tell such a clean
// failure, which leaves the other requests' work intact, from a failure
// half-way through, which forces a rollback.
type writeTx struct {
	meta, resources, log, tombstones, userMeta *bolt.Bucket
	clock                                      Clock
	sealer                                     *kv.Sealer

	startRev  uint64
	rev       uint64 // last revision assigned in this transaction
	mutations int
	// changes are the log's changes in order, published to the store's
	// recentLog once the transaction commits.
	changes []logChange
	// owned: the batch being applied handed its resources over
	// (storage.Batch.Owned).
	owned bool
	// created are the keys of the resources this transaction created, for
	// choosing the page fill (runFill).
	created [][]byte
}

func newWriteTx(tx *bolt.Tx, clock Clock, sealer *kv.Sealer) *writeTx {
	w := &writeTx{
		sealer:     sealer,
		meta:       tx.Bucket([]byte(bucketMeta)),
		resources:  tx.Bucket([]byte(bucketResources)),
		log:        tx.Bucket([]byte(bucketLog)),
		tombstones: tx.Bucket([]byte(bucketTombstones)),
		userMeta:   tx.Bucket([]byte(bucketUserMeta)),
		clock:      clock,
	}
	// FillPercent is a property of this transaction's bucket handles, used
	// when the commit splits nodes (schema.go, "Page fill").
	w.log.FillPercent = appendOnlyFill
	w.tombstones.FillPercent = appendOnlyFill
	w.startRev = getUint64(w.meta, metaKeyRevision)
	w.rev = w.startRev
	return w
}

func (w *writeTx) put(b *bolt.Bucket, k, v []byte) error {
	w.mutations++
	return b.Put(k, v)
}

func (w *writeTx) del(b *bolt.Bucket, k []byte) error {
	w.mutations++
	return b.Delete(k)
}

// finish records the revision reached; the caller then commits.
func (w *writeTx) finish() error {
	if w.rev == w.startRev {
		return nil
	}
	w.runFill()
	return putUint64(w.meta, metaKeyRevision, w.rev)
}

// runFill fills the resources bucket's split pages to bulkFill when most
// keys this transaction created are each followed, in the bucket, by
// another of them (schema.go, "Page fill"). Keys landing among existing
// ones keep bbolt's half fill, room for their neighbours to come.
func (w *writeTx) runFill() {
	if len(w.created) < 2 || w.resources.FillPercent >= bulkFill {
		return
	}
	slices.SortFunc(w.created, bytes.Compare)
	c := w.resources.Cursor()
	followed := 0
	for i, k := range w.created[:len(w.created)-1] {
		c.Seek(k)
		if next, _ := c.Next(); bytes.Equal(next, w.created[i+1]) {
			followed++
		}
	}
	if 2*followed >= len(w.created)-1 {
		w.resources.FillPercent = bulkFill
	}
}

// writeResource applies one create, update or put as change idx of revision
// rev. It returns the stored resource, which the commit also hands to
// watchers (recentLog): immutable, like every resource.Resource passed on.
// An Unchanged put writes nothing.
func (w *writeTx) writeResource(in *resource.Resource, mode kv.PutMode, rev uint64, idx uint32) (*resource.Resource, storage.Outcome, error) {
	key := in.Key()
	k := kv.EncodeKey(key)
	old, err := loadRecord(w.sealer, w.resources, k)
	if err != nil {
		return nil, 0, err
	}
	var oldRes *resource.Resource
	if old != nil {
		oldRes = old.res
	}
	if err := kv.CheckWrite(key, oldRes, in.Version, mode); err != nil {
		return nil, 0, err
	}
	if old != nil && mode == kv.ModePut && kv.SameContent(old.res, in) {
		return old.res, storage.Unchanged, nil
	}
	next, outcome := kv.NextVersion(in, oldRes, kv.NormalizeTime(w.clock.Now()), w.owned)
	lk := makeLogKey(rev, idx)
	if old != nil {
		if err := w.del(w.log, old.log[:]); err != nil {
			return nil, 0, fmt.Errorf("boltstore: drop log entry of %s: %w", key, err)
		}
	}
	if err := w.put(w.log, lk[:], append([]byte{opPut}, k...)); err != nil {
		return nil, 0, fmt.Errorf("boltstore: log %s: %w", key, err)
	}
	rec, err := encodeRecord(w.sealer, lk, next)
	if err == nil {
		err = w.put(w.resources, k, rec)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("boltstore: write %s: %w", key, err)
	}
	if old == nil {
		w.created = append(w.created, k)
	} else {
		w.changes = append(w.changes, logChange{key: old.log, dropped: true})
	}
	w.changes = append(w.changes, logChange{key: lk, ev: storage.Event{Kind: storage.EventPut, Revision: rev, Resource: next}})
	return next, outcome, nil
}

// deleteResource removes key as change idx of revision rev, replacing its
// log entry with a tombstone that keeps the last labels.
func (w *writeTx) deleteResource(key resource.Key, version uint64, rev uint64, idx uint32) error {
	k := kv.EncodeKey(key)
	old, err := loadRecord(w.sealer, w.resources, k)
	switch {
	case err != nil:
		return err
	case old == nil:
		return fmt.Errorf("delete %s: %w", key, storage.ErrNotFound)
	case version != 0 && old.res.Version != version:
		return fmt.Errorf("delete %s: version %d given, stored %d: %w", key, version, old.res.Version, storage.ErrConflict)
	}
	now := kv.NormalizeTime(w.clock.Now())
	tomb := &resource.Resource{
		Type: key.Type, Mesh: key.Mesh, Namespace: key.Namespace, Name: key.Name,
		Labels:           old.res.Labels,
		CreationTime:     old.res.CreationTime,
		ModificationTime: now,
		Version:          old.res.Version,
	}
	lk := makeLogKey(rev, idx)
	var deletedAt [8]byte
	binary.BigEndian.PutUint64(deletedAt[:], uint64(now.UnixNano()))
	for _, op := range []struct {
		b    *bolt.Bucket
		k, v []byte
	}{
		{w.log, old.log[:], nil},
		{w.resources, k, nil},
		{w.log, lk[:], kv.AppendResource([]byte{opDelete}, tomb)},
		{w.tombstones, lk[:], deletedAt[:]},
	} {
		if op.v == nil {
			err = w.del(op.b, op.k)
		} else {
			err = w.put(op.b, op.k, op.v)
		}
		if err != nil {
			return fmt.Errorf("boltstore: delete %s: %w", key, err)
		}
	}
	w.changes = append(w.changes, logChange{key: old.log, dropped: true},
		logChange{key: lk, ev: storage.Event{Kind: storage.EventDelete, Revision: rev, Resource: tomb}})
	return nil
}

// apply writes a storage.Batch at one revision; see storage.Batch for the
// order of its parts. A failing put may come after earlier puts were
// written: the committer then rolls the transaction back.
func (w *writeTx) apply(b storage.Batch) (*storage.BatchResult, error) {
	deletes, err := kv.BatchDeletes(b, w)
	if err != nil {
		return nil, err // before any write: a clean failure
	}
	if len(b.Puts) >= bulkPuts {
		w.resources.FillPercent = bulkFill // for the whole commit: see "Page fill"
	}
	w.owned = b.Owned
	defer func() { w.owned = false }() // the group's other writes are not
	bw := w.newBatch()
	res := &storage.BatchResult{Outcomes: make([]storage.Outcome, len(b.Puts)), Stored: make([]*resource.Resource, len(b.Puts))}
	if err := bw.puts(b.Puts, res.Outcomes, res.Stored); err != nil {
		return nil, err
	}
	if err := bw.rest(deletes, b.Meta); err != nil {
		return nil, err
	}
	res.Revision, res.Deleted = bw.finish(), bw.deleted
	return res, nil
}

// batchWriter writes one batch, possibly in parts (an ApplyStream), as
// the changes of one revision.
type batchWriter struct {
	w       *writeTx
	rev     uint64 // the batch's revision
	idx     uint32 // the next change's position in it
	deleted int
}

func (w *writeTx) newBatch() *batchWriter { return &batchWriter{w: w, rev: w.rev + 1} }

// puts writes puts in order (see bulkOrder), setting outcomes[i] and
// stored[i] for puts[i] when those are given.
func (bw *batchWriter) puts(puts []*resource.Resource, outcomes []storage.Outcome, stored []*resource.Resource) error {
	bw.w.changes = slices.Grow(bw.w.changes, len(puts)) // one change per put at least
	order := bulkOrder(puts)                            // nil: as given
	for n, p := range puts {
		i := n
		if order != nil {
			i = order[n]
			p = puts[i]
		}
		st, outcome, err := bw.w.writeResource(p, kv.ModePut, bw.rev, bw.idx)
		if err != nil {
			return fmt.Errorf("batch put %d: %w", i, err)
		}
		if outcomes != nil {
			outcomes[i], stored[i] = outcome, st
		}
		if outcome != storage.Unchanged {
			bw.idx++
		}
	}
	return nil
}

// rest writes a batch's deletes (absent keys ignored) and meta.
func (bw *batchWriter) rest(deletes []resource.Key, meta map[string][]byte) error {
	for _, key := range deletes {
		err := bw.w.deleteResource(key, 0, bw.rev, bw.idx)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("batch delete: %w", err)
		}
		bw.idx++
		bw.deleted++
	}
	for k, v := range meta {
		if err := bw.w.put(bw.w.userMeta, []byte(k), v); err != nil {
			return fmt.Errorf("boltstore: batch meta %q: %w", k, err)
		}
	}
	return nil
}

// finish ends the batch: its revision counts only if it changed a
// resource. It returns the transaction's revision.
func (bw *batchWriter) finish() uint64 {
	if bw.idx > 0 {
		bw.w.rev = bw.rev
	}
	return bw.w.rev
}

// Get implements storage.TxReader.
func (w *writeTx) Get(key resource.Key) (*resource.Resource, error) {
	r, err := w.Lookup(key)
	if err == nil && r == nil {
		return nil, fmt.Errorf("%s: %w", key, storage.ErrNotFound)
	}
	return r, err
}

// Lookup is Get without the error for an absent key (nil, nil): checks
// inside a transaction look up every key a batch writes, and a cold zone's
// 100,000 new keys each cost a formatted ErrNotFound that was thrown away.
func (w *writeTx) Lookup(key resource.Key) (*resource.Resource, error) {
	if err := kv.ValidateKey(key); err != nil {
		return nil, err
	}
	rec, err := loadRecord(w.sealer, w.resources, kv.EncodeKey(key))
	if err != nil || rec == nil {
		return nil, err
	}
	return rec.res, nil
}

// List implements storage.TxReader.
func (w *writeTx) List(opts storage.ListOptions) (*storage.ListResult, error) {
	if err := kv.ValidateList(opts); err != nil {
		return nil, err
	}
	return scan(context.Background(), w.sealer, w.resources, opts)
}

// bulkOrder is the order in which apply writes a bulk write's puts when
// they are not sorted by key already: sorted, stably, so that a key given
// twice keeps its order and the batch's result is the same. nil means in
// the order given. bbolt inserts into a node's sorted array of keys, so a
// large write in random order moves half that array per put: 100,000 puts
// into an empty store took 22 s shuffled against 0.4 s sorted
// (BenchmarkApplyCold100000). Only the order of the revision's changes
// differs, and a revision is one atomic change.
func bulkOrder(puts []*resource.Resource) []int {
	byKey := func(a, b *resource.Resource) int { return kv.CompareKeys(a.Key(), b.Key()) }
	if len(puts) < bulkPuts || slices.IsSortedFunc(puts, byKey) {
		return nil
	}
	order := make([]int, len(puts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return byKey(puts[a], puts[b]) })
	return order
}
