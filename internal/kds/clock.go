package kds

import "time"

// Clock is the time source of the sync loops: heartbeats, timeouts,
// backoffs and status timestamps. Tests inject a fake one. Implementations
// must be safe for concurrent use.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer, like time.Timer.
type Timer interface {
	// C delivers the time once the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; see time.Timer.Stop.
	Stop() bool
	// Reset re-arms the timer to fire after d.
	Reset(d time.Duration)
}

// RealClock is the wall clock.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer implements Clock.
func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Stop() bool            { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }

// optTimer is a timer that may be disarmed, for select loops: C is nil
// while disarmed, so the select case never fires. Owned by one goroutine.
type optTimer struct {
	clock Clock
	t     Timer
	armed bool
}

func (o *optTimer) C() <-chan time.Time {
	if !o.armed {
		return nil
	}
	return o.t.C()
}

// arm (re)starts the timer for d.
func (o *optTimer) arm(d time.Duration) {
	if o.t == nil {
		o.t = o.clock.NewTimer(d)
	} else {
		o.stop()
		o.t.Reset(d)
	}
	o.armed = true
}

// armIfIdle starts the timer unless it is already running.
func (o *optTimer) armIfIdle(d time.Duration) {
	if !o.armed {
		o.arm(d)
	}
}

// fired must be called after receiving from C.
func (o *optTimer) fired() { o.armed = false }

func (o *optTimer) stop() {
	if o.t != nil && o.armed && !o.t.Stop() {
		// Drain a value that fired but was not received, so that a later
		// Reset does not deliver a stale tick.
		select {
		case <-o.t.C():
		default:
		}
	}
	o.armed = false
}
