package boltstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CommitMetrics observes the embedded store's write committer
// (CommitObserver): how long each commit takes, fsyncs included,
// and how many writes share it. Together they say whether a slow write rate
// is the disk (long commits) or the writers (few writes per commit), which
// is what an operator of a busy global, and a benchmark, needs to know.
type CommitMetrics struct {
	duration prometheus.Histogram
	writes   prometheus.Histogram
}

// NewCommitMetrics registers the histograms with reg.
func NewCommitMetrics(reg prometheus.Registerer) (*CommitMetrics, error) {
	m := &CommitMetrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meridian_store_commit_duration_seconds",
			Help:    "Duration of the embedded store's write transactions, from the first write applied to the commit on disk (both fsyncs).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 100 µs to 3.3 s
		}),
		writes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meridian_store_commit_writes",
			Help:    "Writes (API writes, sync batches) that shared one write transaction of the embedded store.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10), // 1 to 512, the committer's largest group
		}),
	}
	for _, c := range []prometheus.Collector{m.duration, m.writes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveCommit implements boltstore.CommitObserver.
func (m *CommitMetrics) ObserveCommit(writes int, took time.Duration) {
	m.duration.Observe(took.Seconds())
	m.writes.Observe(float64(writes))
}
