package admission

import (
	"fmt"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Writes go through one ownership rule (resource.OwnerOf): a writer changes
// only the resources it owns. The writers are this plane's REST API (as the
// global, or as its zone), a zone's KDS stream on the global (it owns that
// zone's copies) and the global's KDS stream on a zone (it writes for the
// global and relays the other zones' resources: everything but this zone's
// own).

type writerKind int

const (
	apiWriter    writerKind = iota // this plane's REST API
	zoneStream                     // a zone's stream, applied on the global
	globalStream                   // the global's stream, applied on a zone
)

type writer struct {
	kind writerKind
	// zone is the writing zone: the zone's API, or the zone of a stream.
	zone string
}

// mayWrite refuses w's write to key when the stored resource (nil: none
// yet, free) is not w's, with an error wrapping ErrOwned that says where
// the resource may be changed.
func (c *Controller) mayWrite(w writer, key resource.Key, existing *resource.Resource) error {
	if existing == nil {
		return nil
	}
	o := resource.OwnerOf(existing, c.plane)
	origin, zone := existing.Labels.Get(resource.LabelOrigin), existing.Labels.Get(resource.LabelZone)
	switch w.kind {
	case apiWriter:
		switch {
		case c.plane.IsGlobal() && !o.Global:
			return fmt.Errorf("%w: %s has origin %q (zone %q): change it in that zone, not on the global", ErrOwned, key, origin, zone)
		case c.plane.IsZone() && o.Global:
			return fmt.Errorf("%w: %s has origin %q: change it on the global control plane, not in zone %q", ErrOwned, key, origin, c.plane.Zone)
		case c.plane.IsZone() && o.Zone != w.zone:
			return fmt.Errorf("%w: %s belongs to zone %q, not %q", ErrOwned, key, o.Zone, w.zone)
		}
	case zoneStream:
		if !o.Global && o.Zone != "" && o.Zone != w.zone {
			// Another zone's copy under the same hashed name: Kuma's hash
			// joins the zone and namespace without a separator.
			return &CollisionError{Key: key, Zone: w.zone, Holder: existing}
		}
		if o.Global || o.Zone != w.zone {
			return fmt.Errorf("%w: %s exists on the global with origin %q and zone %q", ErrOwned, key, origin, zone)
		}
	case globalStream:
		if !o.Global && o.Zone == c.plane.Zone {
			return fmt.Errorf("%w: %s is a resource of zone %s, not the global's", ErrOwned, key, c.plane.Zone)
		}
	}
	return nil
}

// CollisionError: a zone's resource maps, on the global, to the hashed name
// another zone's resource holds already (zone "zone-x" with namespace "b"
// and zone "zone-xb" without one hash alike; the hash must stay Kuma's).
// It is permanent: the zone's resource is refused until it is renamed, not
// resent forever. It wraps ErrOwned.
type CollisionError struct {
	Key    resource.Key
	Zone   string
	Holder *resource.Resource
}

func (e *CollisionError) Error() string {
	return fmt.Sprintf("%v: hashed name collision: %s of zone %q maps to the name %s of zone %q holds already "+
		"(written there as %s); Kuma's hash joins zone and namespace without a separator: rename one of them",
		ErrOwned, e.Key.Type, e.Zone, e.Key.Name, e.Holder.Labels.Get(resource.LabelZone), resource.NamingOf(e.Holder))
}

// Unwrap makes a collision an ErrOwned.
func (e *CollisionError) Unwrap() error { return ErrOwned }

// Permanent marks the rejection as one the sender need not retry.
func (e *CollisionError) Permanent() bool { return true }
