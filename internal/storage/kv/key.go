// Package kv holds what the key-value backends (boltstore, etcdstore) share:
// how a resource key and a resource are encoded, the List filter, and the
// Store contract's rules for a write (preconditions, versions, times). One
// home for them keeps the two backends answering alike.
package kv

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// MaxKeyBytes bounds an encoded resource key (bbolt's key limit; etcd
// keeps the same so that both accept the same names).
const MaxKeyBytes = 32768

// Keys of the resources bucket are type NUL mesh NUL namespace NUL name. NUL
// sorts below every other byte, so byte order equals the (mesh, namespace,
// name) tuple order the List contract asks for, and "type NUL" or
// "type NUL mesh NUL" is a prefix that selects exactly one type or mesh.
const KeySep = 0

// ValidateKey rejects keys the encoding cannot represent unambiguously.
func ValidateKey(k resource.Key) error {
	switch {
	case k.Type == "":
		return fmt.Errorf("%w: resource type is empty (%s)", storage.ErrInvalid, k)
	case k.Name == "":
		return fmt.Errorf("%w: resource name is empty (%s)", storage.ErrInvalid, k)
	}
	n := 3
	for _, s := range []string{k.Type, k.Mesh, k.Namespace, k.Name} {
		if strings.IndexByte(s, KeySep) >= 0 {
			return fmt.Errorf("%w: NUL byte in resource key %q", storage.ErrInvalid, k.String())
		}
		n += len(s)
	}
	if n > MaxKeyBytes {
		return fmt.Errorf("%w: resource key of %d bytes exceeds %d", storage.ErrInvalid, n, MaxKeyBytes)
	}
	return nil
}

func EncodeKey(k resource.Key) []byte {
	b := make([]byte, 0, len(k.Type)+len(k.Mesh)+len(k.Namespace)+len(k.Name)+3)
	b = append(b, k.Type...)
	b = append(b, KeySep)
	b = append(b, k.Mesh...)
	b = append(b, KeySep)
	b = append(b, k.Namespace...)
	b = append(b, KeySep)
	return append(b, k.Name...)
}

// CompareKeys orders keys as their encodings sort (EncodeKey): field by
// field, since KeySep sorts before every byte a field may hold.
func CompareKeys(a, b resource.Key) int {
	if c := strings.Compare(a.Type, b.Type); c != 0 {
		return c
	}
	if c := strings.Compare(a.Mesh, b.Mesh); c != 0 {
		return c
	}
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// ListPrefix is the longest key prefix that the filter pins down: the type,
// then the mesh when set, then the namespace when the mesh is set too.
func ListPrefix(opts storage.ListOptions) []byte {
	b := append([]byte(opts.Type), KeySep)
	if opts.Mesh == "" {
		return b
	}
	b = append(append(b, opts.Mesh...), KeySep)
	if opts.Namespace == nil {
		return b
	}
	return append(append(b, *opts.Namespace...), KeySep)
}

func ValidateList(opts storage.ListOptions) error {
	switch {
	case opts.Type == "":
		return fmt.Errorf("%w: list needs a type", storage.ErrInvalid)
	case opts.Offset < 0 || opts.Limit < 0:
		return fmt.Errorf("%w: negative offset %d or limit %d", storage.ErrInvalid, opts.Offset, opts.Limit)
	}
	ns := ""
	if opts.Namespace != nil {
		ns = *opts.Namespace
	}
	if strings.IndexByte(opts.Type+opts.Mesh+ns, KeySep) >= 0 {
		return fmt.Errorf("%w: NUL byte in list filter", storage.ErrInvalid)
	}
	return nil
}

// NamespaceIs reports whether the encoded key's namespace component is ns.
func NamespaceIs(k []byte, ns string) bool {
	parts := bytes.SplitN(k, []byte{KeySep}, 4)
	return len(parts) == 4 && string(parts[2]) == ns
}
