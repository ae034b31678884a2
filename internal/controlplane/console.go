package controlplane

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/console"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// changeFeed tells the console's live pages that something changed: every
// committed store revision, and on the global every zone connecting or
// leaving. Waiters take next() and wait for it to close.
type changeFeed struct {
	mu sync.Mutex
	ch chan struct{}
}

func newChangeFeed() *changeFeed { return &changeFeed{ch: make(chan struct{})} }

func (f *changeFeed) next() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ch
}

func (f *changeFeed) notify() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.ch)
	f.ch = make(chan struct{})
}

// watchStore notifies once per completed revision until ctx ends; a watch
// that ends under it (an etcd store losing quorum) is started again.
func (f *changeFeed) watchStore(ctx context.Context, store storage.Store, log hclog.Logger) error {
	for ctx.Err() == nil {
		rev, err := store.Revision(ctx)
		var events <-chan storage.Event
		if err == nil {
			events, err = store.Watch(ctx, rev)
		}
		if err == nil {
			for ev := range events {
				if ev.Last {
					f.notify()
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

// watchSignal notifies each time changed() closes (the sync server's zone
// tracker).
func (f *changeFeed) watchSignal(ctx context.Context, changed func() <-chan struct{}) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed():
			f.notify()
		}
	}
}

// consoleFactory builds the web console for the API server.
func consoleFactory(cfg Config, reg *resource.Registry, feed *changeFeed) func(*api.Server) (http.Handler, error) {
	return func(s *api.Server) (http.Handler, error) {
		return console.New(console.Config{API: s, Mode: cfg.Mode, Zone: cfg.Zone, Registry: reg,
			Changed: feed.next, Logger: cfg.Logger.Named("console")})
	}
}
