// Package zoneaccess decides which zones may open a KDS stream to the global
// and ends the streams of zones that lose that right: a zone token must
// verify (signature, expiry, zone), must not be revoked, and the zone's Zone
// resource must not say enabled: false. It owns the zone token lifecycle
// the API exposes (revocation, signing-key rotation and retirement); see
// docs/security.md#zone-tokens.
package zoneaccess

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/revocation"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Store is what the access needs of the global's store: the Zone
// resources, the revoked token ids (a meta value) and the watch that tells
// it a zone was disabled.
type Store interface {
	Get(ctx context.Context, key resource.Key) (*resource.Resource, error)
	Meta(ctx context.Context, key string) ([]byte, error)
	Apply(ctx context.Context, b storage.Batch) (*storage.BatchResult, error)
	Revision(ctx context.Context) (uint64, error)
	Watch(ctx context.Context, from uint64) (<-chan storage.Event, error)
}

// Streams is the KDS server whose live streams the access ends.
type Streams interface {
	EndStreams(match func(kds.StreamInfo) bool, cause error) int
}

// Config wires an Access. Ring, Store and Logger are required.
type Config struct {
	Ring   *auth.ZoneKeyRing
	Store  Store
	Logger hclog.Logger
	// Clock defaults to time.Now.
	Clock func() time.Time
	// Lock, set on global replicas sharing etcd, serializes revocations
	// across them: the revoked set is one meta value, read, merged and
	// written. Nil with one global.
	Lock func(ctx context.Context) (unlock func(), err error)
	// KeysChanged, set on replicas, publishes this replica's key files
	// after a rotation or retirement so the other replicas take them.
	KeysChanged func() error
	// Poll is how often a replica rereads the revocations other replicas
	// wrote; 0 (one global) never: every revocation is then this process's.
	Poll time.Duration
}

// Access decides which zones may stream. Revocations are kept in the store
// (meta key metaRevokedZoneTokens, until each token's own expiry) so they
// survive restarts; revoking a token or disabling a zone ends its live
// streams at once. It implements kds.ZoneAuthenticator and the API's
// ZoneTokenAdmin. Safe for concurrent use.
type Access struct {
	ring  *auth.ZoneKeyRing
	store Store
	log   hclog.Logger
	clock func() time.Time
	cfg   Config

	revoked *revocation.List

	mu sync.RWMutex
	// disabled are the zones WatchZones saw set to enabled: false (and not
	// back); Authenticate reads the store itself, Recheck reads this.
	disabled map[string]bool
	streams  Streams
}

// metaRevokedZoneTokens is the store meta key of the revoked zone tokens.
const metaRevokedZoneTokens = "auth/revoked-zone-tokens"

// New reads the stored revocations and returns the access.
func New(ctx context.Context, cfg Config) (*Access, error) {
	switch {
	case cfg.Ring == nil:
		return nil, errors.New("zoneaccess: Ring is required")
	case cfg.Store == nil:
		return nil, errors.New("zoneaccess: Store is required")
	case cfg.Logger == nil:
		return nil, errors.New("zoneaccess: Logger is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	revoked, err := revocation.Open(ctx, revocation.Config{Store: cfg.Store, MetaKey: metaRevokedZoneTokens,
		Remember: auth.MaxValidity, Lock: cfg.Lock, Clock: cfg.Clock})
	if err != nil {
		return nil, err
	}
	return &Access{ring: cfg.Ring, store: cfg.Store, log: cfg.Logger, clock: cfg.Clock, cfg: cfg, revoked: revoked,
		disabled: map[string]bool{}}, nil
}

// Attach gives the access the server whose streams it ends.
func (z *Access) Attach(s Streams) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.streams = s
}

// Authenticate implements kds.ZoneAuthenticator.
func (z *Access) Authenticate(zone, token string) (kds.ZoneCredential, error) {
	tokens := z.ring.Tokens()
	claims, keyRetiresAt, err := tokens.VerifyWithKey(token, zone)
	if err != nil {
		return kds.ZoneCredential{}, err
	}
	kid := claims.KeyID
	if kid == "" {
		kid = tokens.KeyID() // issued before rotation existed: the current key verified it
	}
	if z.revoked.Revoked(claims.ID) {
		return kds.ZoneCredential{}, fmt.Errorf("zone token %s was revoked", claims.ID)
	}
	if disabled, err := z.zoneDisabled(zone); err != nil {
		return kds.ZoneCredential{}, err
	} else if disabled {
		return kds.ZoneCredential{}, fmt.Errorf("zone %q is disabled (its Zone resource says enabled: false)", zone)
	}
	return kds.ZoneCredential{TokenID: claims.ID, KeyID: kid, ExpiresAt: time.Unix(claims.ExpiresAt, 0),
		KeyRetiresAt: keyRetiresAt}, nil
}

