package boltstore

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// The on-disk layout lives in this one file so that a schema change is one
// reviewable diff: bump schemaVersion, and teach checkSchema how to migrate.
//
// Layout (schema 1):
//
//	meta       schema version, store revision, compacted revision (8-byte big-endian each)
//	resources  resourceKey(type, mesh, namespace, name) -> logKey(12) ++ kv.AppendResource
//	log        logKey(revision BE 8, index BE 4)        -> opPut ++ resourceKey | opDelete ++ kv.AppendResource(tombstone)
//	tombstones logKey                                   -> deletion time (unix nanoseconds, BE 8)
//	usermeta   Batch.Meta key                            -> value
//
// The log holds exactly one put entry per live resource (its latest write;
// older ones are dropped when the resource is rewritten or deleted) plus one
// entry per delete until the expiry pass drops it. tombstones indexes the
// delete entries in revision order so that expiry never scans live entries.
const schemaVersion uint64 = 1

// Values inside the buckets: the kind of a log entry (its first byte), and
// (the leading format byte of an encoded resource is kv.ResourceFormat).
const (
	opPut    byte = 'P'
	opDelete byte = 'D'
)

// Bucket names and meta keys are strings, not []byte, so that nothing
// package-level is mutable; the conversions are a few bytes per transaction.
const (
	bucketMeta       = "meta"
	bucketResources  = "resources"
	bucketLog        = "log"
	bucketTombstones = "tombstones"
	bucketUserMeta   = "usermeta"

	metaKeySchema    = "schema"
	metaKeyRevision  = "revision"
	metaKeyCompacted = "compacted"
	// metaKeyStoreID is a random id given to the store at creation (or at
	// the first open of a store created before ids existed): a peer that
	// remembers another id for us knows the store was replaced.
	metaKeyStoreID = "store-id"
	// metaKeyEpoch is rewritten by every Open, beside the sidecar file
	// (epoch.go): a mismatch means the file came back from a backup.
	metaKeyEpoch = "epoch"
)

// Page fill. When a node outgrows its page at commit, bbolt splits it into
// pages filled to the bucket's FillPercent (half by default), leaving room
// for later inserts between the keys. The log and the tombstone index only
// grow at their end (their keys are revisions), so their pages are filled
// whole. The resources bucket keeps the default for ordinary writes (keys
// arrive anywhere), and a bulk write fills its pages to bulkFill: a cold
// zone's full snapshot writes every key in one transaction, and with half
// pages it wrote twice the pages it needed (BenchmarkApplyCold100000/sorted:
// 1.1–1.35 s and 425 MB before, see BENCHMARKS.md for after). So does a
// commit whose new keys mostly follow one another (runFill: names written
// in sequence, t-12300, t-12301...): the pages such writes leave behind
// receive no more keys, and at half fill a store written in sequence held
// twice its data in pages (TestPageFill).
const (
	appendOnlyFill = 1.0
	bulkFill       = 0.9
	// bulkPuts is the size from which a batch is a bulk write.
	bulkPuts = 1024
)

func allBuckets() []string {
	return []string{bucketMeta, bucketResources, bucketLog, bucketTombstones, bucketUserMeta}
}

// storedState is what Open needs from the meta bucket.
type storedState struct {
	revision  uint64
	compacted uint64
	id        string
	epoch     string // the epoch this Open wrote (the sidecar must follow)
	// replacedID is the id the file had when Open found it restored from a
	// backup (and gave it a new one); "" otherwise.
	replacedID string
}

