package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"
)

// Errors of token handling; callers test them with errors.Is.
var (
	// ErrMalformed: the token is not a zone token (bad encoding, bad JSON,
	// missing claims, unknown version).
	ErrMalformed = errors.New("malformed zone token")
	// ErrBadSignature: the signature does not verify with this global's key
	// (a token of another global, or a tampered one).
	ErrBadSignature = errors.New("zone token signature is invalid")
	// ErrExpired: the token's expires-at has passed.
	ErrExpired = errors.New("zone token expired")
	// ErrNotYetValid: the token was issued in the future (beyond the clock
	// skew allowance).
	ErrNotYetValid = errors.New("zone token not yet valid")
	// ErrWrongZone: the token was issued for another zone.
	ErrWrongZone = errors.New("zone token is for another zone")
	// ErrInsecureFile: a secret file is readable by group or others.
	ErrInsecureFile = errors.New("secret file is readable by others")
)

// SigningKeyFileName is the signing key's file inside the global's data dir.
const SigningKeyFileName = "zone-token-signing.key"

const (
	tokenVersion = 1
	// signingContext is prepended to the signed bytes so that a signature
	// made by this key for any other purpose can never pass as a token.
	signingContext = "meridian-zone-token.v1."
	// MaxValidity bounds validFor; a longer-lived credential is a mistake.
	MaxValidity = 10 * 365 * 24 * time.Hour
	// DefaultClockSkew tolerates a zone token issued slightly in the future
	// by a global whose clock runs ahead of the verifier's.
	DefaultClockSkew = time.Minute
)

// Claims are the signed content of a zone token. Times are Unix seconds.
type Claims struct {
	Version   int    `json:"v"`
	Zone      string `json:"zone"`
	IssuedAt  int64  `json:"iat"`
	ExpiresAt int64  `json:"exp"`
	// ID makes two tokens issued in the same second differ (for audit logs)
	// and names the token for revocation.
	ID string `json:"jti"`
	// KeyID names the signing key (rotation); absent in tokens signed
	// before rotation existed, which the current key verifies.
	KeyID string `json:"kid,omitempty"`
}

// ZoneTokensConfig configures NewZoneTokens.
type ZoneTokensConfig struct {
	// Key signs and verifies; required.
	Key ed25519.PrivateKey
	// Previous keys still verify until their RetireAt (rotation overlap).
	Previous []PreviousKey
	// Clock defaults to the real time.
	Clock Clock
	// ClockSkew defaults to DefaultClockSkew; negative is invalid.
	ClockSkew time.Duration
}

// ZoneTokens issues and verifies zone tokens. It is immutable after
// construction and safe for concurrent use.
//
// Format: base64url(JSON claims) "." base64url(Ed25519 signature), without
// padding; compact enough for a file, a flag or an HTTP header.
type ZoneTokens struct {
	key      ed25519.PrivateKey
	pub      ed25519.PublicKey
	kid      string
	previous []PreviousKey
	clock    Clock
	skew     time.Duration
}

// PreviousKey is a rotated-out signing key that still verifies tokens
// until RetireAt.
type PreviousKey struct {
	Key      ed25519.PrivateKey
	RetireAt time.Time
}

// KeyID names a signing key by its public key: 16 hex characters of its
// SHA-256.
func KeyID(key ed25519.PrivateKey) string {
	sum := sha256.Sum256(key.Public().(ed25519.PublicKey))
	return hex.EncodeToString(sum[:8])
}

// NewZoneTokens checks cfg and returns the issuer/verifier.
func NewZoneTokens(cfg ZoneTokensConfig) (*ZoneTokens, error) {
	if len(cfg.Key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("zone tokens: signing key must be an Ed25519 private key of %d bytes, got %d", ed25519.PrivateKeySize, len(cfg.Key))
	}
	if cfg.ClockSkew < 0 {
		return nil, fmt.Errorf("zone tokens: negative clock skew %s", cfg.ClockSkew)
	}
	if cfg.ClockSkew == 0 {
		cfg.ClockSkew = DefaultClockSkew
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	for i, p := range cfg.Previous {
		if len(p.Key) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("zone tokens: previous key %d is not an Ed25519 private key", i)
		}
	}
	return &ZoneTokens{key: cfg.Key, pub: cfg.Key.Public().(ed25519.PublicKey), kid: KeyID(cfg.Key),
		previous: cfg.Previous, clock: cfg.Clock, skew: cfg.ClockSkew}, nil
}

