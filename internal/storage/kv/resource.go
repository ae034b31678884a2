package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// ResourceFormat is the leading byte of an encoded resource.
const ResourceFormat byte = 1

// Stored resources are a small binary record rather than JSON: List of
// thousands of resources decodes each one, and the spec and status are
// already JSON that needs no re-parsing. Format 1:
//
//	1 | str type | str mesh | str namespace | str name |
//	uvarint nLabels | (str key | str value)* sorted by key |
//	bytes spec | bytes status | time created | time modified | uvarint version
//
// str/bytes are uvarint length + data; time is varint seconds + uvarint nanos.
// ResourceFormat is the leading byte.

var ErrCorrupt = errors.New("corrupted record")

func AppendResource(dst []byte, r *resource.Resource) []byte {
	dst = append(dst, ResourceFormat)
	for _, s := range []string{r.Type, r.Mesh, r.Namespace, r.Name} {
		dst = appendString(dst, s)
	}
	dst = binary.AppendUvarint(dst, uint64(r.Labels.Len()))
	for k, v := range r.Labels.All() { // in key order
		dst = appendString(appendString(dst, k), v)
	}
	dst = appendBytes(dst, r.Spec)
	dst = appendBytes(dst, r.Status)
	dst = appendTime(dst, r.CreationTime)
	dst = appendTime(dst, r.ModificationTime)
	return binary.AppendUvarint(dst, r.Version)
}

// ResourceSize is the length of AppendResource's encoding of r, so a
// caller can size the buffer once.
func ResourceSize(r *resource.Resource) int {
	n := 1 + strSize(r.Type) + strSize(r.Mesh) + strSize(r.Namespace) + strSize(r.Name) + uvarintSize(uint64(r.Labels.Len()))
	for k, v := range r.Labels.All() {
		n += strSize(k) + strSize(v)
	}
	n += uvarintSize(uint64(len(r.Spec))) + len(r.Spec) + uvarintSize(uint64(len(r.Status))) + len(r.Status)
	for _, t := range []time.Time{r.CreationTime, r.ModificationTime} {
		sec := t.Unix()
		n += uvarintSize(uint64(sec<<1)^uint64(sec>>63)) + uvarintSize(uint64(t.Nanosecond())) // varint: zigzag
	}
	return n + uvarintSize(r.Version)
}

func strSize(s string) int { return uvarintSize(uint64(len(s))) + len(s) }

func uvarintSize(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

func appendBytes(dst, b []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(b))), b...)
}

func appendTime(dst []byte, t time.Time) []byte {
	return binary.AppendUvarint(binary.AppendVarint(dst, t.Unix()), uint64(t.Nanosecond()))
}

// DecodeResource copies everything it returns out of b, so b may be memory
// owned by a bbolt transaction.
func DecodeResource(b []byte) (*resource.Resource, error) {
	d := decoder{buf: b}
	if f := d.byte(); d.err == nil && f != ResourceFormat {
		return nil, fmt.Errorf("%w: unknown record format %d", ErrCorrupt, f)
	}
	r := &resource.Resource{Type: d.string(), Mesh: d.string(), Namespace: d.string(), Name: d.string()}
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n > uint64(len(d.buf)) {
			return nil, fmt.Errorf("%w: %d labels in %d bytes", ErrCorrupt, n, len(d.buf))
		}
		kv := make([]string, 0, 2*n)
		for range n {
			kv = append(kv, d.string(), d.string())
		}
		r.Labels = resource.LabelsFromPairs(kv) // written in key order: kept as it is
	}
	r.Spec = d.bytes()
	r.Status = d.bytes()
	r.CreationTime = d.time()
	r.ModificationTime = d.time()
	r.Version = d.uvarint()
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.buf))
	}
	if d.err != nil {
		return nil, d.err
	}
	return r, nil
}

// RecordHasLabels reports whether the resource record b (DecodeResource's
// input) carries every label of want with its value, reading only the
// record's key and labels and allocating nothing. A label-filtered list
// checks each record with it and decodes only those that match. A record
// cut short before its labels end is an error; the rest of the record is
// not read (its corruption is found by the reads that decode it).
func RecordHasLabels(b []byte, want map[string]string) (bool, error) {
	d := decoder{buf: b}
	if f := d.byte(); d.err == nil && f != ResourceFormat {
		return false, fmt.Errorf("%w: unknown record format %d", ErrCorrupt, f)
	}
	for range 4 { // type, mesh, namespace, name
		d.raw()
	}
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.buf)) {
		return false, fmt.Errorf("%w: %d labels in %d bytes", ErrCorrupt, n, len(d.buf))
	}
	// Keys are strictly increasing as the encoder writes them, so none
	// repeats and one pass answers. A record whose keys are not (only a
	// damaged one) is decoded whole: there the last of repeated keys counts.
	var prev []byte
	increasing, found, match := true, 0, true
	for i := range n {
		k, v := d.raw(), d.raw()
		if i > 0 && bytes.Compare(prev, k) >= 0 {
			increasing = false
		}
		prev = k
		if w, ok := want[string(k)]; ok { // the conversion in a lookup does not allocate
			found++
			match = match && w == string(v)
		}
	}
	if d.err != nil {
		return false, d.err
	}
	if !increasing {
		r, err := DecodeResource(b)
		if err != nil {
			return false, err
		}
		return r.Labels.Contains(want), nil
	}
	return match && found == len(want), nil
}

// decoder reads a record; after the first error every read returns a zero
// value and err keeps that first error.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated %s", ErrCorrupt, what)
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

// NormalizeTime drops the monotonic reading and location so that a time the
// store returns from a write equals the one a later read decodes.
func NormalizeTime(t time.Time) time.Time {
	return time.Unix(t.Unix(), int64(t.Nanosecond())).UTC()
}
