package kds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// Store is what sync needs of a store: read, watch from a revision, apply
// a batch (resources and resume point in one transaction), and the store's
// id. storage.Store implements it; tests may use anything narrower.
type Store interface {
	Get(ctx context.Context, key resource.Key) (*resource.Resource, error)
	List(ctx context.Context, opts storage.ListOptions) (*storage.ListResult, error)
	Apply(ctx context.Context, b storage.Batch) (*storage.BatchResult, error)
	Meta(ctx context.Context, key string) ([]byte, error)
	Revision(ctx context.Context) (uint64, error)
	Watch(ctx context.Context, from uint64) (<-chan storage.Event, error)
	ID() string
}

// Defaults of StreamConfig's zero fields.
const (
	DefaultHeartbeatInterval  = 10 * time.Second
	DefaultHeartbeatTimeout   = 30 * time.Second
	DefaultHandshakeTimeout   = 15 * time.Second
	DefaultMaxBatchBytes      = 1 << 20
	DefaultMaxInFlight        = 8
	DefaultResumeConfirmDelay = time.Second
	DefaultNackBackoff        = time.Second
	DefaultMaxNackBackoff     = 5 * time.Minute
	DefaultDrainTimeout       = time.Second
	DefaultBatchInterval      = 20 * time.Millisecond
	// MinMaxBatchBytes keeps room for a batch's own fields under the limit.
	MinMaxBatchBytes = 1024
)

// FeaturePolicyStatus: the zone reports the status of the global's policies
// (PolicyStatusReport). The global always supports it; a zone asks for it
// when it has a StatusReporter.
const FeaturePolicyStatus = "policy-status"

// StatusReporter gives a zone's policy status report (the statuses its
// engine computed for the global's policies).
type StatusReporter interface {
	// PolicyStatusReport returns the current report (nil before the first)
	// and a channel closed when a newer one replaces it.
	PolicyStatusReport() (*syncv1.PolicyStatusReport, <-chan struct{})
}

// Meta keys under which each side records the last revision it applied from
// the other, in the same transaction as the batch.
const (
	// MetaKeyGlobalRevision in a zone's store: the last global revision
	// applied (the zone's Handshake.resume_revision).
	MetaKeyGlobalRevision = "sync/global-revision"
	// MetaKeyGlobalStoreID in a zone's store: the id of the global store
	// that revision belongs to (Handshake.resume_store_id).
	MetaKeyGlobalStoreID = "sync/global-store-id"
	metaKeyZonePrefix    = "sync/zone-revision/"
	metaKeyZoneIDPrefix  = "sync/zone-store-id/"
)

// MetaKeyZoneRevision in the global's store: the last revision of zone's
// store the global applied (its HandshakeResponse.resume_revision).
func MetaKeyZoneRevision(zone string) string { return metaKeyZonePrefix + zone }

// MetaKeyZoneStoreID in the global's store: the id of the zone store that
// revision belongs to.
func MetaKeyZoneStoreID(zone string) string { return metaKeyZoneIDPrefix + zone }

// StreamConfig tunes one end of the sync stream. Zero values take the
// defaults above.
type StreamConfig struct {
	// HeartbeatInterval between heartbeats this end sends.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout: a stream on which nothing arrived for this long is
	// closed (and, on the zone, redialed). Must exceed HeartbeatInterval.
	HeartbeatTimeout time.Duration
	// HandshakeTimeout bounds the wait for the peer's handshake message.
	HandshakeTimeout time.Duration
	// MaxBatchBytes caps a DeltaBatch's encoded size (a single resource
	// larger than that travels alone). At least MinMaxBatchBytes.
	MaxBatchBytes int
	// MaxInFlight bounds the batches sent and not yet acknowledged.
	MaxInFlight int
	// ResumeConfirmDelay: after the store watch has been quiet this long,
	// the last revision sent is confirmed to the peer as its resume point
	// (see outbound for why this is not immediate).
	ResumeConfirmDelay time.Duration
	// NackBackoff is the first delay before resending rejected resources;
	// it doubles with each consecutive rejection up to MaxNackBackoff.
	NackBackoff    time.Duration
	MaxNackBackoff time.Duration
	// DrainTimeout bounds a graceful end (shutdown): the session sends
	// what is pending, stamps its last complete revision and waits this long
	// at most for the peer's answers, so the peer's resume point is current.
	DrainTimeout time.Duration
	// BatchInterval paces partial batches while a stream is busy (see
	// pacer): after a partial batch of several changes the next leaves no
	// sooner than BatchInterval later. Single changes are not delayed. The
	// default was measured (PUT rate with two zone processes on two cores,
	// alternated runs): 10 ms → 25 ms raised it by 20–35% (the zones'
	// fsyncs share the disk with the global's commits), 50 ms gave nothing
	// more and doubled the last write's arrival.
	BatchInterval time.Duration
}

// withDefaults checks c and fills in defaults.
func (c StreamConfig) withDefaults() (StreamConfig, error) {
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"HeartbeatInterval", &c.HeartbeatInterval, DefaultHeartbeatInterval},
		{"HeartbeatTimeout", &c.HeartbeatTimeout, DefaultHeartbeatTimeout},
		{"HandshakeTimeout", &c.HandshakeTimeout, DefaultHandshakeTimeout},
		{"ResumeConfirmDelay", &c.ResumeConfirmDelay, DefaultResumeConfirmDelay},
		{"NackBackoff", &c.NackBackoff, DefaultNackBackoff},
		{"MaxNackBackoff", &c.MaxNackBackoff, DefaultMaxNackBackoff},
		{"DrainTimeout", &c.DrainTimeout, DefaultDrainTimeout},
		{"BatchInterval", &c.BatchInterval, DefaultBatchInterval},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return c, fmt.Errorf("%s is negative (%s)", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	switch {
	case c.MaxBatchBytes == 0:
		c.MaxBatchBytes = DefaultMaxBatchBytes
	case c.MaxBatchBytes < MinMaxBatchBytes:
		return c, fmt.Errorf("MaxBatchBytes %d is below %d", c.MaxBatchBytes, MinMaxBatchBytes)
	}
	switch {
	case c.MaxInFlight == 0:
		c.MaxInFlight = DefaultMaxInFlight
	case c.MaxInFlight < 0:
		return c, fmt.Errorf("MaxInFlight is negative (%d)", c.MaxInFlight)
	}
	if c.HeartbeatTimeout <= c.HeartbeatInterval {
		return c, fmt.Errorf("HeartbeatTimeout %s must exceed HeartbeatInterval %s", c.HeartbeatTimeout, c.HeartbeatInterval)
	}
	if c.MaxNackBackoff < c.NackBackoff {
		return c, fmt.Errorf("MaxNackBackoff %s is below NackBackoff %s", c.MaxNackBackoff, c.NackBackoff)
	}
	return c, nil
}

func (c StreamConfig) outbound() outboundConfig {
	return outboundConfig{maxBatchBytes: c.MaxBatchBytes, maxInFlight: c.MaxInFlight,
		confirmDelay: c.ResumeConfirmDelay, nackBackoff: c.NackBackoff, maxNackBackoff: c.MaxNackBackoff,
		batchInterval: c.BatchInterval}
}

// ErrInvalidConfig is wrapped by NewServer and NewClient for a config they
// cannot use.
var ErrInvalidConfig = errors.New("invalid sync config")
