package auth

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestAdminTokenRenewal: the generated admin token is short-lived and a
// new one is written once it no longer verifies (expired, or its key
// rotated); a file others can read is refused.
func TestAdminTokenRenewal(t *testing.T) {
	dir := t.TempDir()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	users, err := LoadOrCreateUserTokens(dir, clock)
	if err != nil {
		t.Fatal(err)
	}
	path, written, err := users.EnsureAdminToken(dir)
	if err != nil || written == nil {
		t.Fatalf("first start: %v %v", written, err)
	}
	if got := time.Duration(written.ExpiresAt-written.IssuedAt) * time.Second; got != AdminTokenValidity {
		t.Errorf("admin token valid for %s, want %s", got, AdminTokenValidity)
	}
	first, _ := os.ReadFile(path)
	if _, again, err := users.EnsureAdminToken(dir); err != nil || again != nil {
		t.Fatalf("a valid admin token was replaced: %v %v", again, err)
	}
	clock.now = clock.now.Add(AdminTokenValidity + time.Second)
	_, renewed, err := users.EnsureAdminToken(dir)
	if err != nil || renewed == nil || renewed.ID == written.ID {
		t.Fatalf("an expired admin token was not replaced: %v %v", renewed, err)
	}
	second, _ := os.ReadFile(path)
	if string(first) == string(second) {
		t.Error("the file still holds the expired token")
	}
	if _, err := users.Verify(strings.TrimSpace(string(second))); err != nil {
		t.Errorf("the renewed token does not verify: %v", err)
	}
	// A rotated user-token key (the file removed, a new one made) makes
	// the old admin token unverifiable: a new one is written.
	other, err := LoadOrCreateUserTokens(t.TempDir(), clock)
	if err != nil {
		t.Fatal(err)
	}
	if _, rotated, err := other.EnsureAdminToken(dir); err != nil || rotated == nil {
		t.Errorf("an admin token of another key was kept: %v %v", rotated, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.EnsureAdminToken(dir); !errors.Is(err, ErrInsecureFile) {
		t.Errorf("an admin token readable by others: %v", err)
	}
}

// TestUserTokenNames: names show in logs and pages; control characters,
// bidirectional formatting and invalid UTF-8 are refused, and so is a list
// of meshes that confines the token to none.
func TestUserTokenNames(t *testing.T) {
	users, err := LoadOrCreateUserTokens(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]UserTokenRequest{
		"newline":        {Name: "eve\nlevel=info", Groups: []string{GroupViewer}, ValidFor: time.Hour},
		"escape":         {Name: "eve\x1b[2J", Groups: []string{GroupViewer}, ValidFor: time.Hour},
		"bidi override":  {Name: "eve\u202egnp.exe", Groups: []string{GroupViewer}, ValidFor: time.Hour},
		"bidi isolate":   {Name: "eve\u2066x", Groups: []string{GroupViewer}, ValidFor: time.Hour},
		"invalid UTF-8":  {Name: "eve\xff", Groups: []string{GroupViewer}, ValidFor: time.Hour},
		"no mesh at all": {Name: "bob", Groups: []string{GroupAdmin}, Meshes: []string{}, ValidFor: time.Hour},
	} {
		if _, _, err := users.Issue(req); !errors.Is(err, ErrInvalidUserTokenRequest) {
			t.Errorf("%s: %v, want an invalid request", name, err)
		}
	}
	if _, _, err := users.Issue(UserTokenRequest{Name: "Zoë O'Brien", Groups: []string{GroupViewer}, ValidFor: time.Hour}); err != nil {
		t.Errorf("a plain Unicode name refused: %v", err)
	}
}
