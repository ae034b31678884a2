package meshca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/ca"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Zone is a zone's side of the mesh CA: per mesh with mTLS, its own key
// and the intermediate the global signed for it (a standalone zone signs
// its own with its own root). It issues the workloads' certificates.
type Zone struct {
	cfg        Config
	zone       string
	standalone bool

	mu     sync.Mutex
	meshes map[string]*zoneMesh
	next   chan struct{}
}

// zoneMesh is one mesh's CA state in the zone.
type zoneMesh struct {
	backend   Backend
	authority *ca.Authority // nil until the intermediate arrived
	bundle    []byte        // the root, PEM
	problem   string        // why there is no authority yet
}

// ZoneConfig wires a Zone.
type ZoneConfig struct {
	Config
	Zone string
	// Standalone: no global; the zone is its own root.
	Standalone bool
}

// NewZone checks cfg.
func NewZone(cfg ZoneConfig) (*Zone, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Zone == "" {
		return nil, errors.New("meshca: Zone is required")
	}
	return &Zone{cfg: cfg.Config, zone: cfg.Zone, standalone: cfg.Standalone, meshes: map[string]*zoneMesh{}, next: make(chan struct{})}, nil
}

// Run reconciles until ctx ends.
func (z *Zone) Run(ctx context.Context) error {
	return follow(ctx, z.cfg, []string{"Mesh", "MeshCA", "ZoneCA", "ZoneCertificate"}, z.reconcile)
}

// MeshTLS is a mesh's mTLS state as workloads see it.
type MeshTLS struct {
	// Enabled: the mesh has mTLS; its workloads need certificates.
	Enabled bool `json:"enabled"`
	// Ready: the zone can issue them (its intermediate arrived).
	Ready bool `json:"ready"`
	// Problem says why not, when enabled and not ready.
	Problem      string        `json:"problem,omitempty"`
	LeafValidity time.Duration `json:"-"`
}

// MTLS is mesh's mTLS state.
func (z *Zone) MTLS(mesh string) MeshTLS {
	z.mu.Lock()
	defer z.mu.Unlock()
	m := z.meshes[mesh]
	if m == nil {
		return MeshTLS{}
	}
	return MeshTLS{Enabled: true, Ready: m.authority != nil, Problem: m.problem, LeafValidity: m.backend.LeafValidity}
}

// Changed returns a channel closed at the next change of any mesh's state.
func (z *Zone) Changed() <-chan struct{} {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.next
}

// ErrNotReady: the mesh has no mTLS, or the zone cannot issue yet.
var ErrNotReady = errors.New("mesh CA not ready")

// Issue signs a workload certificate for csr in mesh; it returns the
// chain (leaf first) and the trust bundle, PEM.
func (z *Zone) Issue(mesh string, csr *x509.CertificateRequest, leaf ca.Leaf) (chain, bundle []byte, expires time.Time, err error) {
	z.mu.Lock()
	m := z.meshes[mesh]
	z.mu.Unlock()
	if m == nil {
		return nil, nil, time.Time{}, fmt.Errorf("%w: mesh %s has no mTLS", ErrNotReady, mesh)
	}
	if m.authority == nil {
		return nil, nil, time.Time{}, fmt.Errorf("%w: mesh %s: %s", ErrNotReady, mesh, m.problem)
	}
	certs, err := m.authority.IssueLeaf(csr, leaf, m.backend.LeafValidity)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	return ca.EncodeCerts(certs...), m.bundle, certs[0].NotAfter, nil
}

func (z *Zone) reconcile(ctx context.Context) error {
	meshes, err := listAll(ctx, z.cfg.Store, "Mesh")
	if err != nil {
		return err
	}
	next := map[string]*zoneMesh{}
	var errs []error
	for _, m := range meshes {
		b, ok := EnabledBackend(m)
		if !ok {
			continue
		}
		zm := &zoneMesh{backend: b}
		next[m.Name] = zm
		if !b.Builtin {
			zm.problem = fmt.Sprintf("backend %q is not builtin: Meridian issues certificates from builtin backends only", b.Name)
			continue
		}
		if err := z.reconcileMesh(ctx, m.Name, zm); err != nil {
			zm.problem = err.Error()
			errs = append(errs, err)
		}
	}
	z.publish(next)
	return errors.Join(errs...)
}

