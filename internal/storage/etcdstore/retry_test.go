package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTransient: what the store retries within its request timeout. A
// connection lost under a request (the member was killed) is retried: a
// write in flight to the etcd leader when it died used to fail with 503.
func TestTransient(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"leader changed", rpctypes.ErrLeaderChanged, true},
		{"no leader, wrapped", fmt.Errorf("txn: %w", rpctypes.ErrNoLeader), true},
		{"connection lost under the request", status.Error(codes.Unavailable, "error reading from server: EOF"), true},
		{"request too large", rpctypes.ErrRequestTooLarge, false},
		{"compacted", rpctypes.ErrCompacted, false},
		{"caller canceled", context.Canceled, false},
		{"invalid argument", status.Error(codes.InvalidArgument, "bad"), false},
		{"plain error", errors.New("boom"), false},
	} {
		if got := transient(tt.err); got != tt.want {
			t.Errorf("%s: transient(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
