package auth

import (
	"errors"
	"testing"
	"time"
)

type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }

func TestKeyRingRotation(t *testing.T) {
	dir := t.TempDir()
	clock := &stepClock{now: time.Now()}
	ring, err := LoadZoneKeyRing(dir, clock)
	if err != nil {
		t.Fatal(err)
	}
	oldToken, oldClaims, err := ring.Tokens().IssueToken("zone-1", 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	newID, oldID, retireAt, err := ring.Rotate(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if oldID != oldClaims.KeyID || newID == oldID || ring.Tokens().KeyID() != newID {
		t.Fatalf("rotate: new %s old %s, token kid %s, current %s", newID, oldID, oldClaims.KeyID, ring.Tokens().KeyID())
	}
	// Old tokens verify during the overlap, and say when their key retires.
	_, at, err := ring.Tokens().VerifyWithKey(oldToken, "zone-1")
	if err != nil || !at.Equal(retireAt) {
		t.Fatalf("old token during overlap: %v, retires %v want %v", err, at, retireAt)
	}
	newToken, _, err := ring.Tokens().IssueToken("zone-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, at, err := ring.Tokens().VerifyWithKey(newToken, "zone-1"); err != nil || !at.IsZero() {
		t.Fatalf("new token: %v %v", err, at)
	}
	// A restart keeps both keys.
	again, err := LoadZoneKeyRing(dir, clock)
	if err != nil {
		t.Fatal(err)
	}
	if keys := again.Keys(); len(keys) != 2 || keys[0].ID != newID || keys[1].ID != oldID {
		t.Fatalf("keys after reload: %+v", keys)
	}
	if _, err := again.Tokens().Verify(oldToken, "zone-1"); err != nil {
		t.Fatalf("old token after reload: %v", err)
	}
	// After the overlap the old key no longer verifies.
	clock.now = retireAt.Add(time.Second)
	if _, err := again.Tokens().Verify(oldToken, "zone-1"); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("old token after retirement: %v", err)
	}
	// Explicit retirement; the current key cannot be retired.
	clock.now = time.Now()
	if _, _, _, err := ring.Rotate(time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := ring.Retire(newID); err != nil {
		t.Fatalf("retire: %v", err)
	}
	if _, err := ring.Tokens().Verify(newToken, "zone-1"); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("token of a retired key: %v", err)
	}
	if err := ring.Retire(ring.Tokens().KeyID()); !errors.Is(err, ErrKeyInUse) {
		t.Fatalf("retire current: %v", err)
	}
	if err := ring.Retire("../x"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("retire a path: %v", err)
	}
}