// reconcileMesh makes sure the zone has a key and a request for mesh, and
// loads its intermediate when it arrived.
func (z *Zone) reconcileMesh(ctx context.Context, mesh string, zm *zoneMesh) error {
	key, csrPEM, err := z.ensureKey(ctx, mesh, zm.backend.Name)
	if err != nil {
		return err
	}
	if err := z.ensureRequest(ctx, mesh, zm.backend.Name, csrPEM); err != nil {
		return err
	}
	csr, err := ca.ParseCSR(csrPEM)
	if err != nil {
		return err
	}
	if z.standalone {
		root, err := ensureRoot(ctx, z.cfg, mesh, zm.backend.Name)
		if err != nil {
			return err
		}
		req := &resource.Resource{Type: "ZoneCertificateRequest", Mesh: mesh, Name: zm.backend.Name,
			Spec: mustJSON(map[string]string{"backend": zm.backend.Name, "csr": string(csrPEM)})}
		if err := issueZoneCertificate(ctx, z.cfg, root, req, z.zone, zm.backend.Name, resource.OriginZone); err != nil {
			return err
		}
	}
	certs, err := z.certificates(ctx, mesh)
	if err != nil {
		return err
	}
	for _, c := range certs {
		spec, err := specOf[struct{ Backend, Certificate, Root string }](c)
		if err != nil || spec.Backend != zm.backend.Name || c.Labels.Get(resource.LabelForZone) != z.zone {
			continue
		}
		inter, err := ca.ParseCerts([]byte(spec.Certificate))
		if err != nil || !ca.SamePublicKey(inter[0], csr.PublicKey) {
			continue // signed for an earlier key
		}
		a, err := ca.LoadAuthority([]byte(spec.Certificate), key, []byte(spec.Root), z.cfg.Rand, z.cfg.Now)
		if err != nil {
			return fmt.Errorf("mesh %s: intermediate: %w", mesh, err)
		}
		if err := a.Verify(); err != nil {
			return fmt.Errorf("mesh %s: intermediate does not verify to the root: %w", mesh, err)
		}
		zm.authority, zm.bundle = a, []byte(spec.Root)
		return nil
	}
	zm.problem = "waiting for the global to sign this zone's intermediate"
	return nil
}

// ensureKey loads (or makes) the zone's key and CSR for mesh's backend.
func (z *Zone) ensureKey(ctx context.Context, mesh, backend string) (keyPEM, csrPEM []byte, err error) {
	k := resource.Key{Type: "ZoneCA", Mesh: mesh, Name: backend}
	r, err := z.cfg.Store.Get(ctx, k)
	if errors.Is(err, storage.ErrNotFound) {
		key, kerr := ca.NewKey(z.cfg.Rand)
		if kerr != nil {
			return nil, nil, kerr
		}
		kp, kerr := ca.EncodeKey(key)
		if kerr != nil {
			return nil, nil, kerr
		}
		csr, kerr := ca.NewCSR(z.cfg.Rand, key, fmt.Sprintf("mesh %s zone %s", mesh, z.zone))
		if kerr != nil {
			return nil, nil, kerr
		}
		fresh := &resource.Resource{Type: "ZoneCA", Mesh: mesh, Name: backend,
			Spec: mustJSON(map[string]string{"key": string(kp), "csr": string(csr)})}
		r, err = z.cfg.Store.Create(ctx, fresh)
		if errors.Is(err, storage.ErrAlreadyExists) {
			r, err = z.cfg.Store.Get(ctx, k)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("mesh %s: zone CA key: %w", mesh, err)
	}
	spec, err := specOf[struct{ Key, CSR string }](r)
	if err != nil {
		return nil, nil, fmt.Errorf("mesh %s: zone CA key: %w", mesh, err)
	}
	return []byte(spec.Key), []byte(spec.CSR), nil
}

// ensureRequest keeps the zone's request (synced to the global) current.
func (z *Zone) ensureRequest(ctx context.Context, mesh, backend string, csr []byte) error {
	req := &resource.Resource{Type: "ZoneCertificateRequest", Mesh: mesh, Name: backend,
		Spec: mustJSON(map[string]string{"backend": backend, "csr": string(csr)})}
	req.Labels.Set(resource.LabelOrigin, resource.OriginZone)
	req.Labels.Set(resource.LabelZone, z.zone)
	if _, _, err := z.cfg.Store.Put(ctx, req); err != nil {
		return fmt.Errorf("mesh %s: certificate request: %w", mesh, err)
	}
	return nil
}

// certificates lists the zone certificates of mesh the zone holds.
func (z *Zone) certificates(ctx context.Context, mesh string) ([]*resource.Resource, error) {
	res, err := z.cfg.Store.List(ctx, storage.ListOptions{Type: "ZoneCertificate", Mesh: mesh})
	if err != nil {
		return nil, err
	}
	return res.Items, nil
}

// publish replaces the state and signals a change when there is one.
func (z *Zone) publish(next map[string]*zoneMesh) {
	z.mu.Lock()
	defer z.mu.Unlock()
	changed := len(next) != len(z.meshes)
	for name, m := range next {
		old := z.meshes[name]
		changed = changed || old == nil || (old.authority == nil) != (m.authority == nil) ||
			(old.authority != nil && !old.authority.Cert.Equal(m.authority.Cert)) || old.problem != m.problem
	}
	z.meshes = next
	if changed {
		close(z.next)
		z.next = make(chan struct{})
	}
}
