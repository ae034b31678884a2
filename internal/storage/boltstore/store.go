// Package boltstore is the embedded bbolt implementation of storage.Store.
//
// Writes go through one committer goroutine that groups concurrent single
// writes into one transaction (one commit and its fsyncs; commit.go); each
// write still gets its own revision. A batch may also be written in parts
// while it is produced (storage.Streaming, stream.go): one request then
// holds the committer's transaction until it commits or the store gives up
// on it. Every write appends to a change log that watchers replay, sharing
// the decoded entries (eventcache.go); see schema.go for the layout and
// watch.go for the watcher design.
package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// ErrInUse is wrapped by Open when another process (or another Open in this
// one) holds the data file.
var ErrInUse = errors.New("data dir in use by another process")

// Store implements storage.Store on a bbolt file. It is safe for concurrent
// use; Close waits for the committer, the expiry loop and every watcher
// goroutine to stop before it closes the file.
type Store struct {
	db    *bolt.DB
	cfg   Config
	log   hclog.Logger
	clock Clock

	// writes feeds the committer goroutine (commit.go).
	writes chan *writeReq
	// closing is closed by Close; every goroutine of the store selects on it.
	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup

	// revision is the last committed revision. Only the committer stores it,
	// after the commit and before acknowledging, so a writer that got its
	// answer reads at least its own revision.
	revision atomic.Uint64
	// commits is signalled after every commit that changed the log.
	commits *broadcaster
	// events shares decoded log entries among watchers.
	events *eventCache
	// recent mirrors the log's last commits for watchers at its head.
	recent *recentLog

	// mu guards closed and watchers, and serializes changes to compacted with
	// watcher registration (see expire.go for why).
	mu        sync.Mutex
	closed    bool
	watchers  map[*watcher]struct{}
	compacted atomic.Uint64

	// watchChunk is defaultWatchChunk; tests shrink it (before any Watch)
	// to exercise chunk boundaries with small logs.
	watchChunk int

	id string // set at Open, never changes
}

// ID implements storage.Store.
func (s *Store) ID() string { return s.id }

var _ storage.Store = (*Store)(nil)
var _ storage.Streaming = (*Store)(nil)

// Open opens or creates the store at cfg.Path, checks its schema version and
// starts the committer and the tombstone expiry loop.
func Open(cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	db, err := openDB(cfg)
	if err != nil {
		return nil, err
	}
	sidecar, err := readEpochFile(cfg.Path)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	var st storedState
	if err := db.Update(func(tx *bolt.Tx) (err error) {
		st, err = checkSchema(tx, cfg.Path, sidecar)
		return err
	}); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := writeEpochFile(cfg.Path, st.epoch); err != nil {
		_ = db.Close()
		return nil, err
	}
	if st.replacedID != "" {
		cfg.Logger.Warn("store file is not the one last opened here (restored from a backup or copied): it gets a new id, so sync peers resend in full instead of resuming",
			"path", cfg.Path, "previous_id", st.replacedID, "new_id", st.id)
	}
	s := &Store{
		db:         db,
		cfg:        cfg,
		log:        cfg.Logger,
		clock:      cfg.Clock,
		writes:     make(chan *writeReq),
		closing:    make(chan struct{}),
		commits:    newBroadcaster(),
		events:     newEventCache(eventCacheSize),
		watchers:   make(map[*watcher]struct{}),
		watchChunk: defaultWatchChunk,
	}
	s.revision.Store(st.revision)
	s.recent = newRecentLog(st.revision, recentLimit)
	s.compacted.Store(st.compacted)
	s.id = st.id
	s.wg.Add(2)
	go s.commitLoop()
	go s.expiryLoop()
	s.log.Info("store opened", "path", cfg.Path, "schema", schemaVersion, "id", st.id,
		"revision", st.revision, "compacted_revision", st.compacted)
	return s, nil
}

// initialMmapSize is the mapping bbolt starts with (see openDB).
const initialMmapSize = 1 << 30

