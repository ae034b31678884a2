package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Keys of the resources bucket are type NUL mesh NUL namespace NUL name. NUL
// sorts below every other byte, so byte order equals the (mesh, namespace,
// name) tuple order the List contract asks for, and "type NUL" or
// "type NUL mesh NUL" is a prefix that selects exactly one type or mesh.
const keySep = 0

// validateKey rejects keys the encoding cannot represent unambiguously.
func validateKey(k resource.Key) error {
	switch {
	case k.Type == "":
		return fmt.Errorf("%w: resource type is empty (%s)", storage.ErrInvalid, k)
	case k.Name == "":
		return fmt.Errorf("%w: resource name is empty (%s)", storage.ErrInvalid, k)
	}
	n := 3
	for _, s := range []string{k.Type, k.Mesh, k.Namespace, k.Name} {
		if strings.IndexByte(s, keySep) >= 0 {
			return fmt.Errorf("%w: NUL byte in resource key %q", storage.ErrInvalid, k.String())
		}
		n += len(s)
	}
	if n > bolt.MaxKeySize {
		return fmt.Errorf("%w: resource key of %d bytes exceeds %d", storage.ErrInvalid, n, bolt.MaxKeySize)
	}
	return nil
}

func encodeKey(k resource.Key) []byte {
	b := make([]byte, 0, len(k.Type)+len(k.Mesh)+len(k.Namespace)+len(k.Name)+3)
	b = append(b, k.Type...)
	b = append(b, keySep)
	b = append(b, k.Mesh...)
	b = append(b, keySep)
	b = append(b, k.Namespace...)
	b = append(b, keySep)
	return append(b, k.Name...)
}

func decodeKey(b []byte) (resource.Key, error) {
	parts := bytes.SplitN(b, []byte{keySep}, 4)
	if len(parts) != 4 {
		return resource.Key{}, fmt.Errorf("malformed resource key %q", b)
	}
	return resource.Key{Type: string(parts[0]), Mesh: string(parts[1]), Namespace: string(parts[2]), Name: string(parts[3])}, nil
}

// listPrefix is the longest key prefix that the filter pins down: the type,
// then the mesh when set, then the namespace when the mesh is set too.
func listPrefix(opts storage.ListOptions) []byte {
	b := append([]byte(opts.Type), keySep)
	if opts.Mesh == "" {
		return b
	}
	b = append(append(b, opts.Mesh...), keySep)
	if opts.Namespace == nil {
		return b
	}
	return append(append(b, *opts.Namespace...), keySep)
}

// logKey orders the change log: big-endian revision, then the position of
// the change inside its revision (a batch writes several keys at one
// revision).
type logKey [12]byte

func makeLogKey(rev uint64, idx uint32) logKey {
	var k logKey
	binary.BigEndian.PutUint64(k[:8], rev)
	binary.BigEndian.PutUint32(k[8:], idx)
	return k
}

func parseLogKey(b []byte) (logKey, error) {
	var k logKey
	if len(b) != len(k) {
		return k, fmt.Errorf("malformed log key of %d bytes", len(b))
	}
	copy(k[:], b)
	return k, nil
}

func (k logKey) revision() uint64 { return binary.BigEndian.Uint64(k[:8]) }

func (k logKey) index() uint32 { return binary.BigEndian.Uint32(k[8:]) }

// Stored resources are a small binary record rather than JSON: List of
// thousands of resources decodes each one, and the spec and status are
// already JSON that needs no re-parsing. Format 1:
//
//	1 | str type | str mesh | str namespace | str name |
//	uvarint nLabels | (str key | str value)* sorted by key |
//	bytes spec | bytes status | time created | time modified | uvarint version
//
// str/bytes are uvarint length + data; time is varint seconds + uvarint nanos.
// recordFormat (schema.go) is the leading byte.

var errCorrupt = errors.New("corrupted record")

