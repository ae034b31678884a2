package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// MeshAccessLog's tcp backends for an Envoy sidecar (docs/dataplane.md#envoy),
// as kuma-dp serves them: Envoy's file logger writes one JSON line per
// entry, {"address": "host:port", "message": ...}, to a named pipe in the
// agent's directory; the agent sends each message to its address over
// TCP, one connection per address, redialled after a failure. The zone
// learns the pipe's path from the node metadata the bootstrap sets.

// AccessLogPipe is the pipe in the agent's directory.
const AccessLogPipe = "access-logs.pipe"

// Bounds on what Envoy writes into the pipe: a line longer than
// maxLogLine is dropped, and at most maxLogTargets addresses are kept
// open.
const (
	maxLogLine    = 64 << 10
	maxLogTargets = 16
	logDialWait   = 2 * time.Second
	logRetryAfter = time.Second
)

// errBackendDown drops an entry for a backend that could not be reached a
// moment ago.
var errBackendDown = errors.New("unreachable a moment ago; entries dropped until it is tried again")

// LogForwarder reads the access log pipe and forwards its messages.
type LogForwarder struct {
	path   string
	pipe   *os.File
	logger hclog.Logger
	dial   func(ctx context.Context, address string) (net.Conn, error)

	mu    sync.Mutex
	conns map[string]net.Conn
	// down holds, per address that could not be reached, when to try
	// again: entries for it are dropped until then, so that an unreachable
	// backend does not hold the pipe (and Envoy's writes) back.
	down map[string]time.Time
	done chan struct{}
}

// ForwardAccessLogs makes the pipe (0600) in dir and forwards what Envoy
// writes to it until ctx ends or Close.
func ForwardAccessLogs(ctx context.Context, dir string, logger hclog.Logger) (*LogForwarder, error) {
	path := filepath.Join(dir, AccessLogPipe)
	_ = os.Remove(path)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		return nil, &Error{What: "cannot make the access log pipe", Where: path, Err: err}
	}
	// Read and write: the pipe stays open (no end of file) while Envoy
	// reopens it, and opening does not wait for a writer.
	pipe, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, &Error{What: "cannot open the access log pipe", Where: path, Err: err}
	}
	d := &net.Dialer{Timeout: logDialWait}
	f := &LogForwarder{path: path, pipe: pipe, logger: logger, dial: func(ctx context.Context, address string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", address)
	}, conns: map[string]net.Conn{}, down: map[string]time.Time{}, done: make(chan struct{})}
	go f.run(ctx)
	go func() {
		<-ctx.Done()
		f.Close()
	}()
	return f, nil
}

// Path is the pipe's path.
func (f *LogForwarder) Path() string { return f.path }

// Close stops forwarding and closes the connections.
func (f *LogForwarder) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
		return
	default:
	}
	close(f.done)
	_ = f.pipe.Close()
	for a, c := range f.conns {
		_ = c.Close()
		delete(f.conns, a)
	}
}

func (f *LogForwarder) run(ctx context.Context) {
	sc := bufio.NewScanner(f.pipe)
	sc.Buffer(make([]byte, 4096), maxLogLine)
	for {
		for sc.Scan() {
			f.forward(ctx, sc.Bytes())
		}
		select {
		case <-f.done:
			return
		default:
		}
		if errors.Is(sc.Err(), bufio.ErrTooLong) {
			f.logger.Warn("access log line too long, dropped", "limit", maxLogLine)
			sc = bufio.NewScanner(f.pipe)
			sc.Buffer(make([]byte, 4096), maxLogLine)
			continue
		}
		return
	}
}

// forward sends one line's message to its address.
func (f *LogForwarder) forward(ctx context.Context, line []byte) {
	var entry struct {
		Address string          `json:"address"`
		Message json.RawMessage `json:"message"`
	}
	if err := json.Unmarshal(line, &entry); err != nil || entry.Address == "" {
		f.logger.Warn("access log line without an address, dropped")
		return
	}
	msg := []byte(nil)
	var s string
	if json.Unmarshal(entry.Message, &s) == nil {
		msg = []byte(s)
	} else {
		msg = append(append(msg, entry.Message...), '\n')
	}
	conn, err := f.conn(ctx, entry.Address)
	if errors.Is(err, errBackendDown) {
		return
	}
	if err != nil {
		f.logger.Warn("access log backend unreachable, entries dropped for a second", "address", entry.Address, "error", err)
		return
	}
	if _, err := conn.Write(msg); err != nil {
		f.logger.Warn("access log backend write failed, entry dropped", "address", entry.Address, "error", err)
		f.forget(entry.Address, conn)
	}
}

func (f *LogForwarder) conn(ctx context.Context, address string) (net.Conn, error) {
	f.mu.Lock()
	c, ok := f.conns[address]
	until, isDown := f.down[address]
	f.mu.Unlock()
	if ok {
		return c, nil
	}
	if isDown && time.Now().Before(until) {
		return nil, errBackendDown
	}
	c, err := f.dial(ctx, address)
	if err != nil {
		f.mu.Lock()
		if len(f.down) >= maxLogTargets {
			clear(f.down)
		}
		f.down[address] = time.Now().Add(logRetryAfter)
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.conns) >= maxLogTargets {
		for a, old := range f.conns { // any one: the set is small
			_ = old.Close()
			delete(f.conns, a)
			break
		}
	}
	f.conns[address] = c
	return c, nil
}

func (f *LogForwarder) forget(address string, c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns[address] == c {
		delete(f.conns, address)
	}
	_ = c.Close()
}
