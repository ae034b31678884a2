package storagetest

import (
	"bytes"
	"cmp"
	"maps"
	"slices"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// model is the Store contract written as the simplest possible in-memory
// code, for the simulation to compare a backend against. It is not safe for
// concurrent use.
type model struct {
	clock *FakeClock
	rev   uint64
	items state
	meta  map[string][]byte
	hist  history
}

func newModel(clock *FakeClock) *model {
	return &model{clock: clock, items: state{}, meta: map[string][]byte{}}
}

type writeMode int

const (
	writeCreate writeMode = iota
	writeUpdate
	writePut
)

// modelTx is one write: it works on a copy and commit publishes it, so a
// failed write changes nothing.
type modelTx struct {
	m      *model
	items  state
	rev    uint64
	events []storage.Event
}

func (m *model) begin() *modelTx {
	return &modelTx{m: m, items: maps.Clone(m.items), rev: m.rev + 1}
}

func (tx *modelTx) commit() {
	tx.m.items = tx.items
	if len(tx.events) > 0 {
		tx.m.rev = tx.rev
		tx.m.hist = append(tx.m.hist, tx.events...)
	}
}

func (tx *modelTx) write(in *resource.Resource, mode writeMode) (*resource.Resource, storage.Outcome, error) {
	old := tx.items[in.Key()]
	switch {
	case mode == writeCreate && old != nil:
		return nil, 0, storage.ErrAlreadyExists
	case mode == writeUpdate && old == nil:
		return nil, 0, storage.ErrNotFound
	case mode != writeCreate && in.Version != 0 && (old == nil || old.Version != in.Version):
		return nil, 0, storage.ErrConflict
	}
	if mode == writePut && old != nil && old.Labels.Equal(in.Labels) &&
		bytes.Equal(old.Spec, in.Spec) && bytes.Equal(old.Status, in.Status) {
		return old, storage.Unchanged, nil
	}
	now := tx.m.clock.Now()
	next := in.Clone()
	next.Version, next.CreationTime, next.ModificationTime = 1, now, now
	outcome := storage.Created
	if old != nil {
		next.Version, next.CreationTime, outcome = old.Version+1, old.CreationTime, storage.Updated
	}
	tx.items[in.Key()] = next
	tx.events = append(tx.events, storage.Event{Kind: storage.EventPut, Revision: tx.rev, Resource: next})
	return next, outcome, nil
}

func (tx *modelTx) del(k resource.Key, version uint64) error {
	old := tx.items[k]
	switch {
	case old == nil:
		return storage.ErrNotFound
	case version != 0 && old.Version != version:
		return storage.ErrConflict
	}
	delete(tx.items, k)
	tx.events = append(tx.events, storage.Event{Kind: storage.EventDelete, Revision: tx.rev, Resource: tombstone(old)})
	return nil
}

// single runs one single-resource write.
func (m *model) single(fn func(tx *modelTx) error) error {
	tx := m.begin()
	if err := fn(tx); err != nil {
		return err
	}
	tx.commit()
	return nil
}

func (m *model) apply(b storage.Batch) (*storage.BatchResult, error) {
	tx := m.begin()
	res := &storage.BatchResult{Outcomes: make([]storage.Outcome, len(b.Puts))}
	for i, p := range b.Puts {
		_, o, err := tx.write(p, writePut)
		if err != nil {
			return nil, err
		}
		res.Outcomes[i] = o
	}
	for _, k := range b.Deletes {
		if err := tx.del(k, 0); err == nil {
			res.Deleted++
		}
	}
	tx.commit()
	for k, v := range b.Meta {
		tx.m.meta[k] = bytes.Clone(v)
	}
	res.Revision = m.rev
	return res, nil
}

func (m *model) list(opts storage.ListOptions) *storage.ListResult {
	var match []*resource.Resource
	for k, r := range m.items {
		switch {
		case k.Type != opts.Type,
			opts.Mesh != "" && k.Mesh != opts.Mesh,
			opts.Namespace != nil && k.Namespace != *opts.Namespace,
			!r.Labels.Contains(opts.Labels):
			continue
		}
		match = append(match, r)
	}
	slices.SortFunc(match, func(a, b *resource.Resource) int {
		return cmp.Or(cmp.Compare(a.Mesh, b.Mesh), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	out := &storage.ListResult{Total: len(match)}
	lo := min(opts.Offset, len(match))
	hi := len(match)
	if opts.Limit > 0 {
		hi = min(lo+opts.Limit, hi)
	}
	out.Items = match[lo:hi]
	return out
}
