// Package revocation keeps the ids of revoked tokens: zone tokens, user
// tokens and dataplane tokens each have a List. A List is persisted as one
// meta value of the store (so it survives restarts and is shared by global
// replicas on one etcd) and held in memory, where checks read it without
// I/O. An id is remembered until the longest validity a token can have has
// passed, after which the token has expired anyway. See
// docs/security.md#user-tokens and #zone-tokens.
package revocation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/storage"
)

// Store is what a List needs of the store.
type Store interface {
	Meta(ctx context.Context, key string) ([]byte, error)
	Apply(ctx context.Context, b storage.Batch) (*storage.BatchResult, error)
}

// MaxIDLength bounds a token id.
const MaxIDLength = 64

// ErrInvalidID: an id that no token carries (empty or too long).
var ErrInvalidID = errors.New("invalid token id")

// Config opens a List. Store, MetaKey and Remember are required.
type Config struct {
	Store Store
	// MetaKey is the store meta key holding the list.
	MetaKey string
	// Remember is how long a revoked id is kept: the longest validity of
	// the kind of token.
	Remember time.Duration
	// Lock, set on global replicas sharing etcd, serializes revocations
	// across them (the list is read, merged and written).
	Lock func(ctx context.Context) (unlock func(), err error)
	// Clock defaults to time.Now.
	Clock func() time.Time
}

// List is a persisted set of revoked token ids. Safe for concurrent use.
type List struct {
	cfg Config

	mu      sync.RWMutex
	revoked map[string]int64 // id → when it may be forgotten (Unix s)
}

// Open reads the stored list.
func Open(ctx context.Context, cfg Config) (*List, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("revocation: Store is required")
	case cfg.MetaKey == "":
		return nil, errors.New("revocation: MetaKey is required")
	case cfg.Remember <= 0:
		return nil, errors.New("revocation: Remember must be positive")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	l := &List{cfg: cfg}
	stored, err := l.read(ctx)
	if err != nil {
		return nil, err
	}
	l.revoked = stored
	return l, nil
}

// Revoked reports whether id was revoked. It reads memory only.
func (l *List) Revoked(id string) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	_, ok := l.revoked[id]
	return ok
}

// Revoke stores id as revoked; once it returns, Revoked(id) holds here.
func (l *List) Revoke(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("%w: a token id is 1 to %d letters, digits, '-' or '_'", ErrInvalidID, MaxIDLength)
	}
	if l.cfg.Lock != nil {
		unlock, err := l.cfg.Lock(ctx)
		if err != nil {
			return fmt.Errorf("revoke token %s: %w", id, err)
		}
		defer unlock()
	}
	stored, err := l.read(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Clock().Unix()
	next := make(map[string]int64, len(l.revoked)+len(stored)+1)
	for _, m := range []map[string]int64{stored, l.revoked} {
		for k, until := range m {
			if until > now { // an expired token needs no revocation
				next[k] = until
			}
		}
	}
	next[id] = l.cfg.Clock().Add(l.cfg.Remember).Unix()
	raw, err := json.Marshal(next)
	if err == nil {
		_, err = l.cfg.Store.Apply(ctx, storage.Batch{Meta: map[string][]byte{l.cfg.MetaKey: raw}})
	}
	if err != nil {
		return fmt.Errorf("persist revocation of token %s: %w", id, err)
	}
	l.revoked = next
	return nil
}

// Reload takes the revocations another replica stored and returns the ids
// new to this List.
func (l *List) Reload(ctx context.Context) ([]string, error) {
	stored, err := l.read(ctx)
	if err != nil {
		return nil, err
	}
	var fresh []string
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, until := range stored {
		if _, ok := l.revoked[id]; !ok {
			l.revoked[id] = until
			fresh = append(fresh, id)
		}
	}
	return fresh, nil
}

func validID(id string) bool {
	if id == "" || len(id) > MaxIDLength {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (l *List) read(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	raw, err := l.cfg.Store.Meta(ctx, l.cfg.MetaKey)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return out, nil
	case err != nil:
		return nil, fmt.Errorf("read revoked tokens: %w", err)
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("read revoked tokens: %w", err)
	}
	return out, nil
}
