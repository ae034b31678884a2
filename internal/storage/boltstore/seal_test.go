package boltstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
)

// TestSealedSecrets: a sealed type's spec is encrypted in the file and
// read back in the clear; other types are not sealed; the file opened with
// another key refuses the sealed record instead of returning ciphertext.
func TestSealedSecrets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "meridian.db")
	key := bytes.Repeat([]byte{7}, 32)
	sealer, err := kv.NewSealer(key, "Secret")
	if err != nil {
		t.Fatal(err)
	}
	s, err := boltstore.Open(boltstore.Config{Path: path, Sealer: sealer})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	secret := &resource.Resource{Type: "Secret", Mesh: "default", Name: "k", Spec: []byte(`{"data":"cGxhaW50ZXh0LXNlY3JldA=="}`)}
	other := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: "t", Spec: []byte(`{"marker":"visible-marker"}`)}
	for _, r := range []*resource.Resource{secret, other} {
		if _, _, err := s.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get(ctx, secret.Key())
	if err != nil || string(got.Spec) != string(secret.Spec) {
		t.Fatalf("read back: %s %v", got.Spec, err)
	}
	list, err := s.List(ctx, storage.ListOptions{Type: "Secret"})
	if err != nil || len(list.Items) != 1 || string(list.Items[0].Spec) != string(secret.Spec) {
		t.Fatalf("listed: %v %v", list, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("cGxhaW50ZXh0LXNlY3JldA")) {
		t.Error("the file holds the secret's data in the clear")
	}
	if !bytes.Contains(raw, []byte("visible-marker")) {
		t.Error("an unsealed type was sealed (or the file is not what was written)")
	}
	wrong, _ := kv.NewSealer(bytes.Repeat([]byte{8}, 32), "Secret")
	s, err = boltstore.Open(boltstore.Config{Path: path, Sealer: wrong})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get(ctx, secret.Key()); !errors.Is(err, kv.ErrSealed) {
		t.Errorf("read with another key: %v, want ErrSealed", err)
	}
}
