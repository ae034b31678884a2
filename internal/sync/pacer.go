package sync

import "time"

// pacer spaces the partial batches of a busy stream. Every batch costs the
// receiver a write transaction (two fsyncs in bbolt, its watchers, a status
// recompute) and the sender a frame, so a peer answering fast got one batch
// per few changes during a burst of writes, and the two zone processes
// spent more CPU on those transactions than the global spent on the writes
// themselves (profiles of the PUT phase: zone commits ~30% of the zone's
// CPU, a third of a core per zone at 1,200 PUT/s).
//
// It is a token bucket in GCRA form: burst batches may leave back to back,
// then one per interval. A quiet stream has its burst available, so a single
// change (or a few) still leaves at once; only a sustained stream of changes
// is gathered into batches at most every interval. Full batches and
// snapshot chunks are not paced (they are as large as a batch gets).
//
// Owned by the session's loop goroutine.
type pacer struct {
	interval time.Duration
	burst    int
	// tat is the theoretical arrival time: when the bucket would be full
	// again had every token been taken on schedule.
	tat time.Time
}

// wait returns how long until a batch may leave at now (zero: it may).
func (p *pacer) wait(now time.Time) time.Duration {
	if p.interval <= 0 {
		return 0
	}
	tat := p.tat
	if tat.Before(now) {
		tat = now
	}
	ahead := tat.Sub(now) - time.Duration(p.burst-1)*p.interval
	return max(ahead, 0)
}

// take records a batch leaving at now; the caller checked wait first.
func (p *pacer) take(now time.Time) {
	if p.interval <= 0 {
		return
	}
	if p.tat.Before(now) {
		p.tat = now
	}
	p.tat = p.tat.Add(p.interval)
}
