// Package admission owns every rule about who may write what through a
// control plane (docs/security.md#who-may-write-what): the labels the
// control plane owns, who owns an existing resource (one rule for the REST
// API and both KDS directions, owner.go), mesh existence, which plane
// creates meshes, and what a mesh delete takes with it. The REST handlers
// call it for every write, the global's KDS sink for every batch a zone
// sends (FromZone) and a zone's sink for every batch from the global
// (FromGlobal). Its preconditions run inside the store transaction of the
// write (storage.Batch.Check), so no write slips between a check and the
// write it guards; the keys a sync precondition refuses become the
// batch's NACK reasons.
package admission

import (
	"errors"
	"fmt"
	"strings"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Errors of admission; the API maps them to status codes with errors.Is.
var (
	// ErrForbidden: the caller may never write this (a label the control
	// plane owns, a mesh a zone does not create): 403.
	ErrForbidden = errors.New("forbidden")
	// ErrOwned: the resource exists and belongs to another plane or zone, or
	// a mesh still holds what another plane owns: 409.
	ErrOwned = errors.New("owned elsewhere")
	// ErrMeshMissing: the resource's mesh does not exist: 400 on field mesh.
	ErrMeshMissing = errors.New("mesh does not exist")
	// ErrAppendTooLarge: the write would make the lists a type's policies
	// append to every proxy of the mesh larger than MaxAppendedBytes: 413.
	ErrAppendTooLarge = errors.New("appended lists too large")
)

// Config describes the control plane.
type Config struct {
	Registry *resource.Registry
	// Plane is the control plane the writes are made to.
	Plane plane.Plane
}

// Controller applies the rules. Immutable; safe for concurrent use.
type Controller struct {
	reg   *resource.Registry
	plane plane.Plane
}

// New checks cfg.
func New(cfg Config) (*Controller, error) {
	if cfg.Registry == nil {
		return nil, errors.New("admission: Registry is required")
	}
	if err := cfg.Plane.Check(); err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	return &Controller{reg: cfg.Registry, plane: cfg.Plane}, nil
}

// Prepare turns a decoded resource into what this plane stores: a status
// sent by the client is dropped (status is the control plane's), the labels
// the control plane owns are set (and a caller claiming other values is
// refused), then the resource is normalized and validated.
func (c *Controller) Prepare(res *resource.Resource) error {
	d, ok := c.reg.Lookup(res.Type)
	if !ok {
		return fmt.Errorf("%w: unknown type %q", ErrForbidden, res.Type)
	}
	if d.SystemOnly {
		return fmt.Errorf("%w: %s resources are written by the control plane, not through the API", ErrForbidden, d.Name)
	}
	if c.plane.IsGlobal() && res.Type == "Dataplane" {
		// Kuma refuses it too: a Dataplane lives in the zone that runs its
		// proxy; on the global it would configure nothing.
		return fmt.Errorf("%w: a Dataplane is created on the zone control plane that runs its proxy, not on the global", ErrForbidden)
	}
	res.Status = nil
	c.reg.Normalize(res, c.plane.SystemNamespace)
	if err := c.systemLabels(res, d); err != nil {
		return err
	}
	return c.reg.Validate(res, c.plane)
}

// systemLabels sets origin, zone, namespace and policy role (docs/resources.md).
func (c *Controller) systemLabels(res *resource.Resource, d *resource.TypeDescriptor) error {
	origin := c.plane.Origin()
	if claimed := res.Labels.Get(resource.LabelOrigin); claimed != "" && claimed != origin {
		return fmt.Errorf("%w: the %s control plane accepts only resources of origin %q, not %q (label %s)",
			ErrForbidden, c.plane.Mode, origin, claimed, resource.LabelOrigin)
	}
	res.Labels.Set(resource.LabelOrigin, origin)
	if res.Labels.Get(resource.LabelNamespace) == c.plane.SystemNamespace {
		// The system namespace is no namespace: Kuma accepts the label with
		// that value everywhere; it means what its absence means.
		res.Labels.Delete(resource.LabelNamespace)
	}
	switch c.plane.Mode {
	case plane.Global:
		// Only sync writes zone labels on the global: a resource written
		// here claiming a zone or a namespace would replace that zone's
		// synced copies in other zones.
		for _, l := range []string{resource.LabelZone, resource.LabelNamespace} {
			if v, ok := res.Labels.Lookup(l); ok {
				return fmt.Errorf("%w: label %s=%q is set by the control plane on resources synced from zones; "+
					"the global does not accept it on its own resources", ErrForbidden, l, v)
			}
		}
	case plane.Zone:
		if z := res.Labels.Get(resource.LabelZone); z != "" && z != c.plane.Zone {
			return fmt.Errorf("%w: zone %q cannot write resources of zone %q (label %s)", ErrForbidden, c.plane.Zone, z, resource.LabelZone)
		}
		res.Labels.Set(resource.LabelZone, c.plane.Zone)
		ns := res.Namespace
		if ns == c.plane.SystemNamespace {
			ns = ""
		}
		if v, ok := res.Labels.Lookup(resource.LabelNamespace); ok && v != ns {
			return fmt.Errorf("%w: label %s=%q does not match the resource's namespace %q; the control plane sets it",
				ErrForbidden, resource.LabelNamespace, v, res.Namespace)
		}
		if ns != "" {
			res.Labels.Set(resource.LabelNamespace, ns)
		}
	}
	if d.Shape == resource.ShapeTargetRef {
		role, err := resource.PolicyRole(res, d, c.plane.SystemNamespace)
		if err != nil {
			return err
		}
		res.Labels.Set(resource.LabelPolicyRole, role)
	}
	return nil
}

// Put is the batch that stores a prepared resource, with its
// preconditions: whoever owns an existing resource keeps it, the mesh
// exists, and a federated zone creates no mesh.
func (c *Controller) Put(res *resource.Resource) storage.Batch {
	return storage.Batch{Puts: []*resource.Resource{res}, Check: func(tx storage.TxReader) ([]resource.Key, error) {
		existing, err := getOrNil(tx, res.Key())
		if err != nil {
			return nil, err
		}
		if err := c.owns(res.Key(), existing); err != nil {
			return nil, err
		}
		if err := c.notSquatting(res, existing); err != nil {
			return nil, err
		}
		if res.Type == "Mesh" && existing == nil && c.plane.IsZone() && c.plane.Federated {
			return nil, fmt.Errorf("%w: zone %q is connected to a global control plane: create meshes there, "+
				"they reach every zone", ErrForbidden, c.plane.Zone)
		}
		if d, _ := c.reg.Lookup(res.Type); d != nil && d.Secret && c.plane.Federated {
			return nil, fmt.Errorf("%w: zone %q is connected to a global control plane: create %ss there, "+
				"they reach every zone under their names", ErrForbidden, c.plane.Zone, res.Type)
		}
		if res.Mesh != "" {
			if _, err := tx.Get(resource.Key{Type: "Mesh", Name: res.Mesh}); errors.Is(err, storage.ErrNotFound) {
				return nil, fmt.Errorf("%w: mesh %q does not exist", ErrMeshMissing, res.Mesh)
			} else if err != nil {
				return nil, err
			}
		}
		if err := c.appendedFits(tx, res); err != nil {
			return nil, err
		}
		return nil, nil
	}}
}

// MaxAppendedBytes bounds, per mesh and plane, the specs of a proxy-wide
// type whose lists concatenate across policies (MeshProxyPatch's
// appendModifications, MeshPassthrough's appendMatch): every proxy such a
// policy selects carries all of them, in every inspect response and later in
// its proxy configuration. Six MeshProxyPatches of 3.4 MiB made each
// proxy's _rules 21.7 MB.
const MaxAppendedBytes = 1 << 20

// appendedFits refuses a write that would make the specs of res's type in
// its mesh, together, exceed MaxAppendedBytes.
func (c *Controller) appendedFits(tx storage.TxReader, res *resource.Resource) error {
	d, ok := c.reg.Lookup(res.Type)
	if !ok || !d.ProxyWide || len(d.AppendFields) == 0 {
		return nil
	}
	list, err := tx.List(storage.ListOptions{Type: res.Type, Mesh: res.Mesh})
	if err != nil {
		return err
	}
	total := len(res.Spec)
	for _, r := range list.Items {
		if r.Key() != res.Key() {
			total += len(r.Spec)
		}
	}
	if total > MaxAppendedBytes {
		return fmt.Errorf("%w: the %s policies of mesh %q would hold %d bytes together, at most %d: every proxy they "+
			"select carries all of them (%s)", ErrAppendTooLarge, res.Type, res.Mesh, total, MaxAppendedBytes, strings.Join(d.AppendFields, ", "))
	}
	return nil
}

// notSquatting: a zone does not create a resource under the name the
// global's resource of the same type gets in zones (a hashed name): the
// global's copy would be refused there for good.
func (c *Controller) notSquatting(res, existing *resource.Resource) error {
	if !c.plane.IsZone() || existing != nil || res.Type == "Mesh" {
		return nil
	}
	d, ok := c.reg.Lookup(res.Type)
	if !ok || !d.Sync.GlobalToZone {
		return nil
	}
	if original, ok := mapping.GlobalCopyName(res.Mesh, res.Name); ok {
		return fmt.Errorf("%w: name %q is the name the global's %s %q gets in zones; choose another name",
			ErrOwned, res.Name, res.Type, original)
	}
	return nil
}

// Delete is the batch that deletes key, failing when it does not exist
// (storage.ErrNotFound), has another version than version (unless 0:
// storage.ErrConflict) or is owned elsewhere.
func (c *Controller) Delete(key resource.Key, version uint64) storage.Batch {
	return storage.Batch{Check: func(tx storage.TxReader) ([]resource.Key, error) {
		if d, ok := c.reg.Lookup(key.Type); ok && d.SystemOnly {
			return nil, fmt.Errorf("%w: %s resources are written by the control plane, not through the API", ErrForbidden, d.Name)
		}
		existing, err := c.existing(tx, key, version)
		if err != nil {
			return nil, err
		}
		return []resource.Key{existing.Key()}, nil
	}}
}

// DeleteMesh is the batch that deletes a mesh and everything in it, in one
// transaction. On the global a mesh that still holds resources synced from
// zones (or their Dataplanes) cannot be deleted: the zones keep theirs and
// would resend them into a mesh that no longer exists (Kuma refuses too).
func (c *Controller) DeleteMesh(name string, version uint64) storage.Batch {
	key := resource.Key{Type: "Mesh", Name: name}
	return storage.Batch{Check: func(tx storage.TxReader) ([]resource.Key, error) {
		if _, err := c.existing(tx, key, version); err != nil {
			return nil, err
		}
		deletes := []resource.Key{key}
		var zoneOwned []string
		for _, typ := range c.reg.Names() {
			d, _ := c.reg.Lookup(typ)
			if d.Scope != resource.ScopeMesh {
				continue
			}
			list, err := tx.List(storage.ListOptions{Type: typ, Mesh: name})
			if err != nil {
				return nil, err
			}
			for _, r := range list.Items {
				if c.plane.IsGlobal() && r.Labels.Get(resource.LabelOrigin) == resource.OriginZone {
					zoneOwned = append(zoneOwned, fmt.Sprintf("%s %s (zone %s)", r.Type, r.Name, r.Labels.Get(resource.LabelZone)))
				}
				deletes = append(deletes, r.Key())
			}
		}
		if len(zoneOwned) > 0 {
			shown := zoneOwned
			if len(shown) > 10 {
				shown = append(shown[:10:10], fmt.Sprintf("and %d more", len(zoneOwned)-10))
			}
			return nil, fmt.Errorf("%w: unable to delete mesh %q, zones still have resources in it (delete them in "+
				"their zones first): %s", ErrOwned, name, strings.Join(shown, ", "))
		}
		return deletes, nil
	}}
}

// existing loads key for a delete and checks version and ownership.
func (c *Controller) existing(tx storage.TxReader, key resource.Key, version uint64) (*resource.Resource, error) {
	r, err := tx.Get(key)
	if err != nil {
		return nil, err
	}
	if version != 0 && r.Version != version {
		return nil, fmt.Errorf("delete %s: version %d given, stored %d: %w", key, version, r.Version, storage.ErrConflict)
	}
	return r, c.owns(key, r)
}

// owns refuses an API write to a resource this plane does not own.
func (c *Controller) owns(key resource.Key, existing *resource.Resource) error {
	w := writer{kind: apiWriter}
	if c.plane.IsZone() {
		w.zone = c.plane.Zone
	}
	return c.mayWrite(w, key, existing)
}

// txLookup is what a store's transaction reader may offer beside Get: a
// lookup that answers nil, nil for an absent key instead of an error
// wrapping storage.ErrNotFound. The checks below look up every key a batch
// writes, most of them new in a cold zone, and formatting an error for each
// cost 16 MB at 100,000 and about 0.3 µs per key.
type txLookup interface {
	Lookup(key resource.Key) (*resource.Resource, error)
}

func getOrNil(tx storage.TxReader, key resource.Key) (*resource.Resource, error) {
	if l, ok := tx.(txLookup); ok {
		return l.Lookup(key)
	}
	r, err := tx.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	return r, err
}

// Rejected is a veto of some resources of a sync batch: each key with why.
// The batch applies nothing; the caller drops those resources (answering
// the peer with a NACK for them) and applies the rest.
type Rejected struct {
	Keys map[resource.Key]error
}

func (r *Rejected) Error() string {
	var parts []string
	for k, err := range r.Keys {
		parts = append(parts, fmt.Sprintf("%s: %v", k, err))
	}
	return "rejected: " + strings.Join(parts, "; ")
}

// RejectedKeys lets callers that do not import this package read the keys.
func (r *Rejected) RejectedKeys() map[resource.Key]error { return r.Keys }

// ErrQuota: a zone's resources on the global would exceed its quota: the
// put is refused (and resent later; the zone may delete others meanwhile).
var ErrQuota = errors.New("zone quota exceeded")

// Usage is what a zone stores on the global.
type Usage struct {
	Resources int   `json:"resources"`
	Bytes     int64 `json:"bytes"`
}

// Quota bounds what one zone may store on the global (zero: no bound).
// Used is what it stores; the precondition of each batch counts the
// batch's change into Delta (its last run is the one committed), which the
// caller adds to Used once the batch is written. One zone's batches are
// applied one at a time.
type Quota struct {
	MaxResources int
	MaxBytes     int64
	Used, Delta  Usage
}

// ResourceSize is what a resource counts against a quota.
func ResourceSize(r *resource.Resource) int64 {
	n := len(r.Name) + len(r.Spec) + len(r.Status)
	for k, v := range r.Labels.All() {
		n += len(k) + len(v)
	}
	return int64(n)
}

func (q *Quota) fits(change Usage) bool {
	after := Usage{q.Used.Resources + q.Delta.Resources + change.Resources, q.Used.Bytes + q.Delta.Bytes + change.Bytes}
	return (q.MaxResources <= 0 || after.Resources <= q.MaxResources || change.Resources <= 0 && change.Bytes <= 0) &&
		(q.MaxBytes <= 0 || after.Bytes <= q.MaxBytes || change.Bytes <= 0)
}

// FromZone is the precondition of a batch that zone's stream applies on the
// global: every put and delete touches only that zone's own resources (or
// nothing yet), every put's mesh exists, and the zone stays within quota
// (nil: none). It runs in the batch's transaction, so a resource the
// global's API writes meanwhile is never overwritten by a zone.
func (c *Controller) FromZone(zone string, quota *Quota, puts []*resource.Resource, deletes []resource.Key) func(storage.TxReader) ([]resource.Key, error) {
	return func(tx storage.TxReader) ([]resource.Key, error) {
		rejected := map[resource.Key]error{}
		owned := func(key resource.Key) (*resource.Resource, error) {
			existing, err := getOrNil(tx, key)
			if err != nil {
				return nil, err
			}
			return existing, c.mayWrite(writer{kind: zoneStream, zone: zone}, key, existing)
		}
		if quota != nil {
			quota.Delta = Usage{}
		}
		for _, k := range deletes {
			existing, err := owned(k)
			if err != nil {
				rejected[k] = err
				continue
			}
			if quota != nil && existing != nil {
				quota.Delta.Resources--
				quota.Delta.Bytes -= ResourceSize(existing)
			}
		}
		meshes := map[string]bool{}
		for _, r := range puts {
			existing, err := owned(r.Key())
			if err != nil {
				rejected[r.Key()] = err
				continue
			}
			if quota != nil {
				change := Usage{Resources: 1, Bytes: ResourceSize(r)}
				if existing != nil {
					change = Usage{Bytes: ResourceSize(r) - ResourceSize(existing)}
				}
				if !quota.fits(change) {
					rejected[r.Key()] = fmt.Errorf("%w: zone %q stores %d resources (%d bytes) on the global; its quota is %d "+
						"resources and %d bytes", ErrQuota, zone, quota.Used.Resources+quota.Delta.Resources,
						quota.Used.Bytes+quota.Delta.Bytes, quota.MaxResources, quota.MaxBytes)
					continue
				}
				quota.Delta.Resources += change.Resources
				quota.Delta.Bytes += change.Bytes
			}
			if r.Mesh == "" {
				continue
			}
			ok, seen := meshes[r.Mesh]
			if !seen {
				_, err := tx.Get(resource.Key{Type: "Mesh", Name: r.Mesh})
				if err != nil && !errors.Is(err, storage.ErrNotFound) {
					return nil, err
				}
				ok = err == nil
				meshes[r.Mesh] = ok
			}
			if !ok {
				rejected[r.Key()] = fmt.Errorf("%w: mesh %q does not exist on the global", ErrMeshMissing, r.Mesh)
			}
		}
		if len(rejected) > 0 {
			return nil, &Rejected{Keys: rejected}
		}
		return nil, nil
	}
}

// FromGlobal is the precondition of a batch the global's stream applies on
// this zone: no put or delete touches one of the zone's own resources of a
// type that syncs zone → global. It runs in the
// batch's transaction, so a resource the zone's API writes meanwhile is
// never overwritten or removed by the global.
func (c *Controller) FromGlobal(puts []*resource.Resource, deletes []resource.Key) func(storage.TxReader) ([]resource.Key, error) {
	return func(tx storage.TxReader) ([]resource.Key, error) {
		rejected := map[resource.Key]error{}
		check := func(key resource.Key) error {
			if d, ok := c.reg.Lookup(key.Type); !ok || !d.Sync.ZoneToGlobal {
				return nil // types that never sync up are the global's
			}
			existing, err := getOrNil(tx, key)
			if err != nil {
				return err
			}
			return c.mayWrite(writer{kind: globalStream}, key, existing)
		}
		for _, r := range puts {
			if err := check(r.Key()); err != nil {
				if !errors.Is(err, ErrOwned) {
					return nil, err
				}
				rejected[r.Key()] = err
			}
		}
		for _, k := range deletes {
			if err := check(k); err != nil {
				if !errors.Is(err, ErrOwned) {
					return nil, err
				}
				rejected[k] = err
			}
		}
		if len(rejected) > 0 {
			return nil, &Rejected{Keys: rejected}
		}
		return nil, nil
	}
}
