package zoneaccess_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/zoneaccess"
)

// streams records what the access ends, as the KDS server would.
type streams struct {
	mu   sync.Mutex
	live []kds.StreamInfo
}

func (s *streams) EndStreams(match func(kds.StreamInfo) bool, _ error) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	kept := s.live[:0]
	for _, st := range s.live {
		if match(st) {
			n++
			continue
		}
		kept = append(kept, st)
	}
	s.live = kept
	return n
}

func (s *streams) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

type fixture struct {
	dir    string
	store  *boltstore.Store
	ring   *auth.ZoneKeyRing
	access *zoneaccess.Access
	live   *streams
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(dir, "meridian.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &fixture{dir: dir, store: store, live: &streams{}}
	f.reopen(t)
	return f
}

// reopen builds the access again on the same data dir and store, as a
// restarted global does.
func (f *fixture) reopen(t *testing.T) {
	t.Helper()
	ring, err := auth.LoadZoneKeyRing(f.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	access, err := zoneaccess.New(context.Background(), zoneaccess.Config{Ring: ring, Store: f.store, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	access.Attach(f.live)
	f.ring, f.access = ring, access
}

// connect authenticates a zone's stream and counts it live.
func (f *fixture) connect(t *testing.T, zone, token string) kds.ZoneCredential {
	t.Helper()
	cred, err := f.access.Authenticate(zone, token)
	if err != nil {
		t.Fatalf("authenticate %s: %v", zone, err)
	}
	f.live.mu.Lock()
	f.live.live = append(f.live.live, kds.StreamInfo{Zone: zone, TokenID: cred.TokenID, KeyID: cred.KeyID})
	f.live.mu.Unlock()
	return cred
}

func (f *fixture) issue(t *testing.T, zone string) (string, auth.Claims) {
	t.Helper()
	token, claims, err := f.ring.IssueToken(zone, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return token, claims
}

func (f *fixture) putZone(t *testing.T, zone string, enabled bool) {
	t.Helper()
	spec := `{"enabled":true}`
	if !enabled {
		spec = `{"enabled":false}`
	}
	if _, _, err := f.store.Put(context.Background(), &resource.Resource{Type: "Zone", Name: zone, Spec: []byte(spec)}); err != nil {
		t.Fatal(err)
	}
}

// TestRevocation: a revoked token is refused from then on, across a
// restart; its live streams end; a credential admitted before the
// revocation (a stream still in its handshake) fails Recheck; other
// tokens of the zone keep working.
func TestRevocation(t *testing.T) {
	f := newFixture(t)
	token, claims := f.issue(t, "zone-1")
	other, _ := f.issue(t, "zone-1")
	cred := f.connect(t, "zone-1", token)
	f.connect(t, "zone-1", other)
	inHandshake, err := f.access.Authenticate("zone-1", token)
	if err != nil {
		t.Fatal(err)
	}

	ended, err := f.access.Revoke(context.Background(), claims.ID)
	if err != nil || ended != 1 {
		t.Fatalf("Revoke = %d, %v; want the token's one live stream ended", ended, err)
	}
	if f.live.count() != 1 {
		t.Errorf("%d streams live, want the other token's", f.live.count())
	}
	for name, c := range map[string]kds.ZoneCredential{"live stream": cred, "stream in its handshake": inHandshake} {
		if err := f.access.Recheck("zone-1", c); err == nil || !strings.Contains(err.Error(), "revoked") {
			t.Errorf("Recheck of the %s: %v, want revoked", name, err)
		}
	}
	if _, err := f.access.Authenticate("zone-1", token); err == nil {
		t.Error("a revoked token authenticated")
	}
	f.reopen(t)
	if _, err := f.access.Authenticate("zone-1", token); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("after a restart the revoked token gives %v", err)
	}
	if _, err := f.access.Authenticate("zone-1", other); err != nil {
		t.Errorf("another token of the zone refused: %v", err)
	}
	if _, err := f.access.Revoke(context.Background(), ""); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("Revoke of an empty id: %v", err)
	}
}

// TestDisabledZone: a Zone with enabled: false is refused at once, its
// streams end when the write commits, and credentials admitted before fail
// Recheck until it is enabled again.
func TestDisabledZone(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.access.WatchZones(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(50 * time.Millisecond) // the watch starts from the current revision

	token, _ := f.issue(t, "zone-1")
	cred := f.connect(t, "zone-1", token)
	f.connect(t, "zone-2", func() string { tok, _ := f.issue(t, "zone-2"); return tok }())
	f.putZone(t, "zone-1", false)
	waitFor(t, "zone-1's stream ended", func() bool { return f.live.count() == 1 })
	if err := f.access.Recheck("zone-1", cred); err == nil || !strings.Contains(err.Error(), "disabled") {
		t.Errorf("Recheck of a disabled zone's credential: %v", err)
	}
	if _, err := f.access.Authenticate("zone-1", token); err == nil || !strings.Contains(err.Error(), "disabled") {
		t.Errorf("Authenticate of a disabled zone: %v", err)
	}
	f.putZone(t, "zone-1", true)
	waitFor(t, "zone-1 enabled again", func() bool { return f.access.Recheck("zone-1", cred) == nil })
	if _, err := f.access.Authenticate("zone-1", token); err != nil {
		t.Errorf("Authenticate after enabling: %v", err)
	}
}

// TestRetiredKey: retiring a rotated-out signing key ends the streams its
// tokens opened, and their credentials fail Recheck.
func TestRetiredKey(t *testing.T) {
	f := newFixture(t)
	token, _ := f.issue(t, "zone-1")
	cred := f.connect(t, "zone-1", token)
	_, oldID, _, err := f.access.RotateKey(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.access.Recheck("zone-1", cred); err != nil {
		t.Fatalf("within the overlap: %v", err)
	}
	fresh, _ := f.issue(t, "zone-1")
	f.connect(t, "zone-1", fresh)
	ended, err := f.access.RetireKey(oldID)
	if err != nil || ended != 1 {
		t.Fatalf("RetireKey = %d, %v; want the old key's stream ended", ended, err)
	}
	if err := f.access.Recheck("zone-1", cred); err == nil || !strings.Contains(err.Error(), "retired") {
		t.Errorf("Recheck after retirement: %v", err)
	}
	if _, err := f.access.Authenticate("zone-1", token); err == nil {
		t.Error("a token of a retired key authenticated")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
