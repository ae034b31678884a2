package zonesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// memStore is a simulated zone's state: sync's narrow Store in memory. It
// holds what the global sent (the zone writes nothing of its own), so its
// watch never delivers anything: the zone's sender would skip copies of the
// global's resources anyway. Safe for concurrent use.
type memStore struct {
	id string

	mu     sync.Mutex
	rev    uint64
	res    map[resource.Key]*resource.Resource
	counts map[string]int // resources per type, kept by Apply
	meta   map[string][]byte
	// onApply is told about every applied put (outside the lock).
	onApply func(r *resource.Resource, at time.Time)
	// onHeld, when set, is told (outside the lock) after an apply that
	// created or deleted a resource.
	onHeld func()
}

func newMemStore(onApply func(*resource.Resource, time.Time)) *memStore {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return &memStore{id: hex.EncodeToString(b), res: map[resource.Key]*resource.Resource{}, counts: map[string]int{},
		meta: map[string][]byte{}, onApply: onApply}
}

func (m *memStore) ID() string { return m.id }

func (m *memStore) Get(_ context.Context, key resource.Key) (*resource.Resource, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.getLocked(key)
}

func (m *memStore) getLocked(key resource.Key) (*resource.Resource, error) {
	r, ok := m.res[key]
	if !ok {
		return nil, fmt.Errorf("%s: %w", key, storage.ErrNotFound)
	}
	return r, nil
}

func (m *memStore) List(_ context.Context, opts storage.ListOptions) (*storage.ListResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.listLocked(opts), nil
}

func (m *memStore) listLocked(opts storage.ListOptions) *storage.ListResult {
	out := &storage.ListResult{}
	for k, r := range m.res {
		if k.Type != opts.Type || (opts.Mesh != "" && k.Mesh != opts.Mesh) {
			continue
		}
		match := true
		for lk, lv := range opts.Labels {
			if r.Labels.Get(lk) != lv {
				match = false
				break
			}
		}
		if match {
			out.Items = append(out.Items, r)
		}
	}
	sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].Key().String() < out.Items[j].Key().String() })
	out.Total = len(out.Items)
	return out
}

// Apply stores a batch atomically (under the lock), as sync's receiver
// needs: puts, deletes and the resume point together.
func (m *memStore) Apply(_ context.Context, b storage.Batch) (*storage.BatchResult, error) {
	m.mu.Lock()
	if b.Check != nil {
		if _, err := b.Check(txReader{m}); err != nil {
			m.mu.Unlock()
			return nil, err
		}
	}
	m.rev++
	result := &storage.BatchResult{Revision: m.rev}
	for _, r := range b.Puts {
		c := *r
		if old := m.res[r.Key()]; old != nil {
			c.Version = old.Version + 1
			result.Outcomes = append(result.Outcomes, storage.Updated)
		} else {
			c.Version = 1
			result.Outcomes = append(result.Outcomes, storage.Created)
			m.counts[r.Type]++
		}
		m.res[r.Key()] = &c
		result.Stored = append(result.Stored, &c)
	}
	for _, k := range b.Deletes {
		if _, ok := m.res[k]; ok {
			delete(m.res, k)
			m.counts[k.Type]--
			result.Deleted++
		}
	}
	for k, v := range b.Meta {
		m.meta[k] = v
	}
	held := result.Deleted > 0 || slices.Contains(result.Outcomes, storage.Created)
	m.mu.Unlock()
	if held && m.onHeld != nil {
		m.onHeld()
	}
	if m.onApply != nil {
		now := time.Now()
		for _, r := range result.Stored {
			m.onApply(r, now)
		}
	}
	return result, nil
}

func (m *memStore) Meta(_ context.Context, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.meta[key]
	if !ok {
		return nil, fmt.Errorf("meta %s: %w", key, storage.ErrNotFound)
	}
	return v, nil
}

func (m *memStore) Revision(context.Context) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rev, nil
}

// Watch delivers nothing (see memStore) until ctx ends.
func (m *memStore) Watch(ctx context.Context, _ uint64) (<-chan storage.Event, error) {
	ch := make(chan storage.Event)
	go func() {
		<-ctx.Done()
		close(ch)
	}()
	return ch, nil
}

// each calls fn with every resource held, under the store's lock.
func (m *memStore) each(fn func(*resource.Resource)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.res {
		fn(r)
	}
}

// count is how many resources of typ the zone holds (the measuring loops
// poll it for 100 zones at a time: it must not scan).
func (m *memStore) count(typ string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counts[typ]
}

// txReader reads the locked store inside Apply.
type txReader struct{ m *memStore }

func (t txReader) Get(key resource.Key) (*resource.Resource, error) { return t.m.getLocked(key) }

func (t txReader) List(opts storage.ListOptions) (*storage.ListResult, error) {
	return t.m.listLocked(opts), nil
}
