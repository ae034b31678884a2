// Package mapping holds the pure functions of multizone sync (docs/kds.md,
// ): which resources flow in which direction (scope filters),
// and how a resource is renamed, relabelled and has its references rewritten
// when it crosses between a zone and the global. Nothing here does I/O; the
// stream loops in internal/kds call these functions for every change.
package mapping

import (
	"encoding/hex"
	"hash/fnv"
	"strings"
)

// hashAlphabet is Kubernetes' rand.SafeEncodeString alphabet (no vowels, no
// look-alike characters), which Kuma uses for hashed names.
const hashAlphabet = "bcdfghjklmnpqrstvwxz2456789"

// maxNameLength is the DNS-1123 subdomain limit of resource names.
const maxNameLength = 253

// hashSuffixLength is "-" plus 16 encoded characters.
const hashSuffixLength = 17

// HashedName is the Kuma-compatible name of a synced copy (docs/kds.md#names-labels-references):
// truncate(name, 236) + "-" + h, where h is the FNV-1a 64 hash of mesh, name
// and then each of values (the kuma.io/zone and k8s.kuma.io/namespace label
// values, in that order, each only when present), written big-endian as 16
// hex characters and mapped through hashAlphabet. Empty values are skipped,
// which is what "when present" means for a label.
func HashedName(mesh, name string, values ...string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(mesh))
	_, _ = h.Write([]byte(name))
	for _, v := range values {
		if v != "" {
			_, _ = h.Write([]byte(v))
		}
	}
	var sum [8]byte
	var hexed [16]byte
	hex.Encode(hexed[:], h.Sum(sum[:0]))
	for i, c := range hexed {
		hexed[i] = hashAlphabet[int(c)%len(hashAlphabet)]
	}
	if limit := maxNameLength - hashSuffixLength; len(name) > limit {
		// Truncated, the display part may end in '.', which would leave an
		// empty-edged part before the suffix ("a.-h"): drop it.
		name = strings.TrimRight(name[:limit], ".")
	}
	return name + "-" + string(hexed[:])
}

// GlobalCopyName reports whether name is the name a global resource called
// original gets in a zone (HashedName(mesh, original)), so that a zone can
// refuse a local resource squatting it. A truncated original is not
// recognized (the hash covers the full name).
func GlobalCopyName(mesh, name string) (original string, ok bool) {
	if len(name) <= hashSuffixLength || name[len(name)-hashSuffixLength] != '-' {
		return "", false
	}
	original = name[:len(name)-hashSuffixLength]
	return original, HashedName(mesh, original) == name
}
