package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
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

	startRev  uint64
	rev       uint64 // last revision assigned in this transaction
	mutations int
}

func newWriteTx(tx *bolt.Tx, clock Clock) *writeTx {
	w := &writeTx{
		meta:       tx.Bucket([]byte(bucketMeta)),
		resources:  tx.Bucket([]byte(bucketResources)),
		log:        tx.Bucket([]byte(bucketLog)),
		tombstones: tx.Bucket([]byte(bucketTombstones)),
		userMeta:   tx.Bucket([]byte(bucketUserMeta)),
		clock:      clock,
	}
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
	return putUint64(w.meta, metaKeyRevision, w.rev)
}

type putMode int

const (
	modeCreate putMode = iota
	modeUpdate
	modePut
)

func (m putMode) String() string {
	switch m {
	case modeCreate:
		return "create"
	case modeUpdate:
		return "update"
	}
	return "put"
}

// writeResource applies one create, update or put as change idx of revision
// rev. It returns the stored resource (owned by the caller); an Unchanged put
// writes nothing.
func (w *writeTx) writeResource(in *resource.Resource, mode putMode, rev uint64, idx uint32) (*resource.Resource, storage.Outcome, error) {
	key := in.Key()
	k := encodeKey(key)
	old, err := loadRecord(w.resources, k)
	if err != nil {
		return nil, 0, err
	}
	if err := checkWrite(key, old, in.Version, mode); err != nil {
		return nil, 0, err
	}
	if old != nil && mode == modePut && sameContent(old.res, in) {
		return old.res, storage.Unchanged, nil
	}
	next, outcome := nextVersion(in, old, normalizeTime(w.clock.Now()))
	lk := makeLogKey(rev, idx)
	if old != nil {
		if err := w.del(w.log, old.log[:]); err != nil {
			return nil, 0, fmt.Errorf("boltstore: drop log entry of %s: %w", key, err)
		}
	}
	if err := w.put(w.log, lk[:], append([]byte{opPut}, k...)); err != nil {
		return nil, 0, fmt.Errorf("boltstore: log %s: %w", key, err)
	}
	if err := w.put(w.resources, k, encodeRecord(lk, next)); err != nil {
		return nil, 0, fmt.Errorf("boltstore: write %s: %w", key, err)
	}
	return next, outcome, nil
}

// checkWrite enforces the Store contract's preconditions for a write.
func checkWrite(key resource.Key, old *record, version uint64, mode putMode) error {
	op := mode.String()
	switch {
	case mode == modeCreate && old != nil:
		return fmt.Errorf("%s %s: %w", op, key, storage.ErrAlreadyExists)
	case mode == modeUpdate && old == nil:
		return fmt.Errorf("%s %s: %w", op, key, storage.ErrNotFound)
	case mode == modeCreate || version == 0:
		return nil
	case old == nil:
		return fmt.Errorf("%s %s: version %d given but the resource does not exist: %w", op, key, version, storage.ErrConflict)
	case old.res.Version != version:
		return fmt.Errorf("%s %s: version %d given, stored %d: %w", op, key, version, old.res.Version, storage.ErrConflict)
	}
	return nil
}

// sameContent compares what a Put may change; nil and empty are equal.
func sameContent(a, b *resource.Resource) bool {
	return maps.Equal(a.Labels, b.Labels) && bytes.Equal(a.Spec, b.Spec) && bytes.Equal(a.Status, b.Status)
}

// nextVersion builds the resource to store from the caller's copy: the
// store owns Version and the times, and empty labels, spec and status are
// stored as absent so that what a write returns equals what a read decodes.
func nextVersion(in *resource.Resource, old *record, now time.Time) (*resource.Resource, storage.Outcome) {
	next := in.Clone()
	if len(next.Labels) == 0 {
		next.Labels = nil
	}
	if len(next.Spec) == 0 {
		next.Spec = nil
	}
	if len(next.Status) == 0 {
		next.Status = nil
	}
	next.ModificationTime = now
	if old == nil {
		next.Version, next.CreationTime = 1, now
		return next, storage.Created
	}
	next.Version, next.CreationTime = old.res.Version+1, old.res.CreationTime
	return next, storage.Updated
}

