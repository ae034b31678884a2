package meshca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/meridian-mesh/meridian/internal/ca"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Global is the global's side of the mesh CA: it keeps a root per mesh
// with a builtin backend enabled and signs the zones' intermediates.
type Global struct {
	cfg Config
}

// NewGlobal checks cfg.
func NewGlobal(cfg Config) (*Global, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &Global{cfg: cfg}, nil
}

// Run reconciles until ctx ends.
func (g *Global) Run(ctx context.Context) error {
	return follow(ctx, g.cfg, []string{"Mesh", "MeshCA", "ZoneCertificateRequest", "ZoneCertificate"}, g.reconcile)
}

func (g *Global) reconcile(ctx context.Context) error {
	meshes, err := listAll(ctx, g.cfg.Store, "Mesh")
	if err != nil {
		return err
	}
	roots := map[string]*ca.Authority{}
	backends := map[string]Backend{}
	for _, m := range meshes {
		b, ok := EnabledBackend(m)
		if !ok || !b.Builtin {
			continue
		}
		root, err := ensureRoot(ctx, g.cfg, m.Name, b.Name)
		if err != nil {
			return err
		}
		roots[m.Name], backends[m.Name] = root, b
	}
	reqs, err := listAll(ctx, g.cfg.Store, "ZoneCertificateRequest")
	if err != nil {
		return err
	}
	var errs []error
	for _, req := range reqs {
		zone := req.Labels.Get(resource.LabelZone)
		root, b := roots[req.Mesh], backends[req.Mesh]
		if root == nil || zone == "" {
			continue // mTLS off (or not builtin) in that mesh: nothing to sign
		}
		if err := issueZoneCertificate(ctx, g.cfg, root, req, zone, b.Name, resource.OriginGlobal); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rootKey is the store key of a mesh's root for a backend.
func rootKey(mesh, backend string) resource.Key {
	return resource.Key{Type: "MeshCA", Mesh: mesh, Name: backend}
}

// ensureRoot loads the mesh's root for backend, creating it the first
// time. Replicas racing to create it agree on the one stored first.
func ensureRoot(ctx context.Context, cfg Config, mesh, backend string) (*ca.Authority, error) {
	key := rootKey(mesh, backend)
	r, err := cfg.Store.Get(ctx, key)
	if errors.Is(err, storage.ErrNotFound) {
		certPEM, keyPEM, gerr := ca.NewRoot(cfg.Rand, cfg.Now(), fmt.Sprintf("mesh %s CA %s", mesh, backend), RootValidity)
		if gerr != nil {
			return nil, gerr
		}
		root := &resource.Resource{Type: "MeshCA", Mesh: mesh, Name: backend,
			Spec: mustJSON(map[string]string{"certificate": string(certPEM), "key": string(keyPEM)})}
		r, err = cfg.Store.Create(ctx, root)
		if errors.Is(err, storage.ErrAlreadyExists) {
			r, err = cfg.Store.Get(ctx, key)
		}
		if err == nil {
			cfg.Logger.Info("mesh CA root created", "mesh", mesh, "backend", backend)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mesh %s CA %s: %w", mesh, backend, err)
	}
	spec, err := specOf[struct{ Certificate, Key string }](r)
	if err != nil {
		return nil, fmt.Errorf("mesh %s CA %s: %w", mesh, backend, err)
	}
	return ca.LoadAuthority([]byte(spec.Certificate), []byte(spec.Key), []byte(spec.Certificate), cfg.Rand, cfg.Now)
}

// issueZoneCertificate signs zone's request with root unless the zone
// already holds an intermediate for that key with a third of its life
// left. origin labels the answer (global: it syncs to the zone; zone: a
// standalone zone signs for itself).
func issueZoneCertificate(ctx context.Context, cfg Config, root *ca.Authority, req *resource.Resource, zone, backend, origin string) error {
	spec, err := specOf[struct{ Backend, CSR string }](req)
	if err != nil || spec.Backend != backend {
		return nil // a request for a backend no longer enabled
	}
	csr, err := ca.ParseCSR([]byte(spec.CSR))
	if err != nil {
		return fmt.Errorf("zone %s, mesh %s: %w", zone, req.Mesh, err)
	}
	key := resource.Key{Type: "ZoneCertificate", Mesh: req.Mesh, Name: zone}
	if have, err := cfg.Store.Get(ctx, key); err == nil && current(cfg, have, csr, backend) {
		return nil
	}
	inter, err := root.SignIntermediate(csr, fmt.Sprintf("mesh %s zone %s", req.Mesh, zone), IntermediateValidity)
	if err != nil {
		return err
	}
	out := &resource.Resource{Type: "ZoneCertificate", Mesh: req.Mesh, Name: zone,
		Spec: mustJSON(map[string]string{"backend": backend, "certificate": string(ca.EncodeCerts(inter)), "root": string(ca.EncodeCerts(root.Root))})}
	out.Labels.Set(resource.LabelOrigin, origin)
	out.Labels.Set(resource.LabelForZone, zone)
	if origin == resource.OriginZone {
		out.Labels.Set(resource.LabelZone, zone)
	}
	if _, _, err := cfg.Store.Put(ctx, out); err != nil {
		return fmt.Errorf("zone %s, mesh %s: store intermediate: %w", zone, req.Mesh, err)
	}
	cfg.Logger.Info("zone intermediate signed", "mesh", req.Mesh, "zone", zone, "backend", backend, "expires", inter.NotAfter)
	return nil
}

// current reports whether a stored zone certificate is for csr's key and
// backend, and has more than a third of its life left.
func current(cfg Config, have *resource.Resource, csr *x509.CertificateRequest, backend string) bool {
	spec, err := specOf[struct{ Backend, Certificate string }](have)
	if err != nil || spec.Backend != backend {
		return false
	}
	certs, err := ca.ParseCerts([]byte(spec.Certificate))
	if err != nil || !ca.SamePublicKey(certs[0], csr.PublicKey) {
		return false
	}
	life := certs[0].NotAfter.Sub(certs[0].NotBefore)
	return certs[0].NotAfter.Sub(cfg.Now()) > life/3
}
