package revocation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meridian-mesh/meridian/internal/auth"
)

// ErrRevoked is wrapped by Verify for a token whose id was revoked.
var ErrRevoked = errors.New("token was revoked")

// MetaUserTokens is the store meta key of the revoked user tokens.
const MetaUserTokens = "auth/revoked-user-tokens"

// UserTokens are the API's user tokens with revocation: a token verifies
// when its signature and validity window do and its id is not revoked.
type UserTokens struct {
	tokens  *auth.UserTokens
	revoked *List
}

// NewUserTokens adds the revocation list to tokens.
func NewUserTokens(tokens *auth.UserTokens, revoked *List) *UserTokens {
	return &UserTokens{tokens: tokens, revoked: revoked}
}

// Verify checks a token and its revocation.
func (u *UserTokens) Verify(token string) (auth.UserClaims, error) {
	c, err := u.tokens.Verify(token)
	if err != nil {
		return auth.UserClaims{}, err
	}
	if u.revoked.Revoked(c.ID) {
		return auth.UserClaims{}, fmt.Errorf("%w: user token %s", ErrRevoked, c.ID)
	}
	return c, nil
}

// Issue signs a new token.
func (u *UserTokens) Issue(req auth.UserTokenRequest) (string, auth.UserClaims, error) {
	return u.tokens.Issue(req)
}

// Revoke revokes the user token with id; from then on it authenticates
// nobody, on every replica that shares the store once it rereads (Follow).
func (u *UserTokens) Revoke(ctx context.Context, id string) error { return u.revoked.Revoke(ctx, id) }

// Follow rereads the list every period until ctx ends, for global replicas
// whose peers revoke tokens too.
func (l *List) Follow(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_, _ = l.Reload(ctx) // a store that is away: the replica's health check handles it
		}
	}
}
