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

// TestOwnedBatchKeepsTheCallersData: a batch marked Owned is stored
// sharing its resources' labels and spec (no copy), one that is not is
// copied; either way the caller's resources are left as they were and the
// stored ones carry the store's fields.
func TestOwnedBatchKeepsTheCallersData(t *testing.T) {
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "o.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, owned := range []bool{true, false} {
		in := benchResource(10, 0)
		if owned {
			in.Name = "owned"
		}
		res, err := s.Apply(ctx, storage.Batch{Puts: []*resource.Resource{in}, Owned: owned})
		if err != nil {
			t.Fatal(err)
		}
		stored := res.Stored[0]
		if stored == in || stored.Version != 1 || stored.CreationTime.IsZero() {
			t.Fatalf("owned %v: stored %+v", owned, stored)
		}
		if in.Version != 0 || !in.CreationTime.IsZero() {
			t.Fatalf("owned %v: the caller's resource was changed: %+v", owned, in)
		}
		sharesSpec := &stored.Spec[0] == &in.Spec[0]
		if sharesSpec != owned {
			t.Fatalf("owned %v: the stored spec shares the caller's: %v", owned, sharesSpec)
		}
		got, err := s.Get(ctx, in.Key())
		if err != nil || string(got.Spec) != string(in.Spec) || got.Labels.Get("team") != "payments" {
			t.Fatalf("owned %v: read back %+v, %v", owned, got, err)
		}
	}
	// The group's next write is not owned: a single Put copies again.
	in := benchResource(11, 0)
	stored, _, err := s.Put(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if &stored.Spec[0] == &in.Spec[0] {
		t.Fatal("a Put after an owned batch kept the caller's spec")
	}
}
