package console

import (
	"fmt"
	"net/http"
	"time"
)

// events streams one "changed" event per change (coalesced to at most one
// every 250 ms) to a page, which then reloads its main section. The stream
// is fed by the store watch and the zone tracker (Config.Changed); the page
// never polls.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Changed == nil {
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
	for {
		changed := c.cfg.Changed()
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
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprint(w, "data: changed\n\n"); err != nil {
			return
		}
		flusher.Flush()
	}
}
