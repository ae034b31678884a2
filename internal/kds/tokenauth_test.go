package kds

import (
	"time"

	"github.com/meridian-mesh/meridian/internal/auth"
)

// tokenAuth adapts auth.ZoneTokens to ZoneAuthenticator for tests (the
// global's real one, in internal/controlplane, adds revocation and Zone
// enabled checks).
type tokenAuth struct{ t *auth.ZoneTokens }

func (a tokenAuth) Authenticate(zone, token string) (ZoneCredential, error) {
	c, err := a.t.Verify(token, zone)
	if err != nil {
		return ZoneCredential{}, err
	}
	return ZoneCredential{TokenID: c.ID, KeyID: c.KeyID, ExpiresAt: time.Unix(c.ExpiresAt, 0)}, nil
}

// Recheck has nothing to withdraw: tokenAuth knows no revocations.
func (a tokenAuth) Recheck(string, ZoneCredential) error { return nil }
