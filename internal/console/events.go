package console

import (
	"fmt"
	"net/http"
	"time"

	"github.com/meridian-mesh/meridian/internal/api"
)

// events streams one "changed" event per change (coalesced to at most one
// every 250 ms) to a page, which then reloads its main section. The stream
// is fed by the store watch and the zone tracker (Config.Changes); the page
// never polls. A user confined to some meshes hears only of theirs.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Changes == nil {
		http.Error(w, "live updates are off", http.StatusNotFound)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, "retry: 2000\n\n")
	flusher.Flush()
	keepAlive := time.NewTicker(20 * time.Second)
	defer keepAlive.Stop()
	var meshes []string // nil: every change
	if p := api.PrincipalFrom(r.Context()); p != nil && p.Meshes != nil {
		meshes = p.Meshes
	}
	changed, seen := c.cfg.Changes.Wait()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keepAlive.C:
			_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
			continue
		case <-changed:
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(250 * time.Millisecond): // coalesce a burst of writes
		}
		var now uint64
		changed, now = c.cfg.Changes.Wait()
		touched := c.cfg.Changes.Touched(seen, meshes)
		seen = now
		if !touched {
			continue
		}
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprint(w, "data: changed\n\n"); err != nil {
			return
		}
		flusher.Flush()
	}
}
