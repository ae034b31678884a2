package boltstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// TestTxLookup: inside a write transaction Lookup answers nil, nil for an
// absent key where Get answers an error wrapping ErrNotFound, and both find
// a stored resource. The check runs on the committer's goroutine, so it
// reports with t.Error and its own error, never t.Fatal.
func TestTxLookup(t *testing.T) {
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "l.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	stored := benchResource(1, 0)
	if _, _, err := s.Put(ctx, stored); err != nil {
		t.Fatal(err)
	}
	absent := benchResource(2, 0).Key()
	check := func(tx storage.TxReader) ([]resource.Key, error) {
		l, ok := tx.(interface {
			Lookup(resource.Key) (*resource.Resource, error)
		})
		if !ok {
			return nil, errors.New("the write transaction has no Lookup")
		}
		if r, err := l.Lookup(absent); r != nil || err != nil {
			t.Errorf("Lookup(absent) = %v, %v; want nil, nil", r, err)
		}
		if _, err := tx.Get(absent); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("Get(absent) error = %v, want ErrNotFound", err)
		}
		for name, get := range map[string]func(resource.Key) (*resource.Resource, error){"Lookup": l.Lookup, "Get": tx.Get} {
			if r, err := get(stored.Key()); err != nil || r == nil || r.Name != stored.Name {
				t.Errorf("%s(stored) = %v, %v", name, r, err)
			}
		}
		if _, err := l.Lookup(resource.Key{Type: "MeshTimeout"}); err == nil {
			t.Error("Lookup of an invalid key succeeded")
		}
		return nil, nil
	}
	if _, err := s.Apply(ctx, storage.Batch{Puts: []*resource.Resource{benchResource(3, 0)}, Check: check}); err != nil {
		t.Fatal(err)
	}
}
