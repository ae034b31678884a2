package auth

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
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

// AdminTokenValidity is how long the generated admin token is valid; a
// control plane writes a new one at start once it has expired
// (docs/security.md#user-tokens).
const AdminTokenValidity = 30 * 24 * time.Hour

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
	signer
}

// NewUserTokens builds an issuer/verifier around key.
func NewUserTokens(key ed25519.PrivateKey, clock Clock) (*UserTokens, error) {
	s, err := newSigner("user tokens", userSigningContext, key, clock)
	if err != nil {
		return nil, err
	}
	return &UserTokens{s}, nil
}

// LoadOrCreateUserTokens loads (or creates, 0600) the user token signing key
// in dataDir.
func LoadOrCreateUserTokens(dataDir string, clock Clock) (*UserTokens, error) {
	key, err := loadKindKey("user tokens", dataDir, UserSigningKeyFileName)
	if err != nil {
		return nil, err
	}
	return NewUserTokens(key, clock)
}

// Issue signs a token for req.
func (t *UserTokens) Issue(req UserTokenRequest) (string, UserClaims, error) {
	if err := checkUserTokenRequest(req); err != nil {
		return "", UserClaims{}, err
	}
	id, err := t.newID()
	if err != nil {
		return "", UserClaims{}, err
	}
	now := t.clock.Now()
	claims := UserClaims{Version: userTokenVersion, Name: req.Name, Groups: slices.Clone(req.Groups),
		Meshes: slices.Clone(req.Meshes), IssuedAt: now.Unix(), ExpiresAt: now.Add(req.ValidFor).Unix(), ID: id}
	token, err := t.sign(claims)
	if err != nil {
		return "", UserClaims{}, err
	}
	return token, claims, nil
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
	case !printableName(req.Name):
		return bad("name: control and bidirectional-formatting characters are not allowed (names appear in logs and the console)")
	case req.Meshes != nil && len(req.Meshes) == 0:
		return bad("meshes: an empty list confines the token to no mesh; omit meshes for a token of every mesh")
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

// printableName refuses what would let a name rewrite a log line or a
// page: control characters and Unicode's bidirectional formatting
// characters, and invalid UTF-8.
func printableName(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return false
		}
	}
	return true
}

// Verify checks a token's signature and validity window. The error wraps
// one of the ErrUserToken* errors and never quotes the token.
func (t *UserTokens) Verify(token string) (UserClaims, error) {
	var c UserClaims
	if err := t.open(token, &c, ErrUserTokenMalformed, ErrUserTokenBadSignature); err != nil {
		return UserClaims{}, err
	}
	switch {
	case c.Version != userTokenVersion:
		return UserClaims{}, fmt.Errorf("%w: unsupported version %d", ErrUserTokenMalformed, c.Version)
	case c.Name == "" || c.ExpiresAt == 0 || c.IssuedAt == 0 || len(c.Groups) == 0:
		return UserClaims{}, fmt.Errorf("%w: name, groups, iat and exp are required", ErrUserTokenMalformed)
	}
	if err := t.checkWindow(c.IssuedAt, c.ExpiresAt, ErrUserTokenExpired, ErrUserTokenNotYetValid); err != nil {
		return UserClaims{}, err
	}
	return c, nil
}

// EnsureAdminToken makes dataDir/admin-token (0600) hold a valid admin
// token: it writes one (valid AdminTokenValidity) when the file does not
// exist, or when the token in it no longer verifies (expired, or signed by
// a user-token key that was rotated). It returns the file's path and the
// claims of a token it wrote (nil when the file was left alone). A file
// readable by group or others is refused.
func (t *UserTokens) EnsureAdminToken(dataDir string) (string, *UserClaims, error) {
	path := filepath.Join(dataDir, AdminTokenFileName)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := checkPrivate(path); err != nil {
			return "", nil, fmt.Errorf("admin token: %w", err)
		}
		if _, err := t.Verify(strings.TrimSpace(string(b))); err == nil {
			return path, nil, nil
		}
	case !errors.Is(err, fs.ErrNotExist):
		return "", nil, fmt.Errorf("admin token: %w", err)
	}
	token, claims, err := t.Issue(UserTokenRequest{Name: "admin", Groups: []string{GroupAdmin}, ValidFor: AdminTokenValidity})
	if err != nil {
		return "", nil, err
	}
	if err := writeFileReplace(path, []byte(token+"\n")); err != nil {
		return "", nil, fmt.Errorf("admin token: %w", err)
	}
	return path, &claims, nil
}
