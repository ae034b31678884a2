// Package auth holds the credentials of multizone sync: zone tokens, signed
// by a key the global control plane generates on first start and keeps in
// its data dir, and the TLS material of the global's KDS listener (a
// self-signed certificate generated into the data dir when none is given)
// together with the zone's client TLS configuration.
//
// The package depends on nothing else in the project; internal/kds declares
// the small interface it needs (ZoneTokens.Authenticate satisfies it).
package auth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Clock tells the time for token issue and expiry checks and certificate
// validity. Tests inject a fake one; it must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// writeFileExclusive writes data to path with mode 0600 without ever
// replacing an existing file: it writes a temporary file in the same
// directory, syncs it and hard-links it into place, so a concurrent or
// crashed writer never leaves a half-written key behind. It returns
// os.ErrExist (wrapped) when path already exists.
func writeFileExclusive(path string, data []byte) error {
	return writeFileAtomic(path, data, os.Link)
}

// writeFileReplace writes data to path with mode 0600, replacing what is
// there atomically (a temporary file renamed into place).
func writeFileReplace(path string, data []byte) error {
	return writeFileAtomic(path, data, os.Rename)
}

func writeFileAtomic(path string, data []byte, install func(tmp, path string) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := install(tmp.Name(), path); err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	return nil
}

// checkPrivate refuses a secret file that others can read: a signing key
// readable by every local user lets any of them mint zone tokens.
// CheckPrivateFile refuses a secret file (a token, a key) that group or
// others can read, with a message saying how to fix it.
func CheckPrivateFile(path string) error { return checkPrivate(path) }

func checkPrivate(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s has mode %#o: %w (want 0600; chmod 600 it)", path, perm, ErrInsecureFile)
	}
	return nil
}

// SecretsKeyFileName is the data-dir file of a control plane's secrets
// key, which seals key material at rest (Secrets, CA keys) when no
// replicas share an etcd store.
const SecretsKeyFileName = "secrets.key"

// LoadOrCreateSecretsKey returns the 32-byte key in path, creating it
// (random, 0600) on first start; a file others can read is refused.
func LoadOrCreateSecretsKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
		err = writeFileExclusive(path, key)
		if errors.Is(err, fs.ErrExist) {
			return LoadOrCreateSecretsKey(path) // another process made it first
		}
		if err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	if err := checkPrivate(path); err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets key %s: %d bytes, want 32", path, len(key))
	}
	return key, nil
}
