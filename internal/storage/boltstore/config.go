package boltstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// Clock tells the store the time for CreationTime, ModificationTime and
// tombstone expiry. Tests inject a fake one; it must be safe for concurrent
// use.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// CommitObserver is told of every group of writes the write committer ran:
// how many writes shared its transaction (concurrent Puts, Deletes and
// Applies) and how long the group took, fsyncs included (and, in the rare
// group that one write spoiled, the reruns; see commitGroup). It is called
// on the committer's goroutine after the writers have their answers, so a
// caller may see its write answered before it is observed; it must not
// block.
type CommitObserver interface {
	ObserveCommit(writes int, took time.Duration)
}

// Defaults applied by Open to zero Config fields.
const (
	DefaultTombstoneRetention = 24 * time.Hour
	DefaultExpiryInterval     = time.Minute
	DefaultLockTimeout        = time.Second
	DefaultMaxWriteGroup      = 512
	DefaultMaxGroupWait       = time.Millisecond
	DefaultStreamIdle         = time.Second
	DefaultStreamMax          = 10 * time.Second
)

// Config configures Open. Zero values take the defaults above.
type Config struct {
	// Path is the data file; its directory is created when missing.
	Path string
	// Logger receives the store's logs; nil discards them.
	Logger hclog.Logger
	// Clock defaults to the real time.
	Clock Clock
	// TombstoneRetention is how long a delete stays in the change log for
	// watchers that resume; after it, watching from before the delete
	// yields storage.ErrCompacted.
	TombstoneRetention time.Duration
	// ExpiryInterval is how often the background pass drops expired
	// tombstones.
	ExpiryInterval time.Duration
	// LockTimeout bounds the wait for the file lock, so that a second
	// process on the same data file fails with ErrInUse instead of hanging.
	LockTimeout time.Duration
	// MaxWriteGroup caps how many concurrent single writes share one
	// transaction (and one fsync).
	MaxWriteGroup int
	// Sealer, when set, encrypts the specs of secret types in the file
	// (kv.Sealer).
	Sealer *kv.Sealer
	// Commits, when set, observes every commit of the write committer
	// (metrics: writes per commit, commit duration).
	Commits CommitObserver
	// MaxGroupWait caps how long a group of writes waits for the writers
	// the previous group answered (see lastGroup.target); the wait is also
	// at most the previous commit's duration.
	MaxGroupWait time.Duration
	// StreamIdle and StreamMax bound how long an ApplyStream may hold the
	// store's writer (storage.Streaming): it is rolled back when no part
	// has come for StreamIdle, or once it has been open for StreamMax.
	StreamIdle time.Duration
	StreamMax  time.Duration
}

// ErrInvalidConfig is wrapped by Open for a Config it cannot use.
var ErrInvalidConfig = errors.New("invalid boltstore config")

// withDefaults validates c and returns a copy with every default filled in.
func (c Config) withDefaults() (Config, error) {
	if c.Path == "" {
		return c, fmt.Errorf("%w: Path is required", ErrInvalidConfig)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"TombstoneRetention", &c.TombstoneRetention, DefaultTombstoneRetention},
		{"ExpiryInterval", &c.ExpiryInterval, DefaultExpiryInterval},
		{"LockTimeout", &c.LockTimeout, DefaultLockTimeout},
		{"MaxGroupWait", &c.MaxGroupWait, DefaultMaxGroupWait},
		{"StreamIdle", &c.StreamIdle, DefaultStreamIdle},
		{"StreamMax", &c.StreamMax, DefaultStreamMax},
	} {
		if *d.v < 0 {
			return c, fmt.Errorf("%w: %s is negative (%s)", ErrInvalidConfig, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.MaxWriteGroup < 0 {
		return c, fmt.Errorf("%w: MaxWriteGroup is negative (%d)", ErrInvalidConfig, c.MaxWriteGroup)
	}
	if c.MaxWriteGroup == 0 {
		c.MaxWriteGroup = DefaultMaxWriteGroup
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return c, nil
}
