package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// expireChunk bounds the tombstones dropped per write transaction so that an
// expiry pass never holds the writer lock for long.
const expireChunk = 4096

// ExpireTombstones drops tombstones deleted at least TombstoneRetention ago,
// oldest first, and raises CompactedRevision to the highest revision it
// dropped; it returns how many it dropped. It stops at the first tombstone
// that is too young or that a running watcher has not read yet, so the
// dropped history is always a prefix and a lagging watcher never loses a
// delete (it holds expiry back instead).
//
// The background loop calls it every ExpiryInterval; tests call it directly.
// It is safe to call concurrently with any other method. It holds s.mu for
// the whole pass, so Watch registrations wait for it: that is what makes the
// compacted check in Watch and the watcher floor here agree.
func (s *Store) ExpireTombstones(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, storage.ErrClosed
	}
	floor := s.watchFloor()
	cutoff := s.clock.Now().Add(-s.cfg.TombstoneRetention).UnixNano()
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, compacted, err := s.expireSome(cutoff, floor)
		total += n
		if err != nil {
			return total, err
		}
		s.compacted.Store(compacted)
		if n < expireChunk {
			break
		}
	}
	if total > 0 {
		s.log.Debug("tombstones expired", "count", total, "compacted_revision", s.compacted.Load())
	}
	return total, nil
}

// expireSome drops up to expireChunk expired tombstones below floor in one
// transaction and returns the compacted revision it recorded.
func (s *Store) expireSome(cutoff int64, floor uint64) (n int, compacted uint64, err error) {
	// Look first in a read transaction: the usual pass finds nothing, and
	// an empty write transaction would still cost a commit and its fsyncs.
	err = s.db.View(func(tx *bolt.Tx) error {
		compacted = getUint64(tx.Bucket([]byte(bucketMeta)), metaKeyCompacted)
		drop, err := expiredTombstones(tx.Bucket([]byte(bucketTombstones)), cutoff, floor)
		n = len(drop)
		return err
	})
	if err != nil || n == 0 {
		return 0, compacted, err
	}
	n = 0
	err = s.db.Update(func(tx *bolt.Tx) error {
		meta, log, tombs := tx.Bucket([]byte(bucketMeta)), tx.Bucket([]byte(bucketLog)), tx.Bucket([]byte(bucketTombstones))
		compacted = getUint64(meta, metaKeyCompacted)
		drop, err := expiredTombstones(tombs, cutoff, floor)
		if err != nil || len(drop) == 0 {
			return err
		}
		for _, k := range drop {
			if err := log.Delete(k[:]); err != nil {
				return fmt.Errorf("boltstore: drop tombstone %d: %w", k.revision(), err)
			}
			if err := tombs.Delete(k[:]); err != nil {
				return fmt.Errorf("boltstore: drop tombstone index %d: %w", k.revision(), err)
			}
		}
		compacted = max(compacted, drop[len(drop)-1].revision())
		n = len(drop)
		return putUint64(meta, metaKeyCompacted, compacted)
	})
	return n, compacted, err
}

// expiredTombstones lists, oldest first, the tombstones that may go. They
// are collected before any delete because deleting under a live cursor
// skips entries; logKey is an array, so they are copies, not views into
// pages the deletes rewrite.
func expiredTombstones(tombs *bolt.Bucket, cutoff int64, floor uint64) ([]logKey, error) {
	var drop []logKey
	c := tombs.Cursor()
	for k, v := c.First(); k != nil && len(drop) < expireChunk; k, v = c.Next() {
		lk, err := parseLogKey(k)
		if err != nil {
			return nil, fmt.Errorf("boltstore: tombstone index: %w", err)
		}
		if len(v) != 8 {
			return nil, fmt.Errorf("boltstore: tombstone %d: %w: deletion time of %d bytes", lk.revision(), kv.ErrCorrupt, len(v))
		}
		if lk.revision() > floor || int64(binary.BigEndian.Uint64(v)) > cutoff {
			break
		}
		drop = append(drop, lk)
	}
	return drop, nil
}

// expiryLoop runs ExpireTombstones every ExpiryInterval until Close.
func (s *Store) expiryLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ExpiryInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
			if _, err := s.ExpireTombstones(context.Background()); err != nil && !errors.Is(err, storage.ErrClosed) {
				s.log.Warn("tombstone expiry failed", "error", err)
			}
			s.mu.Lock()
			floor := s.watchFloor()
			s.mu.Unlock()
			s.recent.release(floor)
		}
	}
}
