package boltstore

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/storagetest"
)

func TestOpenConfig(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
	}{
		{"no path", Config{}, ErrInvalidConfig},
		{"negative retention", Config{Path: filepath.Join(dir, "a.db"), TombstoneRetention: -time.Second}, ErrInvalidConfig},
		{"negative expiry interval", Config{Path: filepath.Join(dir, "b.db"), ExpiryInterval: -1}, ErrInvalidConfig},
		{"negative lock timeout", Config{Path: filepath.Join(dir, "c.db"), LockTimeout: -1}, ErrInvalidConfig},
		{"negative write group", Config{Path: filepath.Join(dir, "d.db"), MaxWriteGroup: -1}, ErrInvalidConfig},
		{"negative group wait", Config{Path: filepath.Join(dir, "e.db"), MaxGroupWait: -1}, ErrInvalidConfig},
		{"defaults, missing parent dirs created", Config{Path: filepath.Join(dir, "x", "y", "e.db")}, nil},
	}
	for _, tc := range tests {
		s, err := Open(tc.cfg)
		switch {
		case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.wantErr)
		case tc.wantErr == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case err == nil:
			if s.cfg.TombstoneRetention != DefaultTombstoneRetention || s.cfg.LockTimeout != DefaultLockTimeout ||
				s.cfg.ExpiryInterval != DefaultExpiryInterval || s.cfg.MaxWriteGroup != DefaultMaxWriteGroup || s.cfg.MaxGroupWait != DefaultMaxGroupWait ||
				s.cfg.Logger == nil || s.cfg.Clock == nil {
				t.Errorf("%s: defaults not applied: %+v", tc.name, s.cfg)
			}
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestOpenInUse: a second Open of the same file fails fast with ErrInUse
// (flock is per open file, so this holds within one process as across
// processes), and succeeds once the first store is closed.
func TestOpenInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meridian.db")
	first, err := Open(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Open(Config{Path: path, LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open: %v, want ErrInUse", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("second open waited %s", waited)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(Config{Path: path})
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	_ = again.Close()
}

// TestNewerSchema: a file whose schema version is above ours is refused
// with ErrNewerSchema and left untouched.
func TestNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meridian.db")
	s, err := Open(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(t.Context(), &resource.Resource{Type: "Mesh", Name: "default"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	setRawSchema(t, path, schemaVersion+1)

	_, err = Open(Config{Path: path})
	if !errors.Is(err, storage.ErrNewerSchema) || !strings.Contains(err.Error(), "schema version 2") {
		t.Fatalf("open: %v, want ErrNewerSchema naming the version", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatalf("file left locked or broken: %v", err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if v := getUint64(tx.Bucket([]byte(bucketMeta)), metaKeySchema); v != schemaVersion+1 {
			t.Errorf("schema version rewritten to %d", v)
		}
		if tx.Bucket([]byte(bucketResources)).Stats().KeyN != 1 {
			t.Errorf("resources changed by the refused open")
		}
		return nil
	})
}

func setRawSchema(t *testing.T, path string, v uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], v)
		return tx.Bucket([]byte(bucketMeta)).Put([]byte(metaKeySchema), buf[:])
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestForeignFiles: files that are not Meridian stores are refused.
func TestForeignFiles(t *testing.T) {
	dir := t.TempDir()
	notBolt := filepath.Join(dir, "text.db")
	if err := os.WriteFile(notBolt, []byte(strings.Repeat("not a database\n", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	otherBolt := filepath.Join(dir, "other.db")
	db, err := bolt.Open(otherBolt, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("theirs")); return err }); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	for _, path := range []string{notBolt, otherBolt} {
		if s, err := Open(Config{Path: path, LockTimeout: 100 * time.Millisecond}); err == nil {
			_ = s.Close()
			t.Errorf("%s: opened a file that is not a Meridian store", filepath.Base(path))
		}
	}
}

// TestExpiryLoop: the background pass runs on its own.
func TestExpiryLoop(t *testing.T) {
	clock := storagetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "m.db"), Clock: clock,
		TombstoneRetention: time.Hour, ExpiryInterval: 5 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := &resource.Resource{Type: "Mesh", Name: "m"}
	if _, err := s.Create(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(t.Context(), r.Key(), 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, _ := s.CompactedRevision(t.Context()); c == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("background expiry did not compact the delete at revision 2")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestExpiryWaitsForWatchers: a watcher that has not read its deletes
// holds expiry back instead of missing them. With one-entry chunks the
// watcher goroutine can read at most its buffer plus one entry ahead of a
// consumer that does not read, so its position is pinned mid-log.
func TestExpiryWaitsForWatchers(t *testing.T) {
	const n = 200
	clock := storagetest.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "m.db"), Clock: clock, TombstoneRetention: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.watchChunk = 1
	ctx := t.Context()
	var keys []resource.Key
	for i := range n {
		r, err := s.Create(ctx, &resource.Resource{Type: "Mesh", Name: string(rune('a'+i%26)) + strings.Repeat("x", i/26)})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, r.Key())
	}
	if _, err := s.Apply(ctx, storage.Batch{Deletes: keys[:n/2]}); err != nil { // one revision, n/2 tombstones
		t.Fatal(err)
	}
	for _, k := range keys[n/2:] { // one revision each
		if err := s.Delete(ctx, k, 0); err != nil {
			t.Fatal(err)
		}
	}
	head, _ := s.Revision(ctx)
	ch, err := s.Watch(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the watcher goroutine is blocked on a full channel: it has
	// then read 65 of the 100 deletes of revision n+1 and no further.
	for deadline := time.Now().Add(10 * time.Second); len(ch) < cap(ch); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("watcher filled %d of %d buffered events", len(ch), cap(ch))
		}
	}
	clock.Advance(2 * time.Hour)
	if _, err := s.ExpireTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.CompactedRevision(ctx); c != 0 {
		t.Fatalf("expiry compacted up to %d under a watcher that has not finished revision %d", c, n+1)
	}
	deletes := 0
	for ev := range ch {
		if ev.Kind != storage.EventDelete {
			t.Fatalf("unexpected %v", ev)
		}
		if deletes++; ev.Revision == head {
			break
		}
	}
	if deletes != n {
		t.Fatalf("watcher got %d deletes, want %d", deletes, n)
	}
	if _, err := s.ExpireTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.CompactedRevision(ctx); c != head {
		t.Fatalf("compacted %d once the watcher caught up, want %d", c, head)
	}
}

// TestStoreIDSurvivesReopenButNotRestore: the id stays across restarts, a
// new file gets a new one, and a file copied back from a backup (or moved
// without its sidecar) gets a new one too, so that peers do not resume at
// revisions the restored file never had.
func TestStoreIDSurvivesReopenButNotRestore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "meridian.db")
	openID := func() string {
		t.Helper()
		s, err := Open(Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return s.ID()
	}
	copyFile := func(from, to string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	first := openID()
	if again := openID(); again != first {
		t.Fatalf("reopen changed the id: %s -> %s", first, again)
	}
	backup := filepath.Join(dir, "backup.db")
	copyFile(path, backup) // a cold backup
	if again := openID(); again != first {
		t.Fatalf("reopen after a backup changed the id: %s -> %s", first, again)
	}
	copyFile(backup, path) // restored after a later Open
	restored := openID()
	if restored == first {
		t.Fatalf("a restored file kept id %s", first)
	}
	if again := openID(); again != restored {
		t.Fatalf("reopen after the restore changed the id again: %s -> %s", restored, again)
	}
	if err := os.Remove(path + epochSuffix); err != nil {
		t.Fatal(err)
	}
	if moved := openID(); moved == restored {
		t.Fatalf("a file without its sidecar kept id %s", restored)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if fresh := openID(); fresh == restored || fresh == first {
		t.Fatalf("a new file reused an id: %s", fresh)
	}
}
