package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"
)

// signer is what user and Dataplane tokens share: an Ed25519 key, the
// signing context that keeps one kind of token from passing for another,
// the clock and the skew allowed on issue times. Immutable.
type signer struct {
	kind    string // "user tokens", "dataplane tokens": in errors
	context string
	key     ed25519.PrivateKey
	pub     ed25519.PublicKey
	clock   Clock
	skew    time.Duration
}

func newSigner(kind, context string, key ed25519.PrivateKey, clock Clock) (signer, error) {
	if len(key) != ed25519.PrivateKeySize {
		return signer{}, fmt.Errorf("%s: signing key must be an Ed25519 private key of %d bytes, got %d", kind, ed25519.PrivateKeySize, len(key))
	}
	if clock == nil {
		clock = realClock{}
	}
	return signer{kind: kind, context: context, key: key, pub: key.Public().(ed25519.PublicKey), clock: clock, skew: DefaultClockSkew}, nil
}

// loadKindKey loads (or creates, 0600) the key file in dataDir.
func loadKindKey(kind, dataDir, file string) (ed25519.PrivateKey, error) {
	key, err := LoadOrCreateSigningKey(filepath.Join(dataDir, file))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	return key, nil
}

// newID is a token's random id.
func (s signer) newID() (string, error) {
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", fmt.Errorf("issue %s: %w", s.kind, err)
	}
	return hex.EncodeToString(id[:]), nil
}

// sign encodes and signs claims.
func (s signer) sign(claims any) (string, error) {
	body, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("issue %s: %w", s.kind, err)
	}
	return signToken(s.key, s.context, body), nil
}

// open checks a token's signature and decodes its claims into v, refusing
// unknown fields; errors wrap malformed or badSignature.
func (s signer) open(token string, v any, malformed, badSignature error) error {
	body, err := openToken(s.pub, s.context, token, malformed, badSignature)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: claims: %v", malformed, err)
	}
	return nil
}

// checkWindow checks issue and expiry times (Unix seconds) against the
// clock, wrapping expired or notYetValid.
func (s signer) checkWindow(issuedAt, expiresAt int64, expired, notYetValid error) error {
	now := s.clock.Now()
	switch {
	case now.Unix() >= expiresAt:
		return fmt.Errorf("%w: expired at %s", expired, time.Unix(expiresAt, 0).UTC().Format(time.RFC3339))
	case now.Add(s.skew).Unix() < issuedAt:
		return fmt.Errorf("%w: issued at %s", notYetValid, time.Unix(issuedAt, 0).UTC().Format(time.RFC3339))
	}
	return nil
}
