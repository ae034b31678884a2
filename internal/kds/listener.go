package kds

import (
	"net"
	"sync"
)

// ConnLimits bound the connections a KDS listener keeps: in all, and from
// one source IP. Until a zone has authenticated, a connection is all a
// stranger holds; without a bound, idle sockets from one host exhausted
// the process's file descriptors (and with them the REST API's).
type ConnLimits struct {
	Max, PerSource int
}

// Listen wraps ln so that a connection over a limit is closed as soon as it
// is accepted.
func (l ConnLimits) Listen(ln net.Listener) net.Listener {
	return &limitedListener{Listener: ln, limits: l, bySource: map[string]int{}}
}

type limitedListener struct {
	net.Listener
	limits ConnLimits

	mu       sync.Mutex
	total    int
	bySource map[string]int
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		if !l.admit(src) {
			_ = c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(src) }}, nil
	}
}

func (l *limitedListener) admit(src string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.limits.Max > 0 && l.total >= l.limits.Max) || (l.limits.PerSource > 0 && l.bySource[src] >= l.limits.PerSource) {
		return false
	}
	l.total++
	l.bySource[src]++
	return true
}

func (l *limitedListener) release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

func sourceOf(a net.Addr) string {
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
