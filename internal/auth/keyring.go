package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"
)

// ZoneKeyRing keeps the zone token signing keys of a global's data dir:
// the current key (SigningKeyFileName), which signs, and previous keys,
// which still verify until they retire (PreviousKeysDir/<kid>.key with the
// retirement in <kid>.retire). Rotate makes a new current key and keeps the
// old one for an overlap window, so zones can get new tokens before the old
// ones stop working.
//
// Concurrency: Tokens is lock-free (an immutable ZoneTokens swapped
// atomically); Rotate and Retire serialize on a mutex.
type ZoneKeyRing struct {
	dir   string
	clock Clock

	mu     gosync.Mutex
	tokens atomic.Pointer[ZoneTokens]
}

// PreviousKeysDir holds rotated-out keys inside the data dir.
const PreviousKeysDir = "zone-token-previous-keys"

// KeyInfo describes one signing key.
type KeyInfo struct {
	ID       string     `json:"kid"`
	Current  bool       `json:"current"`
	RetireAt *time.Time `json:"retireAt,omitempty"`
}

// LoadZoneKeyRing loads (creating the current key on first start) the
// ring in dataDir. Previous keys past their retirement are deleted.
func LoadZoneKeyRing(dataDir string, clock Clock) (*ZoneKeyRing, error) {
	if clock == nil {
		clock = realClock{}
	}
	r := &ZoneKeyRing{dir: dataDir, clock: clock}
	if _, err := LoadOrCreateSigningKey(r.currentPath()); err != nil {
		return nil, err
	}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload rereads the keys from the data dir: another global replica rotated
// or retired a key and its files were written here (HA).
func (r *ZoneKeyRing) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reload()
}

// Tokens returns the issuer/verifier of the current key set.
func (r *ZoneKeyRing) Tokens() *ZoneTokens { return r.tokens.Load() }

// IssueToken issues a token signed by the current key.
func (r *ZoneKeyRing) IssueToken(zone string, validFor time.Duration) (string, Claims, error) {
	return r.Tokens().IssueToken(zone, validFor)
}

func (r *ZoneKeyRing) currentPath() string { return filepath.Join(r.dir, SigningKeyFileName) }
func (r *ZoneKeyRing) previousDir() string { return filepath.Join(r.dir, PreviousKeysDir) }

// reload reads the keys from disk and swaps in a new ZoneTokens.
func (r *ZoneKeyRing) reload() error {
	current, err := loadSigningKey(r.currentPath())
	if err != nil {
		return err
	}
	previous, err := r.loadPrevious(KeyID(current))
	if err != nil {
		return err
	}
	t, err := NewZoneTokens(ZoneTokensConfig{Key: current, Previous: previous, Clock: r.clock})
	if err != nil {
		return err
	}
	r.tokens.Store(t)
	return nil
}

func (r *ZoneKeyRing) loadPrevious(currentID string) ([]PreviousKey, error) {
	entries, err := os.ReadDir(r.previousDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("zone token keys: %w", err)
	}
	now := r.clock.Now()
	var out []PreviousKey
	for _, e := range entries {
		kid, ok := strings.CutSuffix(e.Name(), ".key")
		if !ok {
			continue
		}
		keyPath := filepath.Join(r.previousDir(), e.Name())
		retirePath := filepath.Join(r.previousDir(), kid+".retire")
		raw, err := os.ReadFile(retirePath)
		if err != nil {
			return nil, fmt.Errorf("zone token key %s: %w", kid, err)
		}
		retireAt, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(raw)))
		if err != nil {
			return nil, fmt.Errorf("zone token key %s: retirement %q: %w", kid, raw, err)
		}
		if !now.Before(retireAt) || kid == currentID {
			// Retired (or the current key left behind by an interrupted
			// rotation): forget it.
			_ = os.Remove(keyPath)
			_ = os.Remove(retirePath)
			continue
		}
		key, err := loadSigningKey(keyPath)
		if err != nil {
			return nil, err
		}
		out = append(out, PreviousKey{Key: key, RetireAt: retireAt})
	}
	return out, nil
}

// Keys lists the keys, the current one first, then by retirement.
func (r *ZoneKeyRing) Keys() []KeyInfo {
	t := r.Tokens()
	out := []KeyInfo{{ID: t.kid, Current: true}}
	now := r.clock.Now()
	for _, p := range t.previous {
		if now.Before(p.RetireAt) {
			at := p.RetireAt.UTC()
			out = append(out, KeyInfo{ID: KeyID(p.Key), RetireAt: &at})
		}
	}
	sort.SliceStable(out[1:], func(i, j int) bool { return out[1+i].RetireAt.Before(*out[1+j].RetireAt) })
	return out
}

// Rotate makes a new current key; the old one verifies for overlap more.
// It returns the new and the old key ids.
func (r *ZoneKeyRing) Rotate(overlap time.Duration) (newID, oldID string, retireAt time.Time, err error) {
	if overlap < 0 || overlap > MaxValidity {
		return "", "", time.Time{}, fmt.Errorf("rotate zone token key: overlap %s must be between 0 and %s", overlap, MaxValidity)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old, err := loadSigningKey(r.currentPath())
	if err != nil {
		return "", "", time.Time{}, err
	}
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", time.Time{}, fmt.Errorf("rotate zone token key: %w", err)
	}
	oldID, newID, retireAt = KeyID(old), KeyID(next), r.clock.Now().Add(overlap)
	// The old key goes to the previous keys first: a crash before the new
	// key is installed leaves the old key current (and also listed as
	// previous, which reload ignores).
	if err := os.MkdirAll(r.previousDir(), 0o700); err != nil {
		return "", "", time.Time{}, fmt.Errorf("rotate zone token key: %w", err)
	}
	if err := writeKeyFile(filepath.Join(r.previousDir(), oldID+".key"), old); err != nil {
		return "", "", time.Time{}, err
	}
	if err := replaceFile(filepath.Join(r.previousDir(), oldID+".retire"), []byte(retireAt.UTC().Format(time.RFC3339Nano)+"\n")); err != nil {
		return "", "", time.Time{}, err
	}
	if err := writeKeyFile(r.currentPath(), next); err != nil {
		return "", "", time.Time{}, err
	}
	return newID, oldID, retireAt, r.reload()
}

// Retire drops a previous key at once: tokens it signed stop verifying.
func (r *ZoneKeyRing) Retire(kid string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kid == r.Tokens().kid {
		return fmt.Errorf("%w: key %s is the current key: rotate first", ErrKeyInUse, kid)
	}
	keyPath := filepath.Join(r.previousDir(), kid+".key")
	if strings.ContainsAny(kid, "/\\.") || kid == "" {
		return fmt.Errorf("%w: %q", ErrUnknownKey, kid)
	}
	if _, err := os.Stat(keyPath); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", ErrUnknownKey, kid)
	}
	if err := os.Remove(keyPath); err != nil {
		return fmt.Errorf("retire zone token key %s: %w", kid, err)
	}
	_ = os.Remove(filepath.Join(r.previousDir(), kid+".retire"))
	return r.reload()
}

// Errors of key management.
var (
	ErrKeyInUse   = errors.New("signing key in use")
	ErrUnknownKey = errors.New("no such signing key")
)

// writeKeyFile writes key (PEM PKCS #8, 0600), replacing path atomically.
func writeKeyFile(path string, key ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode signing key: %w", err)
	}
	return replaceFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// replaceFile writes data to path (0600) through a synced temporary file
// renamed into place, so readers see the old or the new content, never a
// mix.
func replaceFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
