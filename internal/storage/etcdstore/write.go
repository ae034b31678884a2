package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// writeTx is one write group's view: what it read from etcd (at any
// revision: the commit compares head, so a write in between makes the whole
// group retry) overlaid with the group's own changes. Only the committer
// goroutine uses it.
type writeTx struct {
	s   *Store
	ctx context.Context

	loaded  map[string]*resource.Resource // encoded key -> stored (nil = absent)
	changes map[string]*change
	meta    map[string][]byte

	startRev, rev uint64
	ops, bytes    int
	// headModRev is head's etcd mod revision when the group started (0:
	// no resource was ever written); the commit compares it.
	headModRev int64
}

// change is the group's last write to one key; rev is the store revision of
// the request that made it, order its position for the transaction.
type change struct {
	res   *resource.Resource // nil: deleted
	value []byte             // res as etcd stores it (encodeValue)
	prev  *resource.Resource // what etcd holds (nil: absent)
	tomb  *resource.Resource // for a delete: key, last labels, version
	rev   uint64
	order int
}

// checkpoint is a writeTx's state before one request, to undo that request
// alone when it fails or does not fit.
type checkpoint struct {
	changes    map[string]*change
	meta       map[string][]byte
	rev        uint64
	ops, bytes int
}

func (w *writeTx) save() checkpoint {
	return checkpoint{changes: maps.Clone(w.changes), meta: maps.Clone(w.meta), rev: w.rev, ops: w.ops, bytes: w.bytes}
}

func (w *writeTx) restore(c checkpoint) {
	w.changes, w.meta, w.rev, w.ops, w.bytes = c.changes, c.meta, c.rev, c.ops, c.bytes
}

// current returns the resource at enc as the group sees it.
func (w *writeTx) current(enc []byte) (*resource.Resource, error) {
	if c, ok := w.changes[string(enc)]; ok {
		return c.res, nil
	}
	return w.stored(enc)
}

// stored returns what etcd holds at enc, read once per group.
func (w *writeTx) stored(enc []byte) (*resource.Resource, error) {
	if r, ok := w.loaded[string(enc)]; ok {
		return r, nil
	}
	r, _, err := w.s.load(w.ctx, enc)
	if err != nil {
		return nil, err
	}
	w.loaded[string(enc)] = r
	return r, nil
}

// set records a write; a key written twice in one group would hide a delete
// from watchers, so the committer closes the group before such a request
// (errTouchedTwice).
func (w *writeTx) set(enc []byte, r, tomb *resource.Resource, rev uint64) error {
	if c, ok := w.changes[string(enc)]; ok && c.rev != rev {
		return errTouchedTwice
	}
	prev, err := w.stored(enc)
	if err != nil {
		return err
	}
	if _, ok := w.changes[string(enc)]; !ok {
		w.ops++
	}
	c := &change{res: r, prev: prev, tomb: tomb, rev: rev, order: len(w.changes)}
	if r != nil {
		if c.value, err = encodeValue(w.s.cfg.Sealer, rev, r); err != nil {
			return err
		}
	}
	w.changes[string(enc)] = c
	w.bytes += len(w.s.l.resource(enc)) + 8
	if r != nil {
		w.bytes += len(c.value)
	} else {
		w.bytes += len(kv.AppendResource(nil, tomb)) + 16 // its entry in head
	}
	return nil
}

// errTouchedTwice: the request writes a key that an earlier request of the
// group wrote; it goes into the next group.
var errTouchedTwice = errors.New("key already written in this group")

// writeOne applies a single-resource write as its own revision.
func (w *writeTx) writeOne(in *resource.Resource, mode kv.PutMode) (*resource.Resource, storage.Outcome, error) {
	rev := w.rev + 1
	out, outcome, err := w.writeResource(in, mode, rev)
	if err != nil {
		return nil, 0, err
	}
	if outcome != storage.Unchanged {
		w.rev = rev
	}
	return out, outcome, nil
}

func (w *writeTx) writeResource(in *resource.Resource, mode kv.PutMode, rev uint64) (*resource.Resource, storage.Outcome, error) {
	key := in.Key()
	enc := kv.EncodeKey(key)
	old, err := w.current(enc)
	if err != nil {
		return nil, 0, err
	}
	if err := kv.CheckWrite(key, old, in.Version, mode); err != nil {
		return nil, 0, err
	}
	if old != nil && mode == kv.ModePut && kv.SameContent(old, in) {
		return old, storage.Unchanged, nil
	}
	// Always a copy (Batch.Owned allows, not requires, keeping the caller's):
	// etcd encodes each resource into its transaction anyway.
	next, outcome := kv.NextVersion(in, old, kv.NormalizeTime(w.s.cfg.Clock.Now()), false)
	if err := w.set(enc, next, nil, rev); err != nil {
		return nil, 0, err
	}
	return next, outcome, nil
}

