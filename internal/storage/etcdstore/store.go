// Package etcdstore implements storage.Store on an etcd cluster, so that
// several global control planes (replicas) share one store. schema.go has
// the layout; commit.go the write path (group commit, optimistic
// transactions on the head key); watch.go maps etcd watches to store events;
// expire.go the tombstone window (compaction).
package etcdstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// Store implements storage.Store on etcd. It is safe for concurrent use;
// any number of Stores (in any number of processes) may share a prefix.
type Store struct {
	cfg Config
	l   layout
	cli *clientv3.Client
	log hclog.Logger
	id  string

	writes  chan *writeReq
	closing chan struct{}
	wg      sync.WaitGroup

	mu     sync.Mutex
	closed bool
}

var (
	_ storage.Store   = (*Store)(nil)
	_ storage.Limited = (*Store)(nil)
)

// Open checks the schema under cfg.Prefix (creating it on first use) and
// starts the store's committer.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, l: layout{cfg.Prefix}, cli: cfg.Client, log: cfg.Logger,
		writes: make(chan *writeReq), closing: make(chan struct{})}
	if err := s.initSchema(ctx); err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go s.commitLoop()
	return s, nil
}

// initSchema creates the schema version and store id in one transaction if
// absent, then checks them. The id joins the random id with etcd's cluster
// id: a cluster restored from a snapshot (etcdutl snapshot restore) gets a
// new cluster id, so peers see a replaced store and resync in full, as they
// do for a bbolt file restored from a backup.
func (s *Store) initSchema(ctx context.Context) error {
	ctx, cancel := s.callCtx(ctx)
	defer cancel()
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	_, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(s.l.schema()), "=", 0)).
		Then(clientv3.OpPut(s.l.schema(), strconv.Itoa(schemaVersion)), clientv3.OpPut(s.l.storeID(), hex.EncodeToString(id))).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: initialise %s: %w", s.l.prefix, s.wrapErr(err))
	}
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.l.schema()), clientv3.OpGet(s.l.storeID())).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: read schema: %w", s.wrapErr(err))
	}
	schema, ids := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(schema) != 1 || len(ids) != 1 {
		return fmt.Errorf("etcdstore: %s holds no schema version or store id (written by something else?)", s.l.prefix)
	}
	v, err := strconv.Atoi(string(schema[0].Value))
	switch {
	case err != nil:
		return fmt.Errorf("etcdstore: schema version %q: %w", schema[0].Value, kv.ErrCorrupt)
	case v > schemaVersion:
		return fmt.Errorf("etcdstore: schema %d under %s, this binary knows %d: %w", v, s.l.prefix, schemaVersion, storage.ErrNewerSchema)
	}
	s.id = fmt.Sprintf("%s-%x", ids[0].Value, resp.Header.ClusterId)
	return nil
}

// callCtx bounds one etcd call by the request timeout.
func (s *Store) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.RequestTimeout)
}

// wrapErr turns etcd's errors into the Store contract's: a caller's own
// cancellation stays as it is, compaction is ErrCompacted, anything else
// (no leader, no quorum, timeouts, a closed client) is ErrUnavailable.
func (s *Store) wrapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %v", storage.ErrCompacted, err)
	case errors.Is(err, context.Canceled):
		return err
	}
	return fmt.Errorf("%w: etcd: %v", storage.ErrUnavailable, err)
}

// ID implements storage.Store.
func (s *Store) ID() string { return s.id }

// Limits implements storage.Limited.
func (s *Store) Limits() storage.Limits {
	return storage.Limits{Ops: s.cfg.MaxTxnOps - 1, Bytes: s.cfg.MaxTxnBytes - txnOverhead}
}

// Prefix is the key prefix the store owns (the control plane keeps its
// election and shared secrets beside it).
func (s *Store) Prefix() string { return s.l.prefix }

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops the committer (queued writes are answered first) and ends
// every watch. The etcd client stays open.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// readErr checks a read's preconditions.
func (s *Store) readErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return storage.ErrClosed
	}
	return nil
}

// Get implements storage.Store (a linearizable read).
func (s *Store) Get(ctx context.Context, key resource.Key) (*resource.Resource, error) {
	if err := kv.ValidateKey(key); err != nil {
		return nil, err
	}
	if err := s.readErr(ctx); err != nil {
		return nil, err
	}
	r, _, err := s.load(ctx, kv.EncodeKey(key))
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, fmt.Errorf("%s: %w", key, storage.ErrNotFound)
	}
	return r, nil
}

