//go:build !linux

package boltstore

// releaseMapped does nothing where the store has no way to advise the
// kernel; the map's pages stay resident until the kernel reclaims them.
func releaseMapped(addr, n uintptr) error { return nil }