func (w *writeTx) deleteResource(key resource.Key, version uint64, rev uint64) error {
	enc := kv.EncodeKey(key)
	old, err := w.current(enc)
	switch {
	case err != nil:
		return err
	case old == nil:
		return fmt.Errorf("delete %s: %w", key, storage.ErrNotFound)
	case version != 0 && old.Version != version:
		return fmt.Errorf("delete %s: version %d given, stored %d: %w", key, version, old.Version, storage.ErrConflict)
	}
	tomb := &resource.Resource{Type: key.Type, Mesh: key.Mesh, Namespace: key.Namespace, Name: key.Name,
		Labels: old.Labels, CreationTime: old.CreationTime, Version: old.Version}
	return w.set(enc, nil, tomb, rev)
}

// deleteOne deletes as its own revision.
func (w *writeTx) deleteOne(key resource.Key, version uint64) error {
	rev := w.rev + 1
	if err := w.deleteResource(key, version, rev); err != nil {
		return err
	}
	w.rev = rev
	return nil
}

// apply writes a storage.Batch at one revision (see storage.Batch for the
// order of its parts).
func (w *writeTx) apply(b storage.Batch) (*storage.BatchResult, error) {
	deletes, err := kv.BatchDeletes(b, w)
	if err != nil {
		return nil, err
	}
	rev := w.rev + 1
	changed := false
	res := &storage.BatchResult{Outcomes: make([]storage.Outcome, len(b.Puts)), Stored: make([]*resource.Resource, len(b.Puts))}
	for i, p := range b.Puts {
		stored, outcome, err := w.writeResource(p, kv.ModePut, rev)
		if err != nil {
			return nil, fmt.Errorf("batch put %d: %w", i, err)
		}
		res.Outcomes[i], res.Stored[i] = outcome, stored
		changed = changed || outcome != storage.Unchanged
	}
	for _, key := range deletes {
		err := w.deleteResource(key, 0, rev)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("batch delete: %w", err)
		}
		changed = true
		res.Deleted++
	}
	for k, v := range b.Meta {
		if _, ok := w.meta[k]; !ok {
			w.ops++
		}
		w.meta[k] = v
		w.bytes += len(w.s.l.meta(k)) + len(v)
	}
	if changed {
		w.rev = rev
	}
	res.Revision = w.rev
	return res, nil
}

// Get implements storage.TxReader.
func (w *writeTx) Get(key resource.Key) (*resource.Resource, error) {
	if err := kv.ValidateKey(key); err != nil {
		return nil, err
	}
	r, err := w.current(kv.EncodeKey(key))
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, fmt.Errorf("%s: %w", key, storage.ErrNotFound)
	}
	return r, nil
}

// List implements storage.TxReader: etcd's matches with the group's own
// changes laid over them.
func (w *writeTx) List(opts storage.ListOptions) (*storage.ListResult, error) {
	if err := kv.ValidateList(opts); err != nil {
		return nil, err
	}
	type item struct {
		enc string
		r   *resource.Resource
	}
	var items []item
	err := w.s.scan(w.ctx, storage.ListOptions{Type: opts.Type, Mesh: opts.Mesh, Namespace: opts.Namespace, Labels: opts.Labels},
		func(enc []byte, r *resource.Resource) {
			if _, ok := w.changes[string(enc)]; !ok {
				items = append(items, item{string(enc), r})
			}
		})
	if err != nil {
		return nil, err
	}
	for enc, c := range w.changes {
		if c.res != nil && matches(c.res, opts) {
			items = append(items, item{enc, c.res})
		}
	}
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.enc, b.enc) })
	out := &storage.ListResult{Items: []*resource.Resource{}, Total: len(items)}
	for i, it := range items {
		if i >= opts.Offset && (opts.Limit == 0 || len(out.Items) < opts.Limit) {
			out.Items = append(out.Items, it.r)
		}
	}
	return out, nil
}

func matches(r *resource.Resource, opts storage.ListOptions) bool {
	return r.Type == opts.Type && (opts.Mesh == "" || r.Mesh == opts.Mesh) &&
		(opts.Namespace == nil || r.Namespace == *opts.Namespace) && r.Labels.Contains(opts.Labels)
}