// load reads one resource (nil when absent) and its etcd mod revision.
func (s *Store) load(ctx context.Context, enc []byte) (*resource.Resource, int64, error) {
	resp, err := s.get(ctx, s.l.resource(enc))
	if err != nil {
		return nil, 0, s.wrapErr(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	_, r, err := decodeValue(s.cfg.Sealer, resp.Kvs[0].Value)
	if err != nil {
		return nil, 0, fmt.Errorf("etcdstore: resource %q: %w", enc, err)
	}
	return r, resp.Kvs[0].ModRevision, nil
}

// listPage is how many keys one range read returns; a List of 100,000
// resources is many pages read at one etcd revision (a consistent snapshot)
// instead of one response too big for gRPC.
const listPage = 2000

// List implements storage.Store.
func (s *Store) List(ctx context.Context, opts storage.ListOptions) (*storage.ListResult, error) {
	if err := kv.ValidateList(opts); err != nil {
		return nil, err
	}
	if err := s.readErr(ctx); err != nil {
		return nil, err
	}
	out := &storage.ListResult{Items: []*resource.Resource{}}
	err := s.scan(ctx, opts, func(enc []byte, r *resource.Resource) {
		out.Total++
		if out.Total > opts.Offset && (opts.Limit == 0 || len(out.Items) < opts.Limit) {
			out.Items = append(out.Items, r)
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// scan calls fn, in key order, for every resource matching opts (offset and
// limit aside), reading pages at one etcd revision.
func (s *Store) scan(ctx context.Context, opts storage.ListOptions, fn func(enc []byte, r *resource.Resource)) error {
	prefix := s.l.resource(kv.ListPrefix(opts))
	end := clientv3.GetPrefixRangeEnd(prefix)
	checkNamespace := opts.Namespace != nil && opts.Mesh == ""
	var rev int64
	for from := prefix; ; {
		ropts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev != 0 {
			ropts = append(ropts, clientv3.WithRev(rev))
		}
		resp, err := s.get(ctx, from, ropts...)
		if err != nil {
			return s.wrapErr(err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, item := range resp.Kvs {
			enc, _ := s.l.resourceKey(item.Key)
			if checkNamespace && !kv.NamespaceIs(enc, *opts.Namespace) {
				continue
			}
			_, r, err := decodeValue(s.cfg.Sealer, item.Value)
			if err != nil {
				return fmt.Errorf("etcdstore: resource %q: %w", enc, err)
			}
			if r.Labels.Contains(opts.Labels) {
				fn(enc, r)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Meta implements storage.Store.
func (s *Store) Meta(ctx context.Context, key string) ([]byte, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: empty meta key", storage.ErrInvalid)
	}
	if err := s.readErr(ctx); err != nil {
		return nil, err
	}
	resp, err := s.get(ctx, s.l.meta(key))
	if err != nil {
		return nil, s.wrapErr(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("meta %q: %w", key, storage.ErrNotFound)
	}
	return resp.Kvs[0].Value, nil
}

// Revision implements storage.Store.
func (s *Store) Revision(ctx context.Context) (uint64, error) {
	if err := s.readErr(ctx); err != nil {
		return 0, err
	}
	h, _, err := s.readHead(ctx, 0)
	return h.rev, err
}

// readHead reads head as of etcd revision at (0 = now) and returns it with
// its mod revision (0 when no resource was ever written).
func (s *Store) readHead(ctx context.Context, at int64) (head, int64, error) {
	var opts []clientv3.OpOption
	if at > 0 {
		opts = append(opts, clientv3.WithRev(at))
	}
	resp, err := s.get(ctx, s.l.head(), opts...)
	if err != nil {
		return head{}, 0, s.wrapErr(err)
	}
	if len(resp.Kvs) == 0 {
		return head{}, 0, nil
	}
	h, err := decodeHead(resp.Kvs[0].Value)
	if err != nil {
		return head{}, 0, fmt.Errorf("etcdstore: %w", err)
	}
	return h, resp.Kvs[0].ModRevision, nil
}

// CompactedRevision implements storage.Store.
func (s *Store) CompactedRevision(ctx context.Context) (uint64, error) {
	if err := s.readErr(ctx); err != nil {
		return 0, err
	}
	rev, _, err := s.compactedMark(ctx)
	return rev, err
}

// compactedMark reads the compacted store revision and the etcd revision of
// its head (0, 0 when nothing was compacted).
func (s *Store) compactedMark(ctx context.Context) (uint64, int64, error) {
	resp, err := s.get(ctx, s.l.compacted())
	if err != nil {
		return 0, 0, s.wrapErr(err)
	}
	if len(resp.Kvs) == 0 {
		return 0, 0, nil
	}
	return decodeCompacted(resp.Kvs[0].Value)
}

// Ping is one linearizable read (the schema key), not retried: nil when a
// quorum of the cluster answered within ctx. The control plane's health
// check calls it.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.cli.Get(ctx, s.l.schema())
	return s.wrapErr(err)
}
