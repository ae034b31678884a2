package kds

import "time"

// pacer spaces the partial batches of a busy stream. Every batch costs the
// receiver a write transaction (two fsyncs in bbolt, its watchers, a status
// recompute) and the sender a frame, so a peer answering fast got one batch
// per few changes during a burst of writes, and the two zone processes
// spent more CPU on those transactions than the global spent on the writes
// themselves (profiles of the PUT phase: zone commits ~30% of the zone's
// CPU, a third of a core per zone at 1,200 PUT/s).
//
// A stream is busy when its last partial batch carried more than one change
// (they gathered while an earlier batch was unanswered, or while paced):
// then the next partial batch leaves no sooner than the spacing after it. A
// stream of single changes is never delayed, however frequent (one change
// at a time is what the one-change latency bars measure); a burst of writes
// reaches the peer as one batch per spacing. Full batches and snapshot
// chunks are not paced (they are as large as a batch gets).
//
// The spacing is interval, or answerShare times as long as the peer took to
// answer the last partial batch when that is longer (up to maxSpacing): a
// peer whose applies slow down (ten zone processes on two cores, their
// fsyncs queueing on one disk: 3-15 ms per commit) gets larger batches
// instead of spending its time, and the disk's, on commits.
//
// A burst's tail is not held for the spacing: once no change has joined
// the pending ones for quietWindow, the writes have stopped and what
// gathered leaves at once (waiting out the spacing, the last of 10,000
// writes reaches two zones 20-50 ms after it is made).
//
// Owned by the session's loop goroutine.
type pacer struct {
	interval time.Duration
	last     time.Time     // when the last partial batch left
	busy     bool          // it carried more than one change
	answer   time.Duration // how long the peer took to answer the last partial batch
	// pending is how many changes waited at the last wait, and grew
	// when that number last grew.
	pending int
	grew    time.Time
}

const (
	// answerShare: a busy stream keeps the peer applying its batches
	// about an eighth of the time at most. A quarter left ten zone
	// processes on two cores committing 150 times per 10,000 changes
	// each, their commits and fsyncs a third of each zone's CPU; an
	// eighth halved the commits and, alternated A/B with
	// `go run ./cmd/bench -runs 1 -n 10000 -sim-zones 0 -skip-fleet`
	// (4 pairs), took the ten-zone PUT rate from 2,691-2,888 to
	// 3,014-3,358/s, the zones' CPU per PUT from 43-45 to 36-39 µs. The
	// last write of a burst reaches two zones later (12-17 -> 42-45 ms,
	// bar 200); single changes are not paced at all.
	answerShare = 8
	// maxSpacing bounds how long a busy stream's changes may wait, and so
	// how late the last change of a burst arrives (BENCHMARKS.md: last write →
	// zone ≤ 200 ms). The answer time grows with the batch, so on a peer
	// that needs more than a quarter of its time to apply a burst the
	// spacing climbs to this bound (at 250 ms the last write reaches two
	// zones 100–140 ms after it is made).
	maxSpacing = 50 * time.Millisecond
	// quietWindow: a busy stream with no new change for this long sends
	// what is pending. A burst's writes reach the watch in commits a few
	// milliseconds apart (the store's group commit, longer when the
	// cores are busy). Alternated with the spacing alone
	// (`go run ./cmd/bench -runs 1 -skip-ten -sim-zones 0`, 2 pairs),
	// a 10 ms window brings the last write to two zones in 16-20 ms
	// against 37-47 ms, with the PUT rate kept; a 5 ms one gives 10-19 ms
	// but cuts bursts into more batches (zone-1 commits 62-67 per 10,000
	// PUTs against 54-68) and costs 7% of the median PUT rate.
	quietWindow = 10 * time.Millisecond
)

// spacing is the least time between two partial batches of a busy stream.
func (p *pacer) spacing() time.Duration {
	return max(p.interval, min(answerShare*p.answer, maxSpacing))
}

// wait returns how long until a partial batch of pending changes may
// leave at now (zero: it may).
func (p *pacer) wait(now time.Time, pending int) time.Duration {
	if pending > p.pending {
		p.grew = now
	}
	p.pending = pending
	if p.interval <= 0 || !p.busy {
		return 0
	}
	spaced := p.last.Add(p.spacing()).Sub(now)
	quiet := p.grew.Add(quietWindow).Sub(now)
	return max(min(spaced, quiet), 0)
}

// answered records how long the peer took to answer a partial batch.
func (p *pacer) answered(took time.Duration) { p.answer = took }

// sent records a partial batch of changes entries leaving at now.
func (p *pacer) sent(now time.Time, changes int) {
	p.last, p.busy, p.pending = now, changes > 1, 0
}
