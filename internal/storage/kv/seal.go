package kv

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Sealer encrypts the specs of secret types at rest (AES-256-GCM). Stores
// seal a record's spec when they write it and open it when they read it,
// so everything above the store sees plaintext and the file or etcd holds
// none. The resource's key is the additional data: a sealed spec moved to
// another key does not open. A nil *Sealer seals nothing.
type Sealer struct {
	aead  cipher.AEAD
	types map[string]bool
}

// SealKeySize is the length of a Sealer's key.
const SealKeySize = 32

// ErrSealed: a sealed spec that does not open (another key, a record
// moved or altered).
var ErrSealed = errors.New("sealed spec does not open")

// sealedPrefix starts a sealed spec: {"sealed":"<base64 nonce+ciphertext>"}.
var sealedPrefix = []byte(`{"sealed":"`)

// NewSealer seals the specs of types with key (SealKeySize bytes).
func NewSealer(key []byte, types ...string) (*Sealer, error) {
	if len(key) != SealKeySize {
		return nil, fmt.Errorf("sealer: key of %d bytes, want %d", len(key), SealKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	s := &Sealer{aead: aead, types: map[string]bool{}}
	for _, t := range types {
		s.types[t] = true
	}
	return s, nil
}

// Seal returns r with its spec sealed when its type is sealed (a shallow
// copy; r is not changed), else r.
func (s *Sealer) Seal(r *resource.Resource) (*resource.Resource, error) {
	if s == nil || r == nil || !s.types[r.Type] || len(r.Spec) == 0 {
		return r, nil
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(r.Spec)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal %s: %w", r.Key(), err)
	}
	sealed := s.aead.Seal(nonce, nonce, r.Spec, []byte(EncodeKey(r.Key())))
	c := *r
	c.Spec = append(append(append([]byte(nil), sealedPrefix...), base64.StdEncoding.EncodeToString(sealed)...), `"}`...)
	return &c, nil
}

// Open opens a sealed spec of r in place (r was just decoded); a spec that
// is not sealed (written before sealing) is left as it is.
func (s *Sealer) Open(r *resource.Resource) error {
	if s == nil || r == nil || !s.types[r.Type] || !bytes.HasPrefix(r.Spec, sealedPrefix) {
		return nil
	}
	var env struct {
		Sealed []byte `json:"sealed"`
	}
	if err := json.Unmarshal(r.Spec, &env); err != nil || len(env.Sealed) < s.aead.NonceSize() {
		return fmt.Errorf("%s: %w", r.Key(), ErrSealed)
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, env.Sealed[:n], env.Sealed[n:], []byte(EncodeKey(r.Key())))
	if err != nil {
		return fmt.Errorf("%s: %w (is the secrets key the one it was sealed with?)", r.Key(), ErrSealed)
	}
	r.Spec = plain
	return nil
}
