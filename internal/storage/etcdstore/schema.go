package etcdstore

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// The layout in etcd lives in this one file, like boltstore's schema.go.
// Every key starts with Config.Prefix (P):
//
//	P "r."           head: the store revision, the commit time and the
//	                 group's deletions (encodeHead)
//	P "r/" kv.Key    a resource: its store revision (8 bytes BE) ++ kv.AppendResource
//	P "m/" key       Batch.Meta values (sync resume points, revoked tokens)
//	P "s/schema"     schema version (decimal)
//	P "s/id"         the store's random id
//	P "s/compacted"  compacted store revision ++ the etcd revision of its head (8+8 bytes BE)
//	P "election/"    leader election (internal/controlplane)
//	P "secrets/"     key material shared by the replicas (internal/controlplane)
//
// Why a head key instead of etcd's own revision: the Store contract numbers
// resource writes densely (each write exactly one more) and a meta-only batch
// does not move it, while etcd's revision also moves for meta writes, leases,
// elections and any other tenant of the cluster. Every resource write updates
// head in the same etcd transaction and compares its mod revision, so head is
// also the optimistic lock that makes a write group serializable. A watch maps
// etcd revisions back to store revisions through the values it carries.
//
// head and the resources share the range [P "r.", P "r0"), which one etcd
// watch covers: '.' < '/' < '0'.
const schemaVersion = 1

type layout struct{ prefix string }

func (l layout) head() string               { return l.prefix + "r." }
func (l layout) resources() string          { return l.prefix + "r/" }
func (l layout) watchEnd() string           { return l.prefix + "r0" }
func (l layout) resource(enc []byte) string { return l.prefix + "r/" + string(enc) }
func (l layout) meta(k string) string       { return l.prefix + "m/" + k }
func (l layout) schema() string             { return l.prefix + "s/schema" }
func (l layout) storeID() string            { return l.prefix + "s/id" }
func (l layout) compacted() string          { return l.prefix + "s/compacted" }

// Election is the key prefix of the replicas' leader election.
func (l layout) Election() string { return l.prefix + "election/" }

// resourceKey returns the encoded resource key of an etcd key, or false for
// the head key.
func (l layout) resourceKey(etcdKey []byte) ([]byte, bool) {
	p := l.resources()
	if !strings.HasPrefix(string(etcdKey), p) {
		return nil, false
	}
	return etcdKey[len(p):], true
}

// encodeValue stores a resource with the store revision of its write.
func encodeValue(sealer *kv.Sealer, rev uint64, r *resource.Resource) ([]byte, error) {
	r, err := sealer.Seal(r)
	if err != nil {
		return nil, err
	}
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 128+len(r.Spec)+len(r.Status)), rev)
	return kv.AppendResource(b, r), nil
}

func decodeValue(sealer *kv.Sealer, b []byte) (uint64, *resource.Resource, error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("%w: value of %d bytes", kv.ErrCorrupt, len(b))
	}
	r, err := kv.DecodeResource(b[8:])
	if err != nil {
		return 0, nil, err
	}
	if err := sealer.Open(r); err != nil {
		return 0, nil, err
	}
	return binary.BigEndian.Uint64(b[:8]), r, nil
}

// head is the value of the head key: the revision of the last resource write,
// its commit time (unix nanoseconds, from the store's clock; the tombstone
// window is measured against it) and every deletion of that etcd
// transaction with its store revision and tombstone (a delete event carries
// no value, and a resource put and deleted by one batch has no etcd op at
// all, yet watchers must see the delete).
type head struct {
	rev     uint64
	time    int64
	deletes []headDelete // in revision order
}

type headDelete struct {
	rev  uint64
	tomb *resource.Resource
}

func encodeHead(h head) []byte {
	b := binary.BigEndian.AppendUint64(nil, h.rev)
	b = binary.BigEndian.AppendUint64(b, uint64(h.time))
	for _, d := range h.deletes {
		b = binary.BigEndian.AppendUint64(b, d.rev)
		enc := kv.AppendResource(nil, d.tomb)
		b = binary.AppendUvarint(b, uint64(len(enc)))
		b = append(b, enc...)
	}
	return b
}

func decodeHead(b []byte) (head, error) {
	if len(b) < 16 {
		return head{}, fmt.Errorf("%w: head of %d bytes", kv.ErrCorrupt, len(b))
	}
	h := head{rev: binary.BigEndian.Uint64(b), time: int64(binary.BigEndian.Uint64(b[8:]))}
	for b = b[16:]; len(b) > 0; {
		if len(b) < 9 {
			return head{}, fmt.Errorf("%w: truncated head", kv.ErrCorrupt)
		}
		rev := binary.BigEndian.Uint64(b)
		n, w := binary.Uvarint(b[8:])
		if w <= 0 || uint64(len(b)-8-w) < n {
			return head{}, fmt.Errorf("%w: truncated head", kv.ErrCorrupt)
		}
		tomb, err := kv.DecodeResource(b[8+w : 8+w+int(n)])
		if err != nil {
			return head{}, err
		}
		h.deletes = append(h.deletes, headDelete{rev: rev, tomb: tomb})
		b = b[8+w+int(n):]
	}
	return h, nil
}

func encodeCompacted(rev uint64, etcdRev int64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, rev), uint64(etcdRev))
}

func decodeCompacted(b []byte) (uint64, int64, error) {
	if len(b) != 16 {
		return 0, 0, fmt.Errorf("%w: compacted mark of %d bytes", kv.ErrCorrupt, len(b))
	}
	return binary.BigEndian.Uint64(b), int64(binary.BigEndian.Uint64(b[8:])), nil
}