// Recheck implements kds.ZoneAuthenticator: a credential Authenticate
// admitted no longer holds once its token is revoked, its zone disabled or
// its signing key retired. It reads only memory: the server calls it under
// the lock its EndStreams takes, and each of those changes is recorded here
// before this access calls EndStreams.
func (z *Access) Recheck(zone string, cred kds.ZoneCredential) error {
	revoked := z.revoked.Revoked(cred.TokenID)
	z.mu.RLock()
	disabled := z.disabled[zone]
	z.mu.RUnlock()
	switch {
	case revoked:
		return fmt.Errorf("zone token %s was revoked", cred.TokenID)
	case disabled:
		return fmt.Errorf("zone %q is disabled (its Zone resource says enabled: false)", zone)
	case cred.KeyID != "" && !z.keyKnown(cred.KeyID):
		return fmt.Errorf("the zone token's signing key %s was retired", cred.KeyID)
	}
	return nil
}

func (z *Access) keyKnown(kid string) bool {
	for _, k := range z.ring.Keys() {
		if k.ID == kid {
			return true
		}
	}
	return false
}

func (z *Access) zoneDisabled(zone string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := z.store.Get(ctx, resource.Key{Type: "Zone", Name: zone})
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read Zone %q: %w", zone, err)
	}
	return !zoneEnabled(r), nil
}

func zoneEnabled(r *resource.Resource) bool {
	var spec struct {
		Enabled *bool `json:"enabled"`
	}
	_ = json.Unmarshal(r.Spec, &spec) // validated on write; unreadable = enabled, as absent
	return spec.Enabled == nil || *spec.Enabled
}

// Revoke revokes the zone token with id, persistently, and ends its live
// streams.
func (z *Access) Revoke(ctx context.Context, id string) (int, error) {
	if err := z.revoked.Revoke(ctx, id); err != nil {
		if errors.Is(err, revocation.ErrInvalidID) {
			return 0, fmt.Errorf("%w: %v", storage.ErrInvalid, err)
		}
		return 0, err
	}
	ended := z.endStreams(func(s kds.StreamInfo) bool { return s.TokenID == id },
		fmt.Errorf("%w: zone token %s was revoked", kds.ErrStreamRevoked, id))
	z.log.Info("zone token revoked", "id", id, "streams_ended", ended)
	return ended, nil
}

