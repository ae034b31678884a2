package etcdstore

import (
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Clock tells the store the time for resource times and the tombstone
// window; tests inject a fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// etcd's own defaults for one request (--max-txn-ops, --max-request-bytes).
const (
	DefaultMaxTxnOps   = 128
	DefaultMaxTxnBytes = 1536 * 1024
	// txnOverhead leaves room for a transaction's framing and compares
	// under MaxTxnBytes.
	txnOverhead = 16 * 1024
	// DefaultRequestTimeout bounds one etcd call, so a store without quorum
	// answers with an error instead of hanging its caller.
	DefaultRequestTimeout = 5 * time.Second
)

// Config of a Store. Client and Prefix are required.
type Config struct {
	// Client is the caller's; the store never closes it.
	Client *clientv3.Client
	// Sealer, when set, encrypts the specs of secret types in etcd
	// (kv.Sealer).
	Sealer *kv.Sealer
	// Prefix namespaces every key (e.g. "/meridian/"); several stores may
	// share a cluster under different prefixes.
	Prefix string
	Logger hclog.Logger
	// Clock defaults to the real time.
	Clock Clock
	// TombstoneRetention is how long deletions stay watchable; 0 = 24 h.
	TombstoneRetention time.Duration
	// CompactEtcd also compacts etcd's history when the tombstone window
	// moves (frees space). etcd compaction is cluster-wide: turn it off when
	// other tenants share the cluster and compact it yourself.
	CompactEtcd bool
	// MaxTxnOps and MaxTxnBytes must not exceed the cluster's
	// --max-txn-ops and --max-request-bytes (0 = etcd's defaults). A write
	// group never exceeds them; a single write that would is refused with
	// storage.ErrTooLarge.
	MaxTxnOps   int
	MaxTxnBytes int
	// RequestTimeout bounds each etcd call (0 = DefaultRequestTimeout).
	RequestTimeout time.Duration
}

func (c *Config) check() error {
	switch {
	case c.Client == nil:
		return errors.New("etcdstore: a client is required")
	case c.Prefix == "" || !strings.HasSuffix(c.Prefix, "/"):
		return errors.New("etcdstore: the key prefix must be non-empty and end with /")
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.TombstoneRetention <= 0 {
		c.TombstoneRetention = 24 * time.Hour
	}
	if c.MaxTxnOps <= 0 {
		c.MaxTxnOps = DefaultMaxTxnOps
	}
	if c.MaxTxnBytes <= 0 {
		c.MaxTxnBytes = DefaultMaxTxnBytes
	}
	if c.MaxTxnOps < 3 || c.MaxTxnBytes < 2*txnOverhead {
		return errors.New("etcdstore: MaxTxnOps must be at least 3 and MaxTxnBytes at least 32 KiB")
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	return nil
}