func openDB(cfg Config) (*bolt.DB, error) {
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: create data dir: %w", err)
	}
	db, err := bolt.Open(cfg.Path, 0o600, &bolt.Options{
		Timeout: cfg.LockTimeout,
		// The freelist is rebuilt by a scan at open instead of being written
		// by every commit: fewer pages per fsync, the same crash safety.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// Address space reserved up front (not memory: pages are only
		// resident once used). Each time the file outgrows the mapping,
		// bbolt remaps it, copying every node the write transaction holds
		// and blocking reads meanwhile: loading 100,000 policies into a
		// new zone spent a sixth of its CPU in remaps. etcd reserves 10 GiB.
		InitialMmapSize: initialMmapSize,
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("boltstore: %s: %w (file lock not acquired within %s)", cfg.Path, ErrInUse, cfg.LockTimeout)
	case err != nil:
		return nil, fmt.Errorf("boltstore: open %s: %w", cfg.Path, err)
	}
	return db, nil
}

// Close stops the store's goroutines, closes every watch channel and the
// file. It is idempotent; concurrent callers all wait for the first.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.closing)
		s.mu.Unlock()
		s.wg.Wait()
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("boltstore: close %s: %w", s.cfg.Path, err)
			return
		}
		s.log.Info("store closed", "path", s.cfg.Path, "revision", s.revision.Load())
	})
	return s.closeErr
}

func (s *Store) isClosed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// view runs fn in a read transaction, mapping a closed database to
// storage.ErrClosed.
func (s *Store) view(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return storage.ErrClosed
	}
	err := s.db.View(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return storage.ErrClosed
	}
	return err
}

// Get implements storage.Store.
func (s *Store) Get(ctx context.Context, key resource.Key) (*resource.Resource, error) {
	if err := kv.ValidateKey(key); err != nil {
		return nil, err
	}
	var out *resource.Resource
	err := s.view(ctx, func(tx *bolt.Tx) error {
		rec, err := loadRecord(s.cfg.Sealer, tx.Bucket([]byte(bucketResources)), kv.EncodeKey(key))
		switch {
		case err != nil:
			return err
		case rec == nil:
			return fmt.Errorf("get %s: %w", key, storage.ErrNotFound)
		}
		out = rec.res
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// loadRecord returns nil, nil when the key is absent.
func loadRecord(sealer *kv.Sealer, b *bolt.Bucket, key []byte) (*record, error) {
	v := b.Get(key)
	if v == nil {
		return nil, nil
	}
	rec, err := decodeRecord(sealer, v)
	if err != nil {
		return nil, fmt.Errorf("boltstore: resource %q: %w", key, err)
	}
	return &rec, nil
}

// Revision implements storage.Store. It reads the revision in a read
// transaction rather than from the in-memory counter, which is advanced only
// after a commit returns: a List that already saw a commit must never be
// followed by a smaller Revision (sync's snapshot de-duplication relies on
// it).
func (s *Store) Revision(ctx context.Context) (uint64, error) {
	var rev uint64
	err := s.view(ctx, func(tx *bolt.Tx) error {
		rev = getUint64(tx.Bucket([]byte(bucketMeta)), metaKeyRevision)
		return nil
	})
	return rev, err
}

// CompactedRevision implements storage.Store.
func (s *Store) CompactedRevision(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if s.isClosed() {
		return 0, storage.ErrClosed
	}
	return s.compacted.Load(), nil
}

// Meta implements storage.Store.
func (s *Store) Meta(ctx context.Context, key string) ([]byte, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: empty meta key", storage.ErrInvalid)
	}
	var out []byte
	err := s.view(ctx, func(tx *bolt.Tx) error {
		v := tx.Bucket([]byte(bucketUserMeta)).Get([]byte(key))
		if v == nil {
			return fmt.Errorf("meta %q: %w", key, storage.ErrNotFound)
		}
		out = append([]byte{}, v...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
