package xds

import (
	"crypto/sha256"
	"fmt"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
)

// internTable keeps one copy of each distinct resource among the snapshots
// the server holds. Proxies of one service in one mesh mostly get equal
// listeners, routes and clusters, and each rendering builds its own: kept
// apart, a thousand proxies hold a thousand copies of each (about 65 KiB
// per proxy of the zone's heap). Resources are equal when their deterministic
// encodings are (the digest that versions are computed from anyway), and
// an entry lives while some node's snapshot holds it (reference counts,
// taken and released under the server's lock).
type internTable struct {
	entries map[internKey]*internEntry
}

type internKey struct {
	typeURL string
	digest  [sha256.Size]byte
}

type internEntry struct {
	res  types.Resource
	refs int
}

// digestAll records the digest of every resource of res that has none
// (an encoding each; shared resources come with theirs).
func digestAll(res *Resources) error {
	opts := proto.MarshalOptions{Deterministic: true}
	var buf []byte // one encoding buffer for them all
	for i, list := range res.lists() {
		for j, r := range *list {
			if _, ok := res.sum(i, j); ok {
				continue
			}
			b, err := opts.MarshalAppend(buf[:0], r)
			if err != nil {
				return fmt.Errorf("encode %s %s: %w", shortType(listTypes[i]), cachev3.GetResourceName(r), err)
			}
			buf = b
			res.setSum(i, j, sha256.Sum256(b))
		}
	}
	return nil
}

// intern replaces the resources of list (in listTypes' order) by the
// table's copies of equal ones (adding the others) and returns the keys
// they now hold. sums are their digests (digestAll).
func (t *internTable) intern(list int, items []types.Resource, sums [][sha256.Size]byte) []internKey {
	keys := make([]internKey, len(items))
	for j, r := range items {
		k := internKey{listTypes[list], sums[j]}
		e := t.entries[k]
		if e == nil {
			e = &internEntry{res: r}
			t.entries[k] = e
		}
		e.refs++
		if items[j] != e.res { // a list shared with the last rendering holds interned ones: never written
			items[j] = e.res
		}
		keys[j] = k
	}
	return keys
}

// release drops the references keys held.
func (t *internTable) release(keys []internKey) {
	for _, k := range keys {
		if e := t.entries[k]; e != nil {
			if e.refs--; e.refs <= 0 {
				delete(t.entries, k)
			}
		}
	}
}
