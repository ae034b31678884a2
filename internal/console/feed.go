package console

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// Feed tells the console's live pages that something changed: every
// committed store revision (with the meshes it touched), and on the global
// every zone connecting or leaving (no mesh). A page waits on Wait's
// channel, then asks Touched whether a change since concerns what its user
// may see: a user confined to some meshes is not told of changes in others.
type Feed struct {
	mu  sync.Mutex
	ch  chan struct{}
	gen uint64
	// recent are the latest changes, oldest first, at most feedMemory.
	recent []feedChange
}

type feedChange struct {
	gen uint64
	// meshes the change touched; nil for a change outside every mesh
	// (a zone, a mesh-independent resource).
	meshes []string
}

// feedMemory bounds what Touched can answer exactly; a waiter that fell
// further behind is told something changed.
const feedMemory = 256

// NewFeed returns a feed nobody has notified yet.
func NewFeed() *Feed { return &Feed{ch: make(chan struct{})} }

// Wait returns a channel closed at the next change and the generation it
// will end.
func (f *Feed) Wait() (<-chan struct{}, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ch, f.gen
}

// Notify records a change outside every mesh and wakes every waiter.
func (f *Feed) Notify() { f.notify(nil) }

func (f *Feed) notify(meshes []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.recent = append(f.recent, feedChange{gen: f.gen, meshes: meshes})
	if len(f.recent) > feedMemory {
		f.recent = slices.Delete(f.recent, 0, len(f.recent)-feedMemory)
	}
	close(f.ch)
	f.ch = make(chan struct{})
}

// Touched reports whether a change after generation since touched a mesh
// in (nil: every change counts; a change outside every mesh counts only
// then).
func (f *Feed) Touched(since uint64, in []string) bool {
	if in == nil {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.recent) == 0 || f.recent[0].gen > since+1 {
		return true // forgotten: say yes rather than miss one
	}
	for _, c := range f.recent {
		if c.gen <= since {
			continue
		}
		for _, m := range c.meshes {
			if slices.Contains(in, m) {
				return true
			}
		}
	}
	return false
}

// Watcher is the store watch a Feed follows.
type Watcher interface {
	Revision(ctx context.Context) (uint64, error)
	Watch(ctx context.Context, from uint64) (<-chan storage.Event, error)
}

// WatchStore notifies once per completed revision, with the meshes it
// touched, until ctx ends; a watch that ends under it (an etcd store losing
// quorum) is started again.
func (f *Feed) WatchStore(ctx context.Context, store Watcher, log hclog.Logger) error {
	for ctx.Err() == nil {
		rev, err := store.Revision(ctx)
		var events <-chan storage.Event
		if err == nil {
			events, err = store.Watch(ctx, rev)
		}
		if err == nil {
			var meshes []string
			for ev := range events {
				if r := ev.Resource; r != nil {
					m := r.Mesh
					if r.Type == "Mesh" {
						m = r.Name
					}
					if m != "" && !slices.Contains(meshes, m) {
						meshes = append(meshes, m)
					}
				}
				if ev.Last {
					f.notify(meshes)
					meshes = nil
				}
			}
		} else if ctx.Err() == nil {
			log.Debug("console change feed: store watch failed, retrying", "error", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// WatchSignal notifies each time changed() closes (the KDS server's zone
// tracker).
func (f *Feed) WatchSignal(ctx context.Context, changed func() <-chan struct{}) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed():
			f.Notify()
		}
	}
}
