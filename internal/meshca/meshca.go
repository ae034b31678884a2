// Package meshca runs the mesh CA (docs/security.md#mesh-ca). A Mesh whose
// mtls.enabledBackend names a builtin backend gets a root CA, created by the
// global (or by a standalone zone, its own root) and kept sealed in its
// store (resource MeshCA, never served or synced). Each zone makes its own
// key for an intermediate (ZoneCA, kept in the zone), sends the global a
// CSR (ZoneCertificateRequest, over KDS) and receives its intermediate
// signed by the root (ZoneCertificate, sent to that zone only). The zone
// signs its workloads' certificates with it. No key leaves the store it
// was made in.
package meshca

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Validities of the CA's certificates.
const (
	RootValidity         = 10 * 365 * 24 * time.Hour
	IntermediateValidity = 365 * 24 * time.Hour
	// DefaultLeafValidity is a workload certificate's life when the
	// backend's dpCert.rotation.expiration does not say.
	DefaultLeafValidity = 24 * time.Hour
)

// Backend is a mesh's enabled CA backend.
type Backend struct {
	Name string
	// Builtin: the control plane's own CA (the only kind issued here).
	Builtin bool
	// LeafValidity is dpCert.rotation.expiration.
	LeafValidity time.Duration
}

// EnabledBackend reads a Mesh's mtls: its enabled backend, ok false when
// mTLS is off.
func EnabledBackend(mesh *resource.Resource) (Backend, bool) {
	var spec struct {
		MTLS *struct {
			EnabledBackend string `json:"enabledBackend"`
			Backends       []struct {
				Name   string `json:"name"`
				Type   string `json:"type"`
				DPCert *struct {
					Rotation *struct {
						Expiration string `json:"expiration"`
					} `json:"rotation"`
				} `json:"dpCert"`
			} `json:"backends"`
		} `json:"mtls"`
	}
	if err := json.Unmarshal(mesh.Spec, &spec); err != nil || spec.MTLS == nil || spec.MTLS.EnabledBackend == "" {
		return Backend{}, false
	}
	for _, b := range spec.MTLS.Backends {
		if b.Name != spec.MTLS.EnabledBackend {
			continue
		}
		out := Backend{Name: b.Name, Builtin: b.Type == "" || b.Type == "builtin", LeafValidity: DefaultLeafValidity}
		if b.DPCert != nil && b.DPCert.Rotation != nil {
			if d, err := time.ParseDuration(b.DPCert.Rotation.Expiration); err == nil && d > 0 {
				out.LeafValidity = d
			}
		}
		return out, true
	}
	return Backend{}, false
}

// Store is what the controllers need of the store.
type Store interface {
	Get(ctx context.Context, key resource.Key) (*resource.Resource, error)
	List(ctx context.Context, opts storage.ListOptions) (*storage.ListResult, error)
	Create(ctx context.Context, r *resource.Resource) (*resource.Resource, error)
	Put(ctx context.Context, r *resource.Resource) (*resource.Resource, storage.Outcome, error)
	Revision(ctx context.Context) (uint64, error)
	Watch(ctx context.Context, from uint64) (<-chan storage.Event, error)
}

// Config wires a controller. Store is required.
type Config struct {
	Store  Store
	Logger hclog.Logger
	// Rand and Now are the randomness and the clock keys and certificates
	// are made with.
	Rand io.Reader
	Now  func() time.Time
	// Resync is how often the controller reconciles without a change
	// (renewals); 0 means an hour.
	Resync time.Duration
}

func (c *Config) check() error {
	if c.Store == nil {
		return errors.New("meshca: Store is required")
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Rand == nil {
		return errors.New("meshca: Rand is required")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Resync <= 0 {
		c.Resync = time.Hour
	}
	return nil
}

// follow calls reconcile at start, after every change of one of types
// (settled for a few milliseconds) and every resync, until ctx ends.
func follow(ctx context.Context, cfg Config, types []string, reconcile func(context.Context) error) error {
	wanted := map[string]bool{}
	for _, t := range types {
		wanted[t] = true
	}
	for ctx.Err() == nil {
		rev, err := cfg.Store.Revision(ctx)
		if err != nil {
			return err
		}
		if err := reconcile(ctx); err != nil {
			cfg.Logger.Warn("mesh CA reconcile failed; retrying", "error", err)
		}
		events, err := cfg.Store.Watch(ctx, rev)
		if err != nil {
			return err
		}
		if !drain(ctx, cfg, events, wanted, reconcile) {
			continue // the watch ended (compaction): start over
		}
	}
	return nil
}

// drain reconciles on changes until the watch ends (false) or ctx does.
func drain(ctx context.Context, cfg Config, events <-chan storage.Event, wanted map[string]bool, reconcile func(context.Context) error) bool {
	resync := time.NewTicker(cfg.Resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-resync.C:
		case ev, ok := <-events:
			if !ok {
				return false
			}
			if ev.Resource == nil || !wanted[ev.Resource.Type] {
				continue
			}
			settle(events, 5*time.Millisecond)
		}
		if err := reconcile(ctx); err != nil {
			cfg.Logger.Warn("mesh CA reconcile failed; retrying", "error", err)
		}
	}
}

// settle swallows the events of a burst.
func settle(events <-chan storage.Event, quiet time.Duration) {
	t := time.NewTimer(quiet)
	defer t.Stop()
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
			t.Reset(quiet)
		case <-t.C:
			return
		}
	}
}

// listAll lists every resource of a type (every mesh for mesh-scoped ones).
func listAll(ctx context.Context, s Store, typ string) ([]*resource.Resource, error) {
	res, err := s.List(ctx, storage.ListOptions{Type: typ})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", typ, err)
	}
	return res.Items, nil
}

func specOf[T any](r *resource.Resource) (T, error) {
	var v T
	err := json.Unmarshal(r.Spec, &v)
	return v, err
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
