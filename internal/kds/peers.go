package kds

import (
	"context"
	"fmt"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// The four halves of the two directions: what the global sends a zone
// (globalSource) and how the zone stores it (zoneSink); what a zone sends
// the global (zoneSource) and how the global stores it (globalSink).

func typesWhere(reg *resource.Registry, pred func(*resource.TypeDescriptor) bool) []string {
	var out []string
	for _, n := range reg.Names() {
		if d, _ := reg.Lookup(n); pred(d) {
			out = append(out, n)
		}
	}
	return out
}

// globalSource: the global's store as zone sees it.
type globalSource struct {
	reg  *resource.Registry
	zone string
	// copies, when set, shares the zone copies across sessions.
	copies *zoneCopies
}

func (s globalSource) put(r *resource.Resource) (*wireCopy, *resource.Key) {
	d, _ := s.reg.Lookup(r.Type)
	switch mapping.GlobalToZone(d, r, s.zone) {
	case mapping.Send:
		if s.copies != nil {
			return s.copies.toZone(d, r), nil
		}
		return newWireCopy(mapping.ToZone(d, r)), nil
	case mapping.Remove:
		k := resource.Key{Type: r.Type, Mesh: r.Mesh, Name: mapping.ZoneName(d, r.Key(), r.Labels)}
		return nil, &k
	}
	return nil, nil
}

func (s globalSource) remove(tomb *resource.Resource) *resource.Key {
	if s.copies != nil {
		s.copies.forget(tomb.Key())
	}
	d, _ := s.reg.Lookup(tomb.Type)
	if !mapping.GlobalToZoneRemoval(d, tomb.Labels, s.zone) {
		return nil
	}
	return &resource.Key{Type: tomb.Type, Mesh: tomb.Mesh, Name: mapping.ZoneName(d, tomb.Key(), tomb.Labels)}
}

// relayedFromZone implements relayTracker.
func (s globalSource) relayedFromZone(r *resource.Resource) bool {
	d, _ := s.reg.Lookup(r.Type)
	return mapping.RelayedFromZone(d, r, s.zone)
}

// relayTypes implements relayTracker.
func (s globalSource) relayTypes() []string {
	return typesWhere(s.reg, func(d *resource.TypeDescriptor) bool { return d.Sync.GlobalToZone && mapping.IsRelayType(d) })
}

func (s globalSource) snapshotTypes() []string {
	return typesWhere(s.reg, func(d *resource.TypeDescriptor) bool { return d.Sync.GlobalToZone })
}

// zoneSource: a zone's own resources, sent as stored; the global maps them
// (it does not trust the zone with names and labels).
type zoneSource struct {
	reg  *resource.Registry
	zone string
}

func (s zoneSource) put(r *resource.Resource) (*wireCopy, *resource.Key) {
	d, _ := s.reg.Lookup(r.Type)
	switch mapping.ZoneToGlobal(d, r, s.zone) {
	case mapping.Send:
		return newWireCopy(r), nil
	case mapping.Remove:
		k := r.Key()
		return nil, &k
	}
	return nil, nil
}

func (s zoneSource) remove(tomb *resource.Resource) *resource.Key {
	d, _ := s.reg.Lookup(tomb.Type)
	if !mapping.ZoneToGlobalRemoval(d, tomb.Labels, s.zone) {
		return nil
	}
	k := tomb.Key()
	return &k
}

func (s zoneSource) snapshotTypes() []string {
	return typesWhere(s.reg, func(d *resource.TypeDescriptor) bool { return d.Sync.ZoneToGlobal })
}

// globalSink stores what an authenticated zone sends: each resource is
// validated as the zone validated it, mapped (hashed name, labels forced to
// the zone, references rewritten), validated as a global resource, and
// refused when it would replace a resource that is not this zone's.
type globalSink struct {
	reg    *resource.Registry
	store  Store
	zone   plane.Plane // the sending zone
	global plane.Plane
}

func (s globalSink) upsert(ctx context.Context, w *syncv1.Resource) (*resource.Resource, error) {
	r := fromWire(w)
	d, err := s.descriptor(r.Type)
	if err != nil {
		return nil, err
	}
	r.Type = d.Name // the registry's string, not the decoder's copy
	if err := s.reg.Validate(r, s.zone); err != nil {
		return nil, err
	}
	g, err := mapping.FromZone(d, r, s.zone, s.global.SystemNamespace)
	if err != nil {
		return nil, err
	}
	s.reg.Normalize(g, s.global.SystemNamespace)
	if err := s.reg.Validate(g, s.global); err != nil {
		return nil, fmt.Errorf("as stored on the global: %w", err)
	}
	// Whether g would replace a resource that is not this zone's is
	// admission's decision, inside the write transaction (ZoneAdmission).
	return g, nil
}

// removal maps a removal the zone sent. Whether the key is this zone's is
// admission's decision, inside the write transaction (ZoneAdmission); a
// removal of a key the global does not hold deletes nothing.
func (s globalSink) removal(_ context.Context, k *syncv1.ResourceKey) (resource.Key, bool, error) {
	key := keyFromWire(k)
	if _, err := s.descriptor(key.Type); err != nil {
		return resource.Key{}, false, err
	}
	return mapping.GlobalKey(key, s.zone), true, nil
}

func (s globalSink) descriptor(typ string) (*resource.TypeDescriptor, error) {
	d, ok := s.reg.Lookup(typ)
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown resource type %q", typ)
	case !d.Sync.ZoneToGlobal:
		return nil, fmt.Errorf("type %s does not sync from zones to the global", typ)
	}
	return d, nil
}

