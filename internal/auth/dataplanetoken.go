package auth

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"time"
)

// Dataplane tokens let a workload's agent (meridian-dp) join a zone as one
// Dataplane (docs/dataplane.md#joining): signed by the zone that serves the
// Dataplane, naming its mesh and either its name (and namespace) or a tag
// set every Dataplane it registers must carry, as Kuma's dataplane tokens.

// DataplaneSigningKeyFileName is the zone's dataplane token key in its data dir.
const DataplaneSigningKeyFileName = "dataplane-token-signing.key"

const (
	dataplaneTokenVersion   = 1
	dataplaneSigningContext = "meridian-dataplane-token.v1."
	maxDataplaneTokenTags   = 32
)

// Errors of dataplane token handling.
var (
	ErrDataplaneTokenMalformed    = errors.New("malformed dataplane token")
	ErrDataplaneTokenBadSignature = errors.New("dataplane token signature is invalid")
	ErrDataplaneTokenExpired      = errors.New("dataplane token expired")
	ErrDataplaneTokenNotYetValid  = errors.New("dataplane token not yet valid")
	// ErrInvalidDataplaneTokenRequest: the request to issue a token is invalid.
	ErrInvalidDataplaneTokenRequest = errors.New("invalid dataplane token request")
)

// DataplaneClaims are the signed content of a dataplane token. Times are
// Unix seconds. Name empty: the token admits any Dataplane of the mesh
// (and namespace) carrying every tag of Tags.
type DataplaneClaims struct {
	Version   int               `json:"v"`
	Mesh      string            `json:"mesh"`
	Name      string            `json:"name,omitempty"`
	Namespace string            `json:"namespace,omitempty"`
	Tags      map[string]string `json:"tags,omitempty"`
	IssuedAt  int64             `json:"iat"`
	ExpiresAt int64             `json:"exp"`
	ID        string            `json:"jti"`
}

// DataplaneTokenRequest is what POST /tokens/dataplane asks for.
type DataplaneTokenRequest struct {
	Mesh      string
	Name      string
	Namespace string
	Tags      map[string]string
	ValidFor  time.Duration
}

// DataplaneTokens issues and verifies dataplane tokens. Immutable after
// construction; safe for concurrent use.
type DataplaneTokens struct {
	signer
}

// NewDataplaneTokens builds an issuer/verifier around key.
func NewDataplaneTokens(key ed25519.PrivateKey, clock Clock) (*DataplaneTokens, error) {
	s, err := newSigner("dataplane tokens", dataplaneSigningContext, key, clock)
	if err != nil {
		return nil, err
	}
	return &DataplaneTokens{s}, nil
}

// LoadOrCreateDataplaneTokens loads (or creates, 0600) the signing key in dataDir.
func LoadOrCreateDataplaneTokens(dataDir string, clock Clock) (*DataplaneTokens, error) {
	key, err := loadKindKey("dataplane tokens", dataDir, DataplaneSigningKeyFileName)
	if err != nil {
		return nil, err
	}
	return NewDataplaneTokens(key, clock)
}

// Issue signs a token for req.
func (t *DataplaneTokens) Issue(req DataplaneTokenRequest) (string, DataplaneClaims, error) {
	if err := checkDataplaneTokenRequest(req); err != nil {
		return "", DataplaneClaims{}, err
	}
	id, err := t.newID()
	if err != nil {
		return "", DataplaneClaims{}, err
	}
	now := t.clock.Now()
	claims := DataplaneClaims{Version: dataplaneTokenVersion, Mesh: req.Mesh, Name: req.Name, Namespace: req.Namespace,
		Tags: maps.Clone(req.Tags), IssuedAt: now.Unix(), ExpiresAt: now.Add(req.ValidFor).Unix(), ID: id}
	token, err := t.sign(claims)
	if err != nil {
		return "", DataplaneClaims{}, err
	}
	return token, claims, nil
}

func checkDataplaneTokenRequest(req DataplaneTokenRequest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidDataplaneTokenRequest, fmt.Sprintf(format, args...))
	}
	switch {
	case req.Mesh == "" || len(req.Mesh) > maxUserTokenField:
		return bad("mesh: must be a mesh name")
	case len(req.Name) > maxUserTokenField || !printableName(req.Name):
		return bad("name: must be a Dataplane name")
	case len(req.Namespace) > maxUserTokenField || !printableName(req.Namespace):
		return bad("namespace: must be a namespace")
	case req.Name == "" && len(req.Tags) == 0:
		return bad("name: give a Dataplane name, or tags every Dataplane the token registers must carry")
	case len(req.Tags) > maxDataplaneTokenTags:
		return bad("tags: at most %d", maxDataplaneTokenTags)
	case req.ValidFor <= 0 || req.ValidFor > MaxValidity:
		return bad("validFor: must be positive and at most %s", MaxValidity)
	}
	for k, v := range req.Tags {
		if k == "" || v == "" || len(k)+len(v) > maxUserTokenField || !printableName(k) || !printableName(v) {
			return bad("tags: %q=%q: keys and values must be short, printable and not empty", k, v)
		}
	}
	return nil
}

// Verify checks a token's signature and validity window. The error wraps
// one of the ErrDataplaneToken* errors and never quotes the token.
func (t *DataplaneTokens) Verify(token string) (DataplaneClaims, error) {
	var c DataplaneClaims
	if err := t.open(token, &c, ErrDataplaneTokenMalformed, ErrDataplaneTokenBadSignature); err != nil {
		return DataplaneClaims{}, err
	}
	switch {
	case c.Version != dataplaneTokenVersion:
		return DataplaneClaims{}, fmt.Errorf("%w: unsupported version %d", ErrDataplaneTokenMalformed, c.Version)
	case c.Mesh == "" || (c.Name == "" && len(c.Tags) == 0) || c.ExpiresAt == 0 || c.IssuedAt == 0 || c.ID == "":
		return DataplaneClaims{}, fmt.Errorf("%w: mesh, name or tags, iat, exp and jti are required", ErrDataplaneTokenMalformed)
	}
	if err := t.checkWindow(c.IssuedAt, c.ExpiresAt, ErrDataplaneTokenExpired, ErrDataplaneTokenNotYetValid); err != nil {
		return DataplaneClaims{}, err
	}
	return c, nil
}

// Admits reports why claims do not admit the Dataplane mesh/namespace/name
// with inbound tags (every tag of the token on every inbound), or "" when
// they do.
func (c DataplaneClaims) Admits(mesh, namespace, name string, inboundTags []map[string]string) string {
	switch {
	case c.Mesh != mesh:
		return fmt.Sprintf("the token is for mesh %q, not %q", c.Mesh, mesh)
	case c.Namespace != namespace:
		return fmt.Sprintf("the token is for namespace %q, not %q", c.Namespace, namespace)
	case c.Name != "" && c.Name != name:
		return fmt.Sprintf("the token is for Dataplane %q, not %q", c.Name, name)
	}
	for k, v := range c.Tags {
		if len(inboundTags) == 0 {
			return fmt.Sprintf("the token requires tag %s=%s and the Dataplane has no inbound", k, v)
		}
		for _, tags := range inboundTags {
			if tags[k] != v {
				return fmt.Sprintf("the token requires tag %s=%s on every inbound", k, v)
			}
		}
	}
	return ""
}
