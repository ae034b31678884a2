package kds

import (
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// zoneCopies maps each version of a global resource to its zone copy once
// for every zone session: mapping.ToZone does not depend on the zone (only
// the verdict does), so 100 zones receiving one change used to map and
// encode it 100 times. Shared by the Server's sessions; safe for concurrent
// use. It holds the latest version of each key (a newer version replaces
// it, a deletion drops it), so it is bounded by the store's size.
//
// It keeps each copy only encoded (see encodedCopy): the mapped resource, its
// wire message and the encoding beside them, with three indexes, took 143 MiB
// for 100,000 MeshTimeouts, encoded copies take 68
// (BenchmarkZoneCopiesHeap100000).
type zoneCopies struct {
	mu    sync.Mutex
	byKey map[resource.Key]*zoneCopy // by the global's key
}

type zoneCopy struct {
	version uint64
	mod     time.Time
	wire    wireCopy
}

func newZoneCopies() *zoneCopies {
	return &zoneCopies{byKey: map[resource.Key]*zoneCopy{}}
}

// toZone returns r's zone copy, mapping and encoding it only the first
// time this version is seen. The copy is shared: callers must not change it.
func (c *zoneCopies) toZone(d *resource.TypeDescriptor, r *resource.Resource) *wireCopy {
	key := r.Key()
	c.mu.Lock()
	zc := c.byKey[key]
	c.mu.Unlock()
	if zc != nil && zc.version == r.Version && zc.mod.Equal(r.ModificationTime) {
		return &zc.wire
	}
	send := mapping.ToZone(d, r)
	zc = &zoneCopy{version: r.Version, mod: r.ModificationTime,
		wire: wireCopy{key: send.Key(), up: encodedCopy(toWire(send))}}
	zc.wire.size = proto.Size(zc.wire.up) + entryOverhead
	c.mu.Lock()
	c.byKey[key] = zc
	c.mu.Unlock()
	return &zc.wire
}

// forget drops a deleted resource.
func (c *zoneCopies) forget(key resource.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byKey, key)
}

// resourceTypeField is Resource.type's field number in
// proto/meridian/sync/v1 (TestEncodedCopy holds it to the schema).
const resourceTypeField protowire.Number = 1

// encodedCopy returns a message that holds up encoded: its type, and every
// other field as a run of unknown fields, which protobuf writes out as they
// are. The zone decodes it to a message equal to up (a message's fields may
// come in any order). Every session's batch then copies the bytes instead
// of marshaling up, and nothing of up (its labels map, spec, strings) is
// kept: the encoding is about a third of their size. The type stays
// readable for the sender's per-type counts (summarize). up is not changed;
// it is returned as it is if it cannot be marshaled (the stream's codec then
// reports why).
func encodedCopy(up *syncv1.Resource) *syncv1.Resource {
	enc, err := proto.Marshal(up)
	if err != nil {
		return up
	}
	rest := enc[:0] // filtered in place: what is kept never overtakes what is read
	for b := enc; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return up
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return up
		}
		if num != resourceTypeField {
			rest = append(rest, b[:n+m]...)
		}
		b = b[n+m:]
	}
	out := &syncv1.Resource{Type: up.GetType()}
	out.ProtoReflect().SetUnknown(rest)
	return out
}

// has reports whether key's copy is held.
func (c *zoneCopies) has(key resource.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.byKey[key]
	return ok
}
