package etcdstore

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Transient etcd errors: a leader election in progress, a request that
// timed out inside the cluster, and a connection lost under a request (the
// member it went to was killed: gRPC's Unavailable, "error reading from
// server: EOF"; the client's balancer sends the next attempt to another
// member). A read, or a retry of the same guarded transaction, is safe to
// repeat (commit learns the fate of an attempt whose answer was lost); the
// store does so within its request timeout instead of failing the caller
// (killing one member of three must not fail writes).
func transient(err error) bool {
	for _, e := range []error{rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrTimeout,
		rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTooManyRequests} {
		if errors.Is(err, e) {
			return true
		}
	}
	return status.Code(err) == codes.Unavailable
}

// retryBackoff is the pause between attempts.
const retryBackoff = 100 * time.Millisecond

// withRetry runs call (one attempt, given a context bounded by the request
// timeout) until it succeeds, fails for good, or the request timeout has
// passed since the first attempt.
func (s *Store) withRetry(ctx context.Context, call func(ctx context.Context) error) error {
	deadline := time.Now().Add(s.cfg.RequestTimeout)
	for {
		cctx, cancel := s.callCtx(ctx)
		err := call(cctx)
		cancel()
		if err == nil || !transient(err) || time.Now().Add(retryBackoff).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(retryBackoff):
		}
	}
}

// get is a Get retried through transient errors.
func (s *Store) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	var resp *clientv3.GetResponse
	err := s.withRetry(ctx, func(cctx context.Context) (err error) {
		resp, err = s.cli.Get(cctx, key, opts...)
		return err
	})
	return resp, err
}

// readTxn runs read-only operations in one transaction, retried through
// transient errors.
func (s *Store) readTxn(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	var resp *clientv3.TxnResponse
	err := s.withRetry(ctx, func(cctx context.Context) (err error) {
		resp, err = s.cli.Txn(cctx).Then(ops...).Commit()
		return err
	})
	return resp, err
}
