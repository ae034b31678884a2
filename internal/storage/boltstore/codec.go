package boltstore

import (
	"encoding/binary"
	"fmt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

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

// record is a resources-bucket value: the log entry of the resource's
// latest write, then the resource.
type record struct {
	log logKey
	res *resource.Resource
}

func encodeRecord(sealer *kv.Sealer, lk logKey, r *resource.Resource) ([]byte, error) {
	r, err := sealer.Seal(r)
	if err != nil {
		return nil, err
	}
	return kv.AppendResource(append(make([]byte, 0, len(lk)+kv.ResourceSize(r)), lk[:]...), r), nil
}

func decodeRecord(sealer *kv.Sealer, b []byte) (record, error) {
	body, err := recordBody(b)
	if err != nil {
		return record{}, err
	}
	lk, _ := parseLogKey(b[:len(logKey{})])
	r, err := kv.DecodeResource(body)
	if err != nil {
		return record{}, err
	}
	if err := sealer.Open(r); err != nil {
		return record{}, err
	}
	return record{log: lk, res: r}, nil
}

// recordHasLabels matches a record's labels without decoding it (see
// kv.RecordHasLabels).
func recordHasLabels(b []byte, want map[string]string) (bool, error) {
	body, err := recordBody(b)
	if err != nil {
		return false, err
	}
	return kv.RecordHasLabels(body, want)
}

// recordBody is a record's encoded resource, after its log key.
func recordBody(b []byte) ([]byte, error) {
	if len(b) < len(logKey{}) {
		return nil, fmt.Errorf("%w: record of %d bytes", kv.ErrCorrupt, len(b))
	}
	return b[len(logKey{}):], nil
}