// WatchZones ends the streams of a zone whose Zone resource is set to
// enabled: false, as soon as the write commits (whoever wrote it).
//
// A watch that ends under it (an etcd store without quorum ends its watches;
// the replica then ends every stream itself) is started again from the
// current revision, and the revocations are reread meanwhile, so a token
// revoked through another replica ends its streams here too.
func (z *Access) WatchZones(ctx context.Context) error {
	for {
		err := z.watchZonesOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		z.log.Warn("zone watch ended, restarting", "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (z *Access) watchZonesOnce(ctx context.Context) error {
	rev, err := z.store.Revision(ctx)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := z.store.Watch(wctx, rev)
	if err != nil {
		return err
	}
	// Only replicas poll: with one global, every revocation is this
	// process's own (revoke), and a tick that finds nothing still wakes an
	// idle process (about a millisecond of CPU each on a small VM).
	var poll <-chan time.Time
	if z.cfg.Poll > 0 {
		t := time.NewTicker(z.cfg.Poll)
		defer t.Stop()
		poll = t.C
	}
	for {
		select {
		case <-poll:
			z.reloadRevocations(ctx)
			continue
		case ev, ok := <-events:
			if !ok {
				return errors.New("zone watch closed")
			}
			if ev.Resource == nil || ev.Resource.Type != "Zone" {
				continue
			}
			name := ev.Resource.Name
			disabled := ev.Kind == storage.EventPut && !zoneEnabled(ev.Resource)
			z.mu.Lock()
			if disabled {
				z.disabled[name] = true
			} else {
				delete(z.disabled, name)
			}
			z.mu.Unlock()
			if !disabled {
				continue
			}
			n := z.endStreams(func(s kds.StreamInfo) bool { return s.Zone == name },
				fmt.Errorf("%w: zone %q was disabled (enabled: false)", kds.ErrStreamRevoked, name))
			z.log.Info("zone disabled", "zone", name, "streams_ended", n)
		}
	}
}

// reloadRevocations takes revocations written by another replica (HA) and
// ends their streams here.
func (z *Access) reloadRevocations(ctx context.Context) {
	fresh, err := z.revoked.Reload(ctx)
	if err != nil {
		return // the store is away; the replica's health check handles that
	}
	for _, id := range fresh {
		n := z.endStreams(func(s kds.StreamInfo) bool { return s.TokenID == id },
			fmt.Errorf("%w: zone token %s was revoked", kds.ErrStreamRevoked, id))
		z.log.Info("zone token revoked on another replica", "id", id, "streams_ended", n)
	}
}

// Keys lists the zone token signing keys.
func (z *Access) Keys() []auth.KeyInfo { return z.ring.Keys() }

// RotateKey makes a new signing key; tokens of the old one keep working for
// overlap (their streams end when it retires).
func (z *Access) RotateKey(overlap time.Duration) (newID, oldID string, retireAt time.Time, err error) {
	newID, oldID, retireAt, err = z.ring.Rotate(overlap)
	if err != nil {
		return "", "", time.Time{}, err
	}
	// Streams admitted while the old key was current have no key deadline:
	// end them when it retires (streams admitted later get it from their
	// credential).
	time.AfterFunc(retireAt.Sub(z.clock()), func() {
		n := z.endStreams(func(s kds.StreamInfo) bool { return s.KeyID == oldID },
			fmt.Errorf("%w: signing key %s retired at the end of its rotation overlap", kds.ErrStreamRevoked, oldID))
		z.log.Info("zone token signing key retired", "kid", oldID, "streams_ended", n)
	})
	z.log.Info("zone token signing key rotated", "new", newID, "previous", oldID, "previous_retires", retireAt.UTC())
	if err := z.publishKeys(); err != nil {
		return "", "", time.Time{}, err
	}
	return newID, oldID, retireAt, nil
}

// RetireKey retires a previous signing key now and ends the streams
// authenticated with its tokens.
func (z *Access) RetireKey(kid string) (int, error) {
	if err := z.ring.Retire(kid); err != nil {
		return 0, err
	}
	ended := z.endStreams(func(s kds.StreamInfo) bool { return s.KeyID == kid },
		fmt.Errorf("%w: signing key %s was retired", kds.ErrStreamRevoked, kid))
	z.log.Info("zone token signing key retired", "kid", kid, "streams_ended", ended)
	if err := z.publishKeys(); err != nil {
		return ended, err
	}
	return ended, nil
}

func (z *Access) publishKeys() error {
	if z.cfg.KeysChanged == nil {
		return nil
	}
	if err := z.cfg.KeysChanged(); err != nil {
		return fmt.Errorf("share the signing keys with the other replicas: %w", err)
	}
	return nil
}

// KeysReloaded takes key files another replica wrote: the ring rereads
// them, and live streams admitted under a key that is gone end.
func (z *Access) KeysReloaded() error {
	if err := z.ring.Reload(); err != nil {
		return err
	}
	known := map[string]bool{}
	for _, k := range z.ring.Keys() {
		known[k.ID] = true
	}
	n := z.endStreams(func(s kds.StreamInfo) bool { return s.KeyID != "" && !known[s.KeyID] },
		fmt.Errorf("%w: its signing key was retired on another replica", kds.ErrStreamRevoked))
	z.log.Info("zone token signing keys reloaded from another replica", "keys", len(known), "streams_ended", n)
	return nil
}

// endStreams ends the matching live streams of the attached server.
func (z *Access) endStreams(match func(kds.StreamInfo) bool, cause error) int {
	z.mu.RLock()
	streams := z.streams
	z.mu.RUnlock()
	if streams == nil {
		return 0
	}
	return streams.EndStreams(match, cause)
}
