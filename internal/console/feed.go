package console

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// Feed tells the console's live pages that something changed: every
// committed store revision, and on the global every zone connecting or
// leaving. Waiters take Next() and wait for it to close; Config.Changed is
// a Feed's Next.
type Feed struct {
	mu sync.Mutex
	ch chan struct{}
}

// NewFeed returns a feed nobody has notified yet.
func NewFeed() *Feed { return &Feed{ch: make(chan struct{})} }

// Next is closed at the next change.
func (f *Feed) Next() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ch
}

// Notify wakes every waiter.
func (f *Feed) Notify() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.ch)
	f.ch = make(chan struct{})
}

// Watcher is the store watch a Feed follows.
type Watcher interface {
	Revision(ctx context.Context) (uint64, error)
	Watch(ctx context.Context, from uint64) (<-chan storage.Event, error)
}

// WatchStore notifies once per completed revision until ctx ends; a watch
// that ends under it (an etcd store losing quorum) is started again.
func (f *Feed) WatchStore(ctx context.Context, store Watcher, log hclog.Logger) error {
	for ctx.Err() == nil {
		rev, err := store.Revision(ctx)
		var events <-chan storage.Event
		if err == nil {
			events, err = store.Watch(ctx, rev)
		}
		if err == nil {
			for ev := range events {
				if ev.Last {
					f.Notify()
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