// checkSchema verifies the schema version of the file and creates the buckets
// of a fresh file. It must run in a writable transaction; it returns before
// writing anything when the file is from a newer schema, so the caller's
// rollback leaves such a file untouched. sidecarEpoch is the epoch file's
// content ("" when absent).
func checkSchema(tx *bolt.Tx, path, sidecarEpoch string) (storedState, error) {
	meta := tx.Bucket([]byte(bucketMeta))
	if meta == nil {
		st, err := initSchema(tx, path)
		if err != nil {
			return st, err
		}
		st.epoch, err = newEpoch(tx.Bucket([]byte(bucketMeta)))
		if err != nil {
			return storedState{}, fmt.Errorf("boltstore: %s: %w", path, err)
		}
		return st, nil
	}
	raw := meta.Get([]byte(metaKeySchema))
	if len(raw) != 8 {
		return storedState{}, fmt.Errorf("boltstore: %s has no valid schema version (%d bytes): not a Meridian store or corrupted", path, len(raw))
	}
	v := binary.BigEndian.Uint64(raw)
	if v > schemaVersion {
		return storedState{}, fmt.Errorf("boltstore: %s was written with schema version %d, this binary supports up to %d; upgrade Meridian: %w",
			path, v, schemaVersion, storage.ErrNewerSchema)
	}
	// v < schemaVersion would be migrated here; schema 1 is the first.
	for _, name := range allBuckets() {
		if tx.Bucket([]byte(name)) == nil {
			return storedState{}, fmt.Errorf("boltstore: %s: bucket %q missing: corrupted store", path, name)
		}
	}
	st := storedState{revision: getUint64(meta, metaKeyRevision), compacted: getUint64(meta, metaKeyCompacted)}
	if old := meta.Get([]byte(metaKeyEpoch)); len(old) > 0 && string(old) != sidecarEpoch {
		// Restored from a backup (or copied without its sidecar): the
		// old id would let peers resume at revisions this file never had.
		st.replacedID = string(meta.Get([]byte(metaKeyStoreID)))
		if err := meta.Delete([]byte(metaKeyStoreID)); err != nil {
			return storedState{}, fmt.Errorf("boltstore: %s: %w", path, err)
		}
	}
	var err error
	if st.id, err = ensureStoreID(meta); err != nil {
		return storedState{}, fmt.Errorf("boltstore: %s: %w", path, err)
	}
	if st.epoch, err = newEpoch(meta); err != nil {
		return storedState{}, fmt.Errorf("boltstore: %s: %w", path, err)
	}
	return st, nil
}

// newEpoch records a fresh epoch for this Open.
func newEpoch(meta *bolt.Bucket) (string, error) {
	epoch, err := randomHex(16)
	if err != nil {
		return "", fmt.Errorf("epoch: %w", err)
	}
	if err := meta.Put([]byte(metaKeyEpoch), []byte(epoch)); err != nil {
		return "", fmt.Errorf("epoch: %w", err)
	}
	return epoch, nil
}

// ensureStoreID returns the store's id, creating it when absent.
func ensureStoreID(meta *bolt.Bucket) (string, error) {
	if id := meta.Get([]byte(metaKeyStoreID)); len(id) > 0 {
		return string(id), nil
	}
	id, err := randomHex(16)
	if err != nil {
		return "", fmt.Errorf("store id: %w", err)
	}
	if err := meta.Put([]byte(metaKeyStoreID), []byte(id)); err != nil {
		return "", fmt.Errorf("store id: %w", err)
	}
	return id, nil
}

// initSchema creates every bucket and records the schema version. A file
// that holds other buckets but no meta bucket is not ours; refuse it rather
// than mixing data.
func initSchema(tx *bolt.Tx, path string) (storedState, error) {
	var foreign []string
	if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		foreign = append(foreign, string(name))
		return nil
	}); err != nil {
		return storedState{}, fmt.Errorf("boltstore: %s: list buckets: %w", path, err)
	}
	if len(foreign) > 0 {
		return storedState{}, fmt.Errorf("boltstore: %s holds buckets %q but no schema version: not a Meridian store", path, foreign)
	}
	for _, name := range allBuckets() {
		if _, err := tx.CreateBucket([]byte(name)); err != nil {
			return storedState{}, fmt.Errorf("boltstore: %s: create bucket %q: %w", path, name, err)
		}
	}
	if err := putUint64(tx.Bucket([]byte(bucketMeta)), metaKeySchema, schemaVersion); err != nil {
		return storedState{}, fmt.Errorf("boltstore: %s: write schema version: %w", path, err)
	}
	id, err := ensureStoreID(tx.Bucket([]byte(bucketMeta)))
	if err != nil {
		return storedState{}, fmt.Errorf("boltstore: %s: %w", path, err)
	}
	return storedState{id: id}, nil
}

func getUint64(b *bolt.Bucket, key string) uint64 {
	v := b.Get([]byte(key))
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func putUint64(b *bolt.Bucket, key string, v uint64) error {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], v)
	return b.Put([]byte(key), buf[:])
}