// KeyID is the current signing key's id.
func (t *ZoneTokens) KeyID() string { return t.kid }

// verifyingKey picks the key a token names: the current key (or no kid, as
// tokens issued before rotation have), or a previous key not yet retired.
// retireAt is zero for the current key.
func (t *ZoneTokens) verifyingKey(kid string) (ed25519.PublicKey, time.Time, error) {
	if kid == "" || kid == t.kid {
		return t.pub, time.Time{}, nil
	}
	now := t.clock.Now()
	for _, p := range t.previous {
		if KeyID(p.Key) == kid {
			if !now.Before(p.RetireAt) {
				return nil, time.Time{}, fmt.Errorf("%w: signed by key %s, retired at %s", ErrBadSignature, kid, p.RetireAt.UTC().Format(time.RFC3339))
			}
			return p.Key.Public().(ed25519.PublicKey), p.RetireAt, nil
		}
	}
	return nil, time.Time{}, fmt.Errorf("%w: signed by unknown key %s", ErrBadSignature, kid)
}

// Issue signs a token for zone valid for validFor from now.
func (t *ZoneTokens) Issue(zone string, validFor time.Duration) (string, error) {
	token, _, err := t.IssueToken(zone, validFor)
	return token, err
}

// IssueToken is Issue returning the token's claims too (its id, for
// revocation, and its expiry).
func (t *ZoneTokens) IssueToken(zone string, validFor time.Duration) (string, Claims, error) {
	if zone == "" {
		return "", Claims{}, errors.New("issue zone token: zone name is required")
	}
	if validFor <= 0 || validFor > MaxValidity {
		return "", Claims{}, fmt.Errorf("issue zone token: validity %s must be positive and at most %s", validFor, MaxValidity)
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", Claims{}, fmt.Errorf("issue zone token: %w", err)
	}
	now := t.clock.Now()
	claims := Claims{Version: tokenVersion, Zone: zone, IssuedAt: now.Unix(),
		ExpiresAt: now.Add(validFor).Unix(), ID: hex.EncodeToString(id[:]), KeyID: t.kid}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", Claims{}, fmt.Errorf("issue zone token: %w", err)
	}
	return signToken(t.key, signingContext, body), claims, nil
}

// Verify checks token's signature, validity window and zone. The error
// wraps one of ErrMalformed, ErrBadSignature, ErrExpired, ErrNotYetValid or
// ErrWrongZone and says what was found, never the token itself.
func (t *ZoneTokens) Verify(token, zone string) (Claims, error) {
	claims, _, err := t.VerifyWithKey(token, zone)
	return claims, err
}

// VerifyWithKey is Verify that also says until when the signing key
// verifies: zero for the current key, else the previous key's retirement
// (a stream authenticated with it must end then).
func (t *ZoneTokens) VerifyWithKey(token, zone string) (Claims, time.Time, error) {
	claims, keyRetireAt, err := t.parse(strings.TrimSpace(token))
	if err != nil {
		return Claims{}, time.Time{}, err
	}
	claims, err = t.checkClaims(claims, zone)
	return claims, keyRetireAt, err
}

func (t *ZoneTokens) checkClaims(claims Claims, zone string) (Claims, error) {
	now := t.clock.Now()
	switch {
	case now.Unix() >= claims.ExpiresAt:
		return Claims{}, fmt.Errorf("%w: expired at %s", ErrExpired, time.Unix(claims.ExpiresAt, 0).UTC().Format(time.RFC3339))
	case now.Add(t.skew).Unix() < claims.IssuedAt:
		return Claims{}, fmt.Errorf("%w: issued at %s", ErrNotYetValid, time.Unix(claims.IssuedAt, 0).UTC().Format(time.RFC3339))
	case claims.Zone != zone:
		return Claims{}, fmt.Errorf("%w: token is for zone %q, not %q", ErrWrongZone, claims.Zone, zone)
	}
	return claims, nil
}

