package kds

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Directions, as metric label values.
const (
	DirectionGlobalToZone = "global_to_zone"
	DirectionZoneToGlobal = "zone_to_global"
)

// Metrics are the sync engine's Prometheus collectors. NewMetrics registers
// them on the registerer given (never the global default registry); a nil
// *Metrics records nothing. Safe for concurrent use.
type Metrics struct {
	batchesSent   *prometheus.CounterVec
	batchesAcked  *prometheus.CounterVec
	batchesNacked *prometheus.CounterVec
	resources     *prometheus.CounterVec
	reconnects    *prometheus.CounterVec
	connectedG    *prometheus.GaugeVec
	lag           *prometheus.HistogramVec
	snapshot      *prometheus.HistogramVec
	refused       prometheus.Counter
	unauth        prometheus.Counter
}

// NewMetrics creates the collectors and registers them on reg. Collectors
// already registered there (a second server or client in the same process)
// are shared.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("sync metrics: registerer is nil")
	}
	labels := []string{"direction", "zone"}
	counter := func(name, help string, l []string) (*prometheus.CounterVec, error) {
		return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, l))
	}
	m := &Metrics{}
	var err error
	steps := []func() error{
		func() error {
			m.batchesSent, err = counter("meridian_sync_batches_sent_total",
				"Delta batches of a direction (counted by the sender as sent and by the receiver as received).", labels)
			return err
		},
		func() error {
			m.batchesAcked, err = counter("meridian_sync_batches_acked_total", "Delta batches the receiver acknowledged.", labels)
			return err
		},
		func() error {
			m.batchesNacked, err = counter("meridian_sync_batches_nacked_total", "Delta batches the receiver rejected in part.", labels)
			return err
		},
		func() error {
			m.resources, err = counter("meridian_sync_resources_synced_total", "Resource upserts and removals carried by delta batches.", labels)
			return err
		},
		func() error {
			m.reconnects, err = counter("meridian_sync_reconnects_total",
				"Sync streams opened after the first (zone: connection attempts; global: streams accepted).", []string{"zone"})
			return err
		},
		func() error {
			m.connectedG, err = register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_sync_zone_connected",
				Help: "1 while the zone's sync stream is up."}, []string{"zone"}))
			return err
		},
		func() error {
			m.lag, err = register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_sync_lag_seconds",
				Help:    "Time from sending a batch to the peer's answer: how long its changes took to be applied.",
				Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"direction"}))
			return err
		},
		func() error {
			m.snapshot, err = register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_sync_full_snapshot_seconds",
				Help: "Full snapshots the receiver applied: from its first chunk to its last (phase receive), " +
					"then from its last chunk until its one store transaction committed (phase apply; a zone streams " +
					"the chunks into that transaction as they come, so this is mostly the commit).",
				Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"direction", "phase"}))
			return err
		},
		func() error {
			m.refused, err = register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_sync_handshakes_refused_total",
				Help: "Zone handshakes the global refused (bad token or handshake)."}))
			return err
		},
		func() error {
			m.unauth, err = register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_sync_streams_unauthenticated_total",
				Help: "Zone streams refused before their handshake: no, invalid, expired or revoked zone token."}))
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// register registers c, or returns the equal collector registered before.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register sync metrics: %w", err)
}

// flowMetrics are the children of one (direction, zone).
type flowMetrics struct {
	sentC, ackedC, nackedC, resourcesC prometheus.Counter
	lag                                prometheus.Observer
	snapReceive, snapApply             prometheus.Observer
}

func (m *Metrics) flow(direction, zone string) flowMetrics {
	if m == nil {
		return flowMetrics{}
	}
	return flowMetrics{
		sentC:       m.batchesSent.WithLabelValues(direction, zone),
		ackedC:      m.batchesAcked.WithLabelValues(direction, zone),
		nackedC:     m.batchesNacked.WithLabelValues(direction, zone),
		resourcesC:  m.resources.WithLabelValues(direction, zone),
		lag:         m.lag.WithLabelValues(direction),
		snapReceive: m.snapshot.WithLabelValues(direction, "receive"),
		snapApply:   m.snapshot.WithLabelValues(direction, "apply"),
	}
}

// snapshotApplied records a full snapshot the receiving side applied.
func (f flowMetrics) snapshotApplied(receive, apply time.Duration) {
	if f.snapApply == nil {
		return
	}
	f.snapReceive.Observe(receive.Seconds())
	f.snapApply.Observe(apply.Seconds())
}

func (f flowMetrics) sent(s batchSummary) {
	if f.sentC == nil {
		return
	}
	f.sentC.Inc()
	f.resourcesC.Add(float64(s.upserts + s.removals))
}

// answered records an answer; rtt is zero on the receiving side, which
// does not know when the batch was sent.
func (f flowMetrics) answered(nacked bool, rtt time.Duration) {
	if f.sentC == nil {
		return
	}
	if nacked {
		f.nackedC.Inc()
	} else {
		f.ackedC.Inc()
	}
	if rtt > 0 {
		f.lag.Observe(rtt.Seconds())
	}
}

func (m *Metrics) reconnected(zone string) {
	if m != nil {
		m.reconnects.WithLabelValues(zone).Inc()
	}
}

func (m *Metrics) connected(zone string, up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.connectedG.WithLabelValues(zone).Set(v)
}

func (m *Metrics) handshakeUnauthenticated() {
	if m != nil {
		m.unauth.Inc()
	}
}

func (m *Metrics) handshakeRefused() {
	if m != nil {
		m.refused.Inc()
	}
}
