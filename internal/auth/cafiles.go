package auth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meridian-mesh/meridian/internal/ca"
)

// XDSClientCAName is the base name of the zone's CA for xDS client
// certificates (<name>.crt, <name>.key in the data dir).
const XDSClientCAName = "xds-client-ca"

// xdsClientCAValidity is the life of a generated xDS client CA.
const xdsClientCAValidity = 10 * 365 * 24 * time.Hour

// LoadOrCreateCA loads the CA dataDir/<name>.crt and .key (0600), creating
// a root the first time, and returns an authority signing with it.
func LoadOrCreateCA(dataDir, name, commonName string, now func() time.Time) (*ca.Authority, error) {
	certPath, keyPath := filepath.Join(dataDir, name+".crt"), filepath.Join(dataDir, name+".key")
	certPEM, err := os.ReadFile(certPath)
	if errors.Is(err, fs.ErrNotExist) {
		cp, kp, gerr := ca.NewRoot(rand.Reader, now(), commonName, xdsClientCAValidity)
		if gerr != nil {
			return nil, gerr
		}
		// Key first: a crash in between leaves a key without a certificate,
		// which the next start replaces.
		_ = os.Remove(keyPath)
		if err := writeFileExclusive(keyPath, kp); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := writeFileExclusive(certPath, cp); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		certPEM = cp
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := checkPrivate(keyPath); err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	a, err := ca.LoadAuthority(certPEM, keyPEM, certPEM, rand.Reader, now)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return a, nil
}
