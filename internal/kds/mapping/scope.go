package mapping

import (
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Verdict says what a sender does with one stored resource for one peer.
type Verdict int

const (
	// Skip: the resource has nothing to do with the peer (a type that does
	// not flow that way, or the peer's own resource). Nothing is sent.
	Skip Verdict = iota
	// Send: the peer gets the mapped copy.
	Send
	// Remove: the type flows to the peer but this resource must not (it is
	// labelled kds-sync: disabled, or is not relayable); the peer is told to
	// remove its copy in case an earlier version of the resource was sent.
	Remove
)

// SyncDisabled reports the kuma.io/kds-sync: disabled label, which keeps a
// resource where it was written.
func SyncDisabled(r *resource.Resource) bool {
	return r.Labels.Get(resource.LabelKDSSync) == "disabled"
}

// IsGlobalOrigin reports whether a resource stored on the global was written
// there (rather than received from a zone). Resources without an origin
// label were written to the global's store directly and count as global.
func IsGlobalOrigin(r *resource.Resource) bool {
	return resource.OwnerOf(r, globalPlane).Global
}

var globalPlane = plane.NewGlobal("")

// OwnedByZone reports whether a resource stored in zone's store was written
// in that zone, as opposed to a copy received from the global (origin
// global, or a relayed resource of another zone). Resources without labels
// were written to the store directly and count as the zone's own.
func OwnedByZone(r *resource.Resource, zone string) bool {
	o := resource.OwnerOf(r, plane.Plane{Mode: plane.Zone, Zone: zone})
	return !o.Global && o.Zone == zone
}

// GlobalToZone decides whether r, as stored on the global, goes to zone
// (docs/kds.md#what-flows-where):
//   - global-originated resources of every type whose descriptor has
//     Sync.GlobalToZone (Mesh, policies, MeshExternalService, MeshGateway,
//     legacy policies...);
//   - resources of other zones that the global relays: MeshServices, and
//     producer policies written in a custom namespace of a Kubernetes zone
//     that do not reference a MeshExternalService (consumer and
//     workload-owner policies, system-namespace policies and policies of
//     Universal zones stay in their zone and on the global);
//   - never the zone's own resources, never kuma.io/kds-sync: disabled.
func GlobalToZone(d *resource.TypeDescriptor, r *resource.Resource, zone string) Verdict {
	if d == nil || !d.Sync.GlobalToZone {
		return Skip
	}
	if !IsGlobalOrigin(r) {
		src := r.Labels.Get(resource.LabelZone)
		if src == "" || src == zone {
			return Skip
		}
		if !isRelayType(d) {
			return Skip
		}
		if !relayable(d, r) {
			return Remove
		}
	}
	if d.Sync.ForZone && r.Labels.Get(resource.LabelForZone) != zone {
		return Skip // another zone's
	}
	if SyncDisabled(r) {
		return Remove
	}
	return Send
}

// GlobalToZoneRemoval decides whether the deletion of key (with the labels
// its tombstone kept) on the global is forwarded to zone. A removal of
// something the zone never had is harmless, so every deletion of a type that
// may have reached the zone is forwarded, except the zone's own resources.
func GlobalToZoneRemoval(d *resource.TypeDescriptor, labels resource.Labels, zone string) bool {
	if d == nil || !d.Sync.GlobalToZone {
		return false
	}
	if labels.Get(resource.LabelOrigin) == resource.OriginZone {
		src := labels.Get(resource.LabelZone)
		return src != "" && src != zone && isRelayType(d)
	}
	return true
}

// ZoneToGlobal decides whether r, as stored in zone's store, goes to the
// global: every resource written in the zone whose type has
// Sync.ZoneToGlobal (policies of every role, Dataplanes, MeshServices), so
// that the global shows the whole fleet; the global decides what it relays
// further. Copies received from the global never go back.
func ZoneToGlobal(d *resource.TypeDescriptor, r *resource.Resource, zone string) Verdict {
	if d == nil || !d.Sync.ZoneToGlobal || !OwnedByZone(r, zone) {
		return Skip
	}
	if SyncDisabled(r) {
		return Remove
	}
	return Send
}

// ZoneToGlobalRemoval decides whether the deletion of a zone resource (with
// its tombstone's labels) is forwarded to the global.
func ZoneToGlobalRemoval(d *resource.TypeDescriptor, labels resource.Labels, zone string) bool {
	if d == nil || !d.Sync.ZoneToGlobal {
		return false
	}
	return OwnedByZone(&resource.Resource{Labels: labels}, zone)
}

// isRelayType: the types the global may relay from one zone to the others.
// RelayedFromZone reports whether r, stored on the global, is another zone's
// resource of a type the global relays to zone: one the zone holds only if
// it was relayable when sent (its removals need sending only then).
func RelayedFromZone(d *resource.TypeDescriptor, r *resource.Resource, zone string) bool {
	if d == nil || !d.Sync.GlobalToZone || IsGlobalOrigin(r) {
		return false
	}
	src := r.Labels.Get(resource.LabelZone)
	return src != "" && src != zone && isRelayType(d)
}

// IsRelayType reports whether the global relays resources of this type from
// one zone to the others (types with Sync.Relay, and targetRef policies).
func IsRelayType(d *resource.TypeDescriptor) bool { return isRelayType(d) }

func isRelayType(d *resource.TypeDescriptor) bool {
	return d.Sync.Relay || d.Shape == resource.ShapeTargetRef
}

// relayable: a resource of a relayed type (a MeshService, an endpoint
// summary), or a producer policy of a custom namespace (so of a Kubernetes
// zone) that does not reference a MeshExternalService.
func relayable(d *resource.TypeDescriptor, r *resource.Resource) bool {
	if d.Sync.Relay {
		return true
	}
	if r.Labels.Get(resource.LabelPolicyRole) != resource.RoleProducer {
		return false
	}
	if r.Labels.Get(resource.LabelNamespace) == "" {
		return false
	}
	return !referencesExternalService(r.Spec)
}