func (t *ZoneTokens) parse(token string) (Claims, time.Time, error) {
	// The key id selects the key the signature is checked with; nothing
	// else of the claims is read before the signature verifies.
	pub, retireAt, err := t.verifyingKey(unverifiedKeyID(token))
	if err != nil {
		return Claims{}, time.Time{}, err
	}
	body, err := openToken(pub, signingContext, token, ErrMalformed, ErrBadSignature)
	if err != nil {
		return Claims{}, time.Time{}, err
	}
	var claims Claims
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&claims); err != nil {
		return Claims{}, time.Time{}, fmt.Errorf("%w: claims: %v", ErrMalformed, err)
	}
	switch {
	case claims.Version != tokenVersion:
		return Claims{}, time.Time{}, fmt.Errorf("%w: unsupported version %d", ErrMalformed, claims.Version)
	case claims.Zone == "" || claims.ExpiresAt == 0 || claims.IssuedAt == 0:
		return Claims{}, time.Time{}, fmt.Errorf("%w: zone, iat and exp are required", ErrMalformed)
	}
	return claims, retireAt, nil
}

// unverifiedKeyID reads the kid claim of a token without verifying it ("" when
// there is none or the token is malformed: openToken then says why).
func unverifiedKeyID(token string) string {
	payload, _, _ := strings.Cut(strings.TrimSpace(token), ".")
	body, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || len(body) > 4096 {
		return ""
	}
	var c struct {
		KeyID string `json:"kid"`
	}
	_ = json.Unmarshal(body, &c)
	return c.KeyID
}

// signToken returns base64url(body) "." base64url(signature over context +
// payload). The context keeps a signature made for one kind of token from
// ever passing as another.
func signToken(key ed25519.PrivateKey, context string, body []byte) string {
	payload := base64.RawURLEncoding.EncodeToString(body)
	sig := ed25519.Sign(key, []byte(context+payload))
	return payload + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// openToken checks a token's form and signature and returns its claims'
// bytes; errors wrap malformed or badSignature and never quote the token.
func openToken(pub ed25519.PublicKey, context, token string, malformed, badSignature error) ([]byte, error) {
	token = strings.TrimSpace(token)
	if token == "" {
		return nil, fmt.Errorf("%w: the token is empty", malformed)
	}
	payload, sigText, ok := strings.Cut(token, ".")
	if !ok || payload == "" || sigText == "" {
		return nil, fmt.Errorf("%w: want two dot-separated parts", malformed)
	}
	sig, err := base64.RawURLEncoding.DecodeString(sigText)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: signature is not %d base64url bytes", malformed, ed25519.SignatureSize)
	}
	body, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: claims are not base64url: %v", malformed, err)
	}
	// The signature is checked before the claims are trusted or even
	// interpreted beyond the encoding.
	if !ed25519.Verify(pub, []byte(context+payload), sig) {
		return nil, badSignature
	}
	return body, nil
}

// LoadOrCreateSigningKey reads the PEM (PKCS #8) Ed25519 key at path, or
// generates one there (mode 0600) when the file does not exist. A key file
// readable by others is refused.
func LoadOrCreateSigningKey(path string) (ed25519.PrivateKey, error) {
	key, err := loadSigningKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	_, key, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate zone token signing key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode zone token signing key: %w", err)
	}
	err = writeFileExclusive(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if errors.Is(err, fs.ErrExist) {
		// Another process won the race: use its key.
		return loadSigningKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("zone token signing key: %w", err)
	}
	return key, nil
}

func loadSigningKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("zone token signing key: %w", err)
	}
	if err := checkPrivate(path); err != nil {
		return nil, fmt.Errorf("zone token signing key: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("zone token signing key %s: no PEM PRIVATE KEY block", path)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("zone token signing key %s: %w", path, err)
	}
	key, ok := parsed.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("zone token signing key %s: want an Ed25519 key, got %T", path, parsed)
	}
	return key, nil
}
