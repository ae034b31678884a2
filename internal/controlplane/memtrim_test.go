package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestMemoryTrimmerObserve: a trim needs a quiet period (at most quietAlloc
// allocated per tick) and enough free memory held, or a burst since the
// last trim that allocated as much; allocation restarts the quiet period,
// and after a trim (which leaves nothing free) an idle process is not
// trimmed again until it holds free memory anew.
func TestMemoryTrimmerObserve(t *testing.T) {
	const mib = 1 << 20
	m := &memoryTrimmer{tick: time.Second, quiet: 2 * time.Second, quietAlloc: mib, minFree: 8 * mib}
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

// TestMemoryTrimmerRun: the loop trims once per quiet period on its ticks,
// releases the store's map after each trim, and stops with its context.
func TestMemoryTrimmerRun(t *testing.T) {
	ticks := make(chan time.Time)
	cur := memSample{allocated: 0, free: 64 << 20}
	trimmed := make(chan struct{}, 10)
	var order []string
	m := &memoryTrimmer{
		tick: time.Second, quiet: 2 * time.Second, quietAlloc: 1 << 20, minFree: 8 << 20,
		read:    func() memSample { return cur },
		trim:    func() { cur.free = 0; trimmed <- struct{}{}; order = append(order, "trim") },
		release: func() { order = append(order, "release") },
		ticks:   func(time.Duration) (<-chan time.Time, func()) { return ticks, func() {} },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.run(ctx) }()
	for range 5 {
		ticks <- time.Time{}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(trimmed); n != 1 {
		t.Fatalf("trimmed %d times over 5 quiet ticks with 64 MiB free once, want 1", n)
	}
	if got := strings.Join(order, ","); got != "trim,release" {
		t.Errorf("calls: %s, want trim,release", got)
	}
}