func encodeResource(dst []byte, r *resource.Resource) []byte {
	dst = append(dst, recordFormat)
	for _, s := range []string{r.Type, r.Mesh, r.Namespace, r.Name} {
		dst = appendString(dst, s)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Labels)))
	keys := make([]string, 0, len(r.Labels))
	for k := range r.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		dst = appendString(appendString(dst, k), r.Labels[k])
	}
	dst = appendBytes(dst, r.Spec)
	dst = appendBytes(dst, r.Status)
	dst = appendTime(dst, r.CreationTime)
	dst = appendTime(dst, r.ModificationTime)
	return binary.AppendUvarint(dst, r.Version)
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

func appendBytes(dst, b []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(b))), b...)
}

func appendTime(dst []byte, t time.Time) []byte {
	return binary.AppendUvarint(binary.AppendVarint(dst, t.Unix()), uint64(t.Nanosecond()))
}

// decodeResource copies everything it returns out of b, so b may be memory
// owned by a bbolt transaction.
func decodeResource(b []byte) (*resource.Resource, error) {
	d := decoder{buf: b}
	if f := d.byte(); d.err == nil && f != recordFormat {
		return nil, fmt.Errorf("%w: unknown record format %d", errCorrupt, f)
	}
	r := &resource.Resource{Type: d.string(), Mesh: d.string(), Namespace: d.string(), Name: d.string()}
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n > uint64(len(d.buf)) {
			return nil, fmt.Errorf("%w: %d labels in %d bytes", errCorrupt, n, len(d.buf))
		}
		r.Labels = make(map[string]string, n)
		for range n {
			k := d.string()
			r.Labels[k] = d.string()
		}
	}
	r.Spec = d.bytes()
	r.Status = d.bytes()
	r.CreationTime = d.time()
	r.ModificationTime = d.time()
	r.Version = d.uvarint()
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.buf))
	}
	if d.err != nil {
		return nil, d.err
	}
	return r, nil
}

// decoder reads a record; after the first error every read returns a zero
// value and err keeps that first error.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated %s", errCorrupt, what)
	}
	d.buf = nil
}

func (d *decoder) byte() byte {
	if len(d.buf) < 1 {
		d.fail("byte")
		return 0
	}
	c := d.buf[0]
	d.buf = d.buf[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) raw() []byte {
	n := d.uvarint()
	if n > uint64(len(d.buf)) {
		d.fail("field")
		return nil
	}
	b := d.buf[:n]
	d.buf = d.buf[n:]
	return b
}

func (d *decoder) string() string { return string(d.raw()) }

// bytes returns nil for an empty field so that a stored empty spec reads
// back like an absent one.
func (d *decoder) bytes() []byte {
	b := d.raw()
	if len(b) == 0 {
		return nil
	}
	return bytes.Clone(b)
}

func (d *decoder) time() time.Time {
	sec := d.varint()
	nsec := d.uvarint()
	if nsec >= uint64(time.Second) {
		d.fail("time")
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

// normalizeTime drops the monotonic reading and location so that a time the
// store returns from a write equals the one a later read decodes.
func normalizeTime(t time.Time) time.Time {
	return time.Unix(t.Unix(), int64(t.Nanosecond())).UTC()
}

// record is a resources-bucket value: the log entry of the resource's
// latest write, then the resource.
type record struct {
	log logKey
	res *resource.Resource
}

func encodeRecord(lk logKey, r *resource.Resource) []byte {
	return encodeResource(append(make([]byte, 0, 128+len(r.Spec)+len(r.Status)), lk[:]...), r)
}

func decodeRecord(b []byte) (record, error) {
	if len(b) < len(logKey{}) {
		return record{}, fmt.Errorf("%w: record of %d bytes", errCorrupt, len(b))
	}
	lk, _ := parseLogKey(b[:12])
	r, err := decodeResource(b[12:])
	if err != nil {
		return record{}, err
	}
	return record{log: lk, res: r}, nil
}
