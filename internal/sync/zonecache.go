package sync

import (
	gosync "sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/sync/mapping"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// zoneCopies maps each version of a global resource to its zone copy and
// wire form once for every zone session: mapping.ToZone does not depend on
// the zone (only the verdict does), so 100 zones receiving one change used
// to map and encode it 100 times. Shared by the Server's sessions; safe for
// concurrent use. It holds the latest version of each key (a newer version
// replaces it, a deletion drops it), so it is bounded by the store's size.
type zoneCopies struct {
	mu     gosync.Mutex
	byKey  map[resource.Key]*zoneCopy // by the global's key
	byWire map[resource.Key]*zoneCopy // by the zone copy's key
	// byUp finds a wire form's encoding (encoded) for the sessions' codec.
	byUp map[*syncv1.Resource]*zoneCopy
}

type zoneCopy struct {
	key     resource.Key // the global's
	version uint64
	mod     time.Time
	send    *resource.Resource
	up      *syncv1.Resource
	enc     []byte // up, marshaled once for every session (encodedBatchCodec)
	size    int
}

func newZoneCopies() *zoneCopies {
	return &zoneCopies{byKey: map[resource.Key]*zoneCopy{}, byWire: map[resource.Key]*zoneCopy{},
		byUp: map[*syncv1.Resource]*zoneCopy{}}
}

// toZone returns r's zone copy, mapping and encoding it only the first
// time this version is seen. The copy is shared: callers must not change it.
func (c *zoneCopies) toZone(d *resource.TypeDescriptor, r *resource.Resource) *resource.Resource {
	key := r.Key()
	c.mu.Lock()
	zc := c.byKey[key]
	c.mu.Unlock()
	if zc != nil && zc.version == r.Version && zc.mod.Equal(r.ModificationTime) {
		return zc.send
	}
	send := mapping.ToZone(d, r)
	up := toWire(send)
	zc = &zoneCopy{key: key, version: r.Version, mod: r.ModificationTime, send: send, up: up}
	if enc, err := proto.Marshal(up); err == nil {
		zc.enc, zc.size = enc, len(enc)+entryOverhead
	} else {
		zc.size = proto.Size(up) + entryOverhead // sent by the default codec
	}
	c.mu.Lock()
	if old := c.byKey[key]; old != nil {
		delete(c.byWire, old.send.Key())
		delete(c.byUp, old.up)
	}
	c.byKey[key] = zc
	c.byWire[send.Key()] = zc
	c.byUp[up] = zc
	c.mu.Unlock()
	return send
}

// encoded returns the encoding of ups[i] in out[i] when it is a wire form
// toZone made and still holds (nil otherwise: a newer version replaced it,
// or it never came from here). One lock for a whole batch.
func (c *zoneCopies) encoded(ups []*syncv1.Resource, out [][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, up := range ups {
		if zc := c.byUp[up]; zc != nil {
			out[i] = zc.enc
		}
	}
}

// wire returns the encoded form of a copy toZone returned (nil for any
// other resource).
func (c *zoneCopies) wire(send *resource.Resource) (*syncv1.Resource, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if zc := c.byWire[send.Key()]; zc != nil && zc.send == send {
		return zc.up, zc.size
	}
	return nil, 0
}

// forget drops a deleted resource.
func (c *zoneCopies) forget(key resource.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if zc := c.byKey[key]; zc != nil {
		delete(c.byWire, zc.send.Key())
		delete(c.byUp, zc.up)
		delete(c.byKey, key)
	}
}

// wireCacher is a source whose copies may come encoded already.
type wireCacher interface {
	wire(send *resource.Resource) (*syncv1.Resource, int)
}
