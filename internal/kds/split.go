package kds

import (
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// splitBatch cuts a batch into parts that each fit the store's write
// limits (etcd's per-transaction operations and bytes), puts before deletes
// and the meta (the resume point) with the last part only: a crash between
// parts leaves the resume point behind, so the peer resends and the puts
// repeat harmlessly, and no resource is ever deleted before the new ones
// are in. Without limits (bbolt) the batch stays whole and atomic.
func splitBatch(b storage.Batch, l storage.Limits) []storage.Batch {
	if l.Ops <= 0 && l.Bytes <= 0 {
		return []storage.Batch{b}
	}
	maxOps, maxBytes := l.Ops, l.Bytes*4/5 // the estimate below is rough: keep a margin
	if maxOps <= 0 {
		maxOps = int(^uint(0) >> 1)
	}
	if maxBytes <= 0 {
		maxBytes = int(^uint(0) >> 1)
	}
	metaOps, metaBytes := len(b.Meta), 0
	for k, v := range b.Meta {
		metaBytes += len(k) + len(v) + 64
	}
	var parts []storage.Batch
	cur, ops, size := storage.Batch{}, 0, 0
	add := func(cost int, put *resource.Resource, del *resource.Key) {
		if ops > 0 && (ops+1 > maxOps || size+cost > maxBytes) {
			parts = append(parts, cur)
			cur, ops, size = storage.Batch{}, 0, 0
		}
		if put != nil {
			cur.Puts = append(cur.Puts, put)
		} else {
			cur.Deletes = append(cur.Deletes, *del)
		}
		ops, size = ops+1, size+cost
	}
	for _, p := range b.Puts {
		add(putCost(p), p, nil)
	}
	for i := range b.Deletes {
		add(deleteCost, nil, &b.Deletes[i])
	}
	if ops > 0 && (ops+metaOps > maxOps || size+metaBytes > maxBytes) {
		parts = append(parts, cur)
		cur = storage.Batch{}
	}
	cur.Meta = b.Meta
	parts = append(parts, cur)
	for i := range parts {
		parts[i].Owned = b.Owned
	}
	return parts
}

// putCost estimates a put's bytes in a transaction: the key twice (etcd
// key and encoded resource), labels, spec, status and framing.
func putCost(r *resource.Resource) int {
	n := 2*(len(r.Type)+len(r.Mesh)+len(r.Namespace)+len(r.Name)) + len(r.Spec) + len(r.Status) + 128
	for k, v := range r.Labels.All() {
		n += len(k) + len(v) + 4
	}
	return n
}

// deleteCost covers a delete's op and its tombstone (key and last labels).
const deleteCost = 2048
