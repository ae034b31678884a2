package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// User tokens authenticate REST API callers (docs/api.md), as Kuma's user tokens
// do: signed by the control plane that serves the API, carrying a name,
// groups and, beyond Kuma, an optional list of meshes the token is confined
// to.

// Groups a user token may carry.
const (
	GroupAdmin  = "mesh-system:admin"
	GroupViewer = "mesh-system:viewer"
)

// File names inside a control plane's data dir.
const (
	UserSigningKeyFileName = "user-token-signing.key"
	// AdminTokenFileName holds an admin user token written (0600) at first
	// start, so the operator of the machine can reach the API remotely.
	AdminTokenFileName = "admin-token"
)

const (
	userTokenVersion   = 1
	userSigningContext = "meridian-user-token.v1."
	// maxUserTokenField bounds names and mesh names in a token.
	maxUserTokenField  = 253
	maxUserTokenMeshes = 100
)

// Errors of user token handling.
var (
	ErrUserTokenMalformed    = errors.New("malformed user token")
	ErrUserTokenBadSignature = errors.New("user token signature is invalid")
	ErrUserTokenExpired      = errors.New("user token expired")
	ErrUserTokenNotYetValid  = errors.New("user token not yet valid")
	// ErrInvalidUserTokenRequest: the request to issue a token is invalid.
	ErrInvalidUserTokenRequest = errors.New("invalid user token request")
)

// UserClaims are the signed content of a user token. Times are Unix seconds.
type UserClaims struct {
	Version   int      `json:"v"`
	Name      string   `json:"name"`
	Groups    []string `json:"groups"`
	Meshes    []string `json:"meshes,omitempty"`
	IssuedAt  int64    `json:"iat"`
	ExpiresAt int64    `json:"exp"`
	ID        string   `json:"jti"`
}

// HasGroup reports whether the token carries group g.
func (c UserClaims) HasGroup(g string) bool { return slices.Contains(c.Groups, g) }

// UserTokenRequest is what POST /tokens/user asks for.
type UserTokenRequest struct {
	Name     string
	Groups   []string
	Meshes   []string
	ValidFor time.Duration
}

// UserTokens issues and verifies user tokens. Immutable after construction;
// safe for concurrent use.
type UserTokens struct {
	key   ed25519.PrivateKey
	pub   ed25519.PublicKey
	clock Clock
	skew  time.Duration
}

// NewUserTokens builds an issuer/verifier around key.
func NewUserTokens(key ed25519.PrivateKey, clock Clock) (*UserTokens, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("user tokens: signing key must be an Ed25519 private key of %d bytes, got %d", ed25519.PrivateKeySize, len(key))
	}
	if clock == nil {
		clock = realClock{}
	}
	return &UserTokens{key: key, pub: key.Public().(ed25519.PublicKey), clock: clock, skew: DefaultClockSkew}, nil
}

// LoadOrCreateUserTokens loads (or creates, 0600) the user token signing key
// in dataDir.
func LoadOrCreateUserTokens(dataDir string, clock Clock) (*UserTokens, error) {
	key, err := LoadOrCreateSigningKey(filepath.Join(dataDir, UserSigningKeyFileName))
	if err != nil {
		return nil, fmt.Errorf("user tokens: %w", err)
	}
	return NewUserTokens(key, clock)
}

// Issue signs a token for req.
func (t *UserTokens) Issue(req UserTokenRequest) (string, UserClaims, error) {
	if err := checkUserTokenRequest(req); err != nil {
		return "", UserClaims{}, err
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", UserClaims{}, fmt.Errorf("issue user token: %w", err)
	}
	now := t.clock.Now()
	claims := UserClaims{Version: userTokenVersion, Name: req.Name, Groups: slices.Clone(req.Groups),
		Meshes: slices.Clone(req.Meshes), IssuedAt: now.Unix(), ExpiresAt: now.Add(req.ValidFor).Unix(),
		ID: hex.EncodeToString(id[:])}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", UserClaims{}, fmt.Errorf("issue user token: %w", err)
	}
	return signToken(t.key, userSigningContext, body), claims, nil
}

func checkUserTokenRequest(req UserTokenRequest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidUserTokenRequest, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.TrimSpace(req.Name) == "":
		return bad("name: must be set")
	case len(req.Name) > maxUserTokenField:
		return bad("name: at most %d characters", maxUserTokenField)
	case len(req.Groups) == 0:
		return bad("groups: give at least one of %s, %s", GroupAdmin, GroupViewer)
	case req.ValidFor <= 0 || req.ValidFor > MaxValidity:
		return bad("validFor: must be positive and at most %s", MaxValidity)
	case len(req.Meshes) > maxUserTokenMeshes:
		return bad("meshes: at most %d", maxUserTokenMeshes)
	}
	for i, g := range req.Groups {
		if g != GroupAdmin && g != GroupViewer {
			return bad("groups[%d]: unknown group %q, want %s or %s", i, g, GroupAdmin, GroupViewer)
		}
	}
	for i, m := range req.Meshes {
		if m == "" || len(m) > maxUserTokenField {
			return bad("meshes[%d]: must be a mesh name", i)
		}
	}
	return nil
}

// Verify checks a token's signature and validity window. The error wraps
// one of the ErrUserToken* errors and never quotes the token.
func (t *UserTokens) Verify(token string) (UserClaims, error) {
	body, err := openToken(t.pub, userSigningContext, token, ErrUserTokenMalformed, ErrUserTokenBadSignature)
	if err != nil {
		return UserClaims{}, err
	}
	var c UserClaims
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return UserClaims{}, fmt.Errorf("%w: claims: %v", ErrUserTokenMalformed, err)
	}
	now := t.clock.Now()
	switch {
	case c.Version != userTokenVersion:
		return UserClaims{}, fmt.Errorf("%w: unsupported version %d", ErrUserTokenMalformed, c.Version)
	case c.Name == "" || c.ExpiresAt == 0 || c.IssuedAt == 0 || len(c.Groups) == 0:
		return UserClaims{}, fmt.Errorf("%w: name, groups, iat and exp are required", ErrUserTokenMalformed)
	case now.Unix() >= c.ExpiresAt:
		return UserClaims{}, fmt.Errorf("%w: expired at %s", ErrUserTokenExpired, time.Unix(c.ExpiresAt, 0).UTC().Format(time.RFC3339))
	case now.Add(t.skew).Unix() < c.IssuedAt:
		return UserClaims{}, fmt.Errorf("%w: issued at %s", ErrUserTokenNotYetValid, time.Unix(c.IssuedAt, 0).UTC().Format(time.RFC3339))
	}
	return c, nil
}

// EnsureAdminToken writes an admin token to dataDir/admin-token (0600) when
// the file does not exist yet, and returns the file's path. An existing file
// is left alone (delete it and restart to get a new one).
func (t *UserTokens) EnsureAdminToken(dataDir string) (string, bool, error) {
	path := filepath.Join(dataDir, AdminTokenFileName)
	if _, err := os.Stat(path); err == nil {
		return path, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	token, _, err := t.Issue(UserTokenRequest{Name: "admin", Groups: []string{GroupAdmin}, ValidFor: MaxValidity})
	if err != nil {
		return "", false, err
	}
	err = writeFileExclusive(path, []byte(token+"\n"))
	if errors.Is(err, fs.ErrExist) {
		return path, false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	return path, true, nil
}
