package boltstore

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ReleaseMap drops the store file's pages from this process's resident set.
//
// bbolt reads the file through a shared, read-only memory map, so every page
// a read touched (a list of every resource, a zone's first load, the tree a
// commit walks) stays mapped into the process and counts in its RSS until
// the kernel reclaims it: at 100,000 policies a whole file, about 45 MiB of
// a zone's 210. Those pages are clean copies of the file. Dropping them from
// the mapping (madvise MADV_DONTNEED) leaves them in the kernel's page
// cache, shared and reclaimable like a file read with read(2); the next read
// of a page maps it again with a minor fault. Nothing the store holds is
// lost: bbolt writes the file with pwrite, never through the map.
//
// It runs inside a read transaction, which keeps bbolt from remapping the
// file meanwhile (a remap waits for every read transaction), so the range
// advised is the live mapping. Concurrent readers are safe: a page dropped
// under one is faulted back from the page cache with the same contents.
// Callers call it when the process is quiet (the control plane's memory
// trimmer); under load it would only trade resident pages for faults.
func (s *Store) ReleaseMap(ctx context.Context) error {
	return s.view(ctx, func(tx *bolt.Tx) error {
		if err := releaseMapped(tx.DB().Info().Data, uintptr(tx.Size())); err != nil {
			return fmt.Errorf("boltstore: release the map of %s: %w", s.cfg.Path, err)
		}
		return nil
	})
}
