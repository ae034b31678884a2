package boltstore

import "syscall"

// releaseMapped advises the kernel that the n bytes of the shared file
// mapping at addr are not needed: their pages leave the resident set and
// stay in the page cache. The address comes from bbolt (DB.Info), so no Go
// pointer is made from it.
func releaseMapped(addr, n uintptr) error {
	if n == 0 {
		return nil
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, addr, n, syscall.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}
