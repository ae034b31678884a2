package boltstore

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Restore detection. A store file copied back from a backup carries the id of
// the store it was copied from, but its revisions are older: a peer resuming
// at a revision it saw from the live store would skip whatever the restored
// store writes under the same numbers. So every Open writes a fresh random
// epoch both into the file (meta) and into a sidecar file next to it
// (<path>.epoch). A file that comes back from a backup holds an epoch older
// than the sidecar's (a later Open rewrote the sidecar), or finds no sidecar
// at all (copied to a new place): Open then gives the store a new id, and
// every peer takes its full-snapshot path. A crash between the two writes
// also leaves them different: that costs one full resync, never a wrong
// resume.

// epochSuffix names the sidecar file: <store path><epochSuffix>.
const epochSuffix = ".epoch"

// readEpochFile returns the sidecar's epoch; "" when there is none.
func readEpochFile(path string) (string, error) {
	b, err := os.ReadFile(path + epochSuffix)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("boltstore: read %s: %w", path+epochSuffix, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// writeEpochFile replaces the sidecar atomically (temp file, fsync, rename,
// fsync of the directory).
func writeEpochFile(path, epoch string) error {
	name := path + epochSuffix
	tmp := name + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("boltstore: write %s: %w", name, err)
	}
	_, werr := f.WriteString(epoch + "\n")
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, name)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("boltstore: write %s: %w", name, werr)
	}
	if dir, err := os.Open(filepath.Dir(name)); err == nil {
		_ = dir.Sync()
		_ = dir.Close()
	}
	return nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
