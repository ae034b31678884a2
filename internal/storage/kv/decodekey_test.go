package kv

import (
	"bytes"
	"fmt"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// DecodeKey is EncodeKey's inverse, for the tests.
func DecodeKey(b []byte) (resource.Key, error) {
	parts := bytes.SplitN(b, []byte{KeySep}, 4)
	if len(parts) != 4 {
		return resource.Key{}, fmt.Errorf("malformed resource key %q", b)
	}
	return resource.Key{Type: string(parts[0]), Mesh: string(parts[1]), Namespace: string(parts[2]), Name: string(parts[3])}, nil
}
