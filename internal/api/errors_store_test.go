package api

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// TestStoreErrorsMapToStatus: a write too big for the store's transactions
// is 413 and a store without quorum is 503, not 500.
func TestStoreErrorsMapToStatus(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{fmt.Errorf("batch: %w: 200 ops", storage.ErrTooLarge), http.StatusRequestEntityTooLarge},
		{fmt.Errorf("%w: etcd: leader changed", storage.ErrUnavailable), http.StatusServiceUnavailable},
		{fmt.Errorf("x: %w", storage.ErrConflict), http.StatusConflict},
	}
	for _, tc := range tests {
		if got := toAPIError(tc.err).Status; got != tc.want {
			t.Errorf("%v: status %d, want %d", tc.err, got, tc.want)
		}
	}
}
