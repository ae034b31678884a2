package tuning

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/stats"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// TestMemoryTrimmerObserve: a trim needs a quiet period (at most quietAlloc
// allocated per tick) and enough free memory held, or a burst since the
// last trim that allocated as much; allocation restarts the quiet period,
// and after a trim (which leaves nothing free) an idle process is not
// trimmed again until it holds free memory anew.
func TestMemoryTrimmerObserve(t *testing.T) {
	const mib = 1 << 20
	m := &MemoryTrimmer{tick: time.Second, quiet: 2 * time.Second, quietAlloc: mib, minFree: 8 * mib}
	steps := []struct {
		name            string
		allocated, free uint64
		trim            bool
	}{
		{"one quiet tick", 0, 20 * mib, false},
		{"a burst restarts the quiet period", 100 * mib, 20 * mib, false},
		{"one quiet tick", 100 * mib, 20 * mib, false},
		{"two quiet ticks, 20 MiB free", 100*mib + mib, 20 * mib, true},
		{"after the trim nothing is free", 100*mib + mib, 0, false},
		{"quiet, nothing free", 100*mib + mib, 0, false},
		{"quiet, less free than minFree", 101*mib + mib, 4 * mib, false},
		{"a burst", 400 * mib, 50 * mib, false},
		{"one quiet tick", 400 * mib, 50 * mib, false},
		{"two quiet ticks", 400 * mib, 60 * mib, true},
		{"a burst of 30 MiB", 430 * mib, 30 * mib, false},
		{"one quiet tick", 430 * mib, 30 * mib, false},
		{"two quiet ticks, but 40 MiB free of a 200 MiB live heap", 430 * mib, 40 * mib, false},
		{"quiet, 50 MiB free of a 200 MiB live heap", 430 * mib, 50 * mib, true},
		{"a trickle, each tick at most quietAlloc", 431 * mib, 10 * mib, false},
		{"the trickle goes on", 432 * mib, 12 * mib, false},
		{"quiet for long, little free", 432 * mib, 12 * mib, false},
		{"a burst of 60 MiB", 492 * mib, 20 * mib, false},
		{"one quiet tick", 492 * mib, 20 * mib, false},
		{"two quiet ticks: 20 MiB counted free, a burst of 60 since the trim", 492 * mib, 20 * mib, true},
		{"after that trim, quiet", 492 * mib, 0, false},
		{"still quiet", 492 * mib, 0, false},
	}
	st := trimState{}
	for i, s := range steps {
		sample := memSample{allocated: s.allocated, free: s.free}
		if s.allocated >= 430*mib {
			sample.live = 200 * mib
		}
		got := m.observe(&st, sample)
		if got != s.trim {
			t.Fatalf("step %d (%s): trim %v, want %v", i, s.name, got, s.trim)
		}
		if got {
			st = trimState{last: memSample{allocated: s.allocated}} // as run does after trimming
		}
	}
}

// TestMemoryTrimmerRun: the loop trims once a quiet period shows enough
// free memory, releases the store's map after the trim, then stops ticking
// until woken; woken, it trims again after a burst, and with nothing to trim
// it stops ticking once quiet for idle. It stops with its context.
func TestMemoryTrimmerRun(t *testing.T) {
	const mib = 1 << 20
	ticks := make(chan time.Time)
	var mu sync.Mutex
	cur := memSample{allocated: 0, free: 64 * mib}
	set := func(allocated, free uint64) {
		mu.Lock()
		defer mu.Unlock()
		cur = memSample{allocated: allocated, free: free}
	}
	var order []string
	tickers := make(chan string, 10)
	m := &MemoryTrimmer{
		tick: time.Second, idle: 4 * time.Second, awaken: make(chan struct{}, 1),
		quiet: 2 * time.Second, quietAlloc: mib, minFree: 8 * mib,
		read: func() memSample {
			mu.Lock()
			defer mu.Unlock()
			return cur
		},
		trim: func() {
			mu.Lock()
			cur.free = 0
			mu.Unlock()
			order = append(order, "trim")
		},
		release: func() { order = append(order, "release") },
		ticks: func(time.Duration) (<-chan time.Time, func()) {
			tickers <- "start"
			return ticks, func() { tickers <- "stop" }
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-tickers:
			if got != want {
				t.Fatalf("ticker %s, want %s", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no ticker %s", want)
		}
	}
	tick := func(n int) {
		t.Helper()
		for range n {
			select {
			case ticks <- time.Time{}:
			case <-time.After(5 * time.Second):
				t.Fatal("the trimmer does not tick")
			}
		}
	}
	asleep := func() {
		t.Helper()
		select {
		case ticks <- time.Time{}:
			t.Fatal("the trimmer ticks while it should sleep")
		case <-time.After(50 * time.Millisecond):
		}
	}

	expect("start")
	tick(2) // two quiet ticks with 64 MiB free: trim
	expect("stop")
	asleep()
	if got := strings.Join(order, ","); got != "trim,release" {
		t.Fatalf("calls: %s, want trim,release", got)
	}

	set(100*mib, 64*mib) // a burst, then the wake it came with
	m.Wake()
	expect("start")
	tick(3) // the burst, then two quiet ticks: trim
	expect("stop")
	asleep()
	if got := strings.Join(order, ","); got != "trim,release,trim,release" {
		t.Fatalf("calls: %s, want a second trim and release", got)
	}

	m.Wake() // woken with nothing to trim: quiet for idle, then asleep
	m.Wake()
	expect("start")
	tick(4)
	expect("stop")
	asleep()
	if len(order) != 4 {
		t.Fatalf("calls: %v, want no trim with nothing free", order)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMemoryTrimmerWakes: an API request and a received sync message wake
// the trimmer; a received heartbeat and other gRPC events do not.
func TestMemoryTrimmerWakes(t *testing.T) {
	m := NewMemoryTrimmer(nil)
	woken := func() bool {
		select {
		case <-m.awaken:
			return true
		default:
			return false
		}
	}
	served := false
	m.WakeOn(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true })).
		ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/meshes", nil))
	if !served || !woken() {
		t.Error("an API request was not served, or did not wake the trimmer")
	}
	h := m.GRPCStats()
	h.HandleRPC(context.Background(), &stats.OutPayload{})
	h.HandleRPC(context.Background(), &stats.Begin{})
	if woken() {
		t.Error("sending woke the trimmer")
	}
	h.HandleRPC(context.Background(), &stats.InPayload{Payload: &syncv1.Message{Kind: &syncv1.Message_Heartbeat{Heartbeat: &syncv1.Heartbeat{}}}})
	if woken() {
		t.Error("a heartbeat woke the trimmer")
	}
	h.HandleRPC(context.Background(), &stats.InPayload{Payload: &syncv1.Message{Kind: &syncv1.Message_Ack{Ack: &syncv1.Ack{}}}})
	if !woken() {
		t.Error("a received message did not wake the trimmer")
	}
}