func (s globalSink) owned(ctx context.Context) ([]resource.Key, error) {
	var keys []resource.Key
	for _, typ := range typesWhere(s.reg, func(d *resource.TypeDescriptor) bool { return d.Sync.ZoneToGlobal }) {
		list, err := s.store.List(ctx, storage.ListOptions{Type: typ,
			Labels: map[string]string{resource.LabelOrigin: resource.OriginZone, resource.LabelZone: s.zone.Zone}})
		if err != nil {
			return nil, fmt.Errorf("list %s of zone %s: %w", typ, s.zone.Zone, err)
		}
		for _, r := range list.Items {
			keys = append(keys, r.Key())
		}
	}
	return keys, nil
}

// zoneSink stores what the global sends a zone. The zone's own resources
// of the types it syncs up are its authority: the global may not replace or
// remove them (types that only flow down, such as Mesh, belong to the
// global even if the zone created them while standalone).
type zoneSink struct {
	reg   *resource.Registry
	store Store
	zone  plane.Plane
}

func (s zoneSink) upsert(ctx context.Context, w *syncv1.Resource) (*resource.Resource, error) {
	r := fromWire(w)
	d, err := s.descriptor(r.Type)
	if err != nil {
		return nil, err
	}
	r.Type = d.Name // the registry's string, not the decoder's copy
	if !mapping.IsGlobalOrigin(r) && r.Labels.Get(resource.LabelZone) == s.zone.Zone {
		return nil, fmt.Errorf("%w: the global sent zone %s its own resource", mapping.ErrForeign, s.zone.Zone)
	}
	c, err := mapping.FromGlobal(d, r, s.zone)
	if err != nil {
		return nil, err
	}
	if err := s.reg.Validate(c, s.zone); err != nil {
		return nil, err
	}
	// Whether c would overwrite one of the zone's own resources is checked
	// inside the write transaction (GlobalAdmission), where no API write can
	// race it; reading it here too cost a read transaction per resource.
	return c, nil
}

// removal maps a removal the global sent. Whether the key is one of the
// zone's own resources is admission's decision, inside the write
// transaction (GlobalAdmission); a removal of a key the zone does not hold
// deletes nothing.
func (s zoneSink) removal(_ context.Context, k *syncv1.ResourceKey) (resource.Key, bool, error) {
	key := keyFromWire(k)
	if _, err := s.descriptor(key.Type); err != nil {
		return resource.Key{}, false, err
	}
	return key, true, nil
}

func (s zoneSink) descriptor(typ string) (*resource.TypeDescriptor, error) {
	d, ok := s.reg.Lookup(typ)
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown resource type %q", typ)
	case !d.Sync.GlobalToZone:
		return nil, fmt.Errorf("type %s does not sync from the global to zones", typ)
	}
	return d, nil
}

func (s zoneSink) owned(ctx context.Context) ([]resource.Key, error) {
	var keys []resource.Key
	for _, typ := range typesWhere(s.reg, func(d *resource.TypeDescriptor) bool { return d.Sync.GlobalToZone }) {
		list, err := s.store.List(ctx, storage.ListOptions{Type: typ})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", typ, err)
		}
		for _, r := range list.Items {
			if !mapping.OwnedByZone(r, s.zone.Zone) {
				keys = append(keys, r.Key())
			}
		}
	}
	return keys, nil
}