// deleteResource removes key as change idx of revision rev, replacing its
// log entry with a tombstone that keeps the last labels.
func (w *writeTx) deleteResource(key resource.Key, version uint64, rev uint64, idx uint32) error {
	k := encodeKey(key)
	old, err := loadRecord(w.resources, k)
	switch {
	case err != nil:
		return err
	case old == nil:
		return fmt.Errorf("delete %s: %w", key, storage.ErrNotFound)
	case version != 0 && old.res.Version != version:
		return fmt.Errorf("delete %s: version %d given, stored %d: %w", key, version, old.res.Version, storage.ErrConflict)
	}
	now := normalizeTime(w.clock.Now())
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
		{w.log, lk[:], encodeResource([]byte{opDelete}, tomb)},
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
	return nil
}

// apply writes a storage.Batch at one revision; see storage.Batch for the
// order of its parts. A failing put may come after earlier puts were
// written: the committer then rolls the transaction back.
func (w *writeTx) apply(b storage.Batch) (*storage.BatchResult, error) {
	deletes := b.Deletes
	if b.Check != nil {
		more, err := b.Check(w)
		if err != nil {
			return nil, err // before any write: a clean failure
		}
		for i, k := range more {
			if err := validateKey(k); err != nil {
				return nil, fmt.Errorf("batch check delete %d: %w", i, err)
			}
		}
		deletes = append(slices.Clone(deletes), more...)
	}
	rev := w.rev + 1
	var idx uint32
	res := &storage.BatchResult{Outcomes: make([]storage.Outcome, len(b.Puts)), Stored: make([]*resource.Resource, len(b.Puts))}
	for i, p := range b.Puts {
		stored, outcome, err := w.writeResource(p, modePut, rev, idx)
		if err != nil {
			return nil, fmt.Errorf("batch put %d: %w", i, err)
		}
		res.Outcomes[i], res.Stored[i] = outcome, stored
		if outcome != storage.Unchanged {
			idx++
		}
	}
	for _, key := range deletes {
		err := w.deleteResource(key, 0, rev, idx)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("batch delete: %w", err)
		}
		idx++
		res.Deleted++
	}
	for k, v := range b.Meta {
		if err := w.put(w.userMeta, []byte(k), v); err != nil {
			return nil, fmt.Errorf("boltstore: batch meta %q: %w", k, err)
		}
	}
	if idx > 0 {
		w.rev = rev
	}
	res.Revision = w.rev
	return res, nil
}

// Get implements storage.TxReader.
func (w *writeTx) Get(key resource.Key) (*resource.Resource, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	rec, err := loadRecord(w.resources, encodeKey(key))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, fmt.Errorf("%s: %w", key, storage.ErrNotFound)
	}
	return rec.res, nil
}

// List implements storage.TxReader.
func (w *writeTx) List(opts storage.ListOptions) (*storage.ListResult, error) {
	if err := validateList(opts); err != nil {
		return nil, err
	}
	return scan(context.Background(), w.resources, opts)
}

func validateResource(r *resource.Resource) error {
	if r == nil {
		return fmt.Errorf("%w: nil resource", storage.ErrInvalid)
	}
	return validateKey(r.Key())
}

func validateBatch(b storage.Batch) error {
	for i, p := range b.Puts {
		if err := validateResource(p); err != nil {
			return fmt.Errorf("batch put %d: %w", i, err)
		}
	}
	for i, k := range b.Deletes {
		if err := validateKey(k); err != nil {
			return fmt.Errorf("batch delete %d: %w", i, err)
		}
	}
	for k := range b.Meta {
		if k == "" || len(k) > bolt.MaxKeySize {
			return fmt.Errorf("%w: batch meta key of %d bytes", storage.ErrInvalid, len(k))
		}
	}
	return nil
}
