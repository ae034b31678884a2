package mapping

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// ErrForeign is wrapped by FromZone for a resource a zone may not write: one
// claiming global origin, or another zone.
var ErrForeign = errors.New("resource does not belong to the sending zone")

// ToZone returns the copy of r (stored on the global) that a zone stores
// (docs/kds.md#names-labels-references, global -> zone). A global-originated resource gets a hashed name
// (except Mesh and other mesh-less types, whose names are global
// identifiers), the system namespace, and the labels kuma.io/origin: global
// and kuma.io/display-name. A relayed zone resource already carries its
// hashed name and its kuma.io/zone, k8s.kuma.io/namespace and display-name
// labels from the global and keeps them. Status is never sent; store-managed
// fields are cleared.
func ToZone(d *resource.TypeDescriptor, r *resource.Resource) *resource.Resource {
	c := r.Clone()
	c.Status = nil
	c.Namespace = ""
	clearStoreFields(c)
	if !IsGlobalOrigin(r) {
		return c
	}
	c.Labels.Set(resource.LabelOrigin, resource.OriginGlobal)
	c.Labels.Set(resource.LabelDisplayName, r.DisplayName())
	c.Name = ZoneName(d, r.Key(), r.Labels)
	return c
}

// ZoneName is the name a zone gives the global's resource key (with labels
// the resource or its tombstone carries); see ToZone.
func ZoneName(d *resource.TypeDescriptor, key resource.Key, labels resource.Labels) string {
	if labels.Get(resource.LabelOrigin) == resource.OriginZone || d.Scope == resource.ScopeGlobal || d.Secret {
		return key.Name // secrets keep their names: references by name resolve in zones
	}
	return HashedName(key.Mesh, key.Name, labels.Get(resource.LabelZone), labels.Get(resource.LabelNamespace))
}

// FromZone returns the copy of r (as stored in zone z) that the global
// stores (docs/kds.md#names-labels-references, zone -> global): the name hashed with the zone and the
// namespace, the global's system namespace, the labels kuma.io/origin: zone,
// kuma.io/zone, k8s.kuma.io/namespace (custom namespaces only),
// kuma.io/display-name and, for targetRef policies, kuma.io/policy-role as
// computed in the zone; and the reference rewrite of to[].targetRef
// (see rewriteRefsToGlobal). A resource claiming global origin or another
// zone is refused with ErrForeign.
func FromZone(d *resource.TypeDescriptor, r *resource.Resource, z plane.Plane, globalSystemNamespace string) (*resource.Resource, error) {
	if o := r.Labels.Get(resource.LabelOrigin); o != "" && o != resource.OriginZone {
		return nil, fmt.Errorf("%w: label %s is %q", ErrForeign, resource.LabelOrigin, o)
	}
	if zl := r.Labels.Get(resource.LabelZone); zl != "" && zl != z.Zone {
		return nil, fmt.Errorf("%w: label %s is %q, the stream is zone %q", ErrForeign, resource.LabelZone, zl, z.Zone)
	}
	ns := z.Namespace(r.Namespace)
	c := r.Clone()
	clearStoreFields(c)
	c.Name = HashedName(r.Mesh, r.Name, z.Zone, ns)
	c.Namespace = ""
	c.Labels.Set(resource.LabelOrigin, resource.OriginZone)
	c.Labels.Set(resource.LabelZone, z.Zone)
	c.Labels.Set(resource.LabelDisplayName, r.Name)
	c.Labels.Delete(resource.LabelNamespace)
	if ns != "" {
		c.Labels.Set(resource.LabelNamespace, ns)
	}
	if d.Shape != resource.ShapeTargetRef {
		return c, nil
	}
	src := r.Clone()
	src.Namespace = ns
	role, err := resource.PolicyRole(src, d, z.SystemNamespace)
	if err != nil {
		return nil, err
	}
	c.Labels.Set(resource.LabelPolicyRole, role)
	spec, err := rewriteRefsToGlobal(r.Spec, r.Mesh, ns, z, globalSystemNamespace)
	if err != nil {
		return nil, err
	}
	c.Spec = spec
	return c, nil
}

// GlobalKey is the key on the global of zone z's resource key (for
// removals); see FromZone.
func GlobalKey(key resource.Key, z plane.Plane) resource.Key {
	ns := z.Namespace(key.Namespace)
	return resource.Key{Type: key.Type, Mesh: key.Mesh, Name: HashedName(key.Mesh, key.Name, z.Zone, ns)}
}

// FromGlobal returns the copy a zone stores of a resource the global sent:
// the system namespace, no status, and for a relayed zone policy the
// namespace of every rewritten to[].targetRef set to this zone's system
// namespace (step 2: namespaces are environment-specific). The
// copy shares r's labels and spec bytes, which neither writes: a cold zone
// receives every global policy through here, and copying each one's labels
// and spec again only fed the garbage collector.
func FromGlobal(d *resource.TypeDescriptor, r *resource.Resource, z plane.Plane) (*resource.Resource, error) {
	c := new(*r)
	c.Namespace = ""
	c.Status = nil
	clearStoreFields(c)
	if d.Shape != resource.ShapeTargetRef || IsGlobalOrigin(r) {
		return c, nil
	}
	spec, err := rewriteRefs(r.Spec, func(ref map[string]any) {
		ref["namespace"] = z.SystemNamespace
	})
	if err != nil {
		return nil, err
	}
	c.Spec = spec
	return c, nil
}

// rewriteRefsToGlobal applies the reference rewrite: each to[].targetRef naming a
// MeshService or MeshHTTPRoute gets the name that resource has on the global
// (hashed with the zone and the referenced namespace, where an empty
// namespace is the policy's own) and the global's system namespace.
func rewriteRefsToGlobal(spec json.RawMessage, mesh, ownNS string, z plane.Plane, globalNS string) (json.RawMessage, error) {
	return rewriteRefs(spec, func(ref map[string]any) {
		name, _ := ref["name"].(string)
		refMesh, _ := ref["mesh"].(string)
		if refMesh == "" {
			refMesh = mesh
		}
		ns, _ := ref["namespace"].(string)
		if ns == "" {
			ns = ownNS
		}
		ref["name"] = HashedName(refMesh, name, z.Zone, z.Namespace(ns))
		ref["namespace"] = globalNS
	})
}

// rewriteRefs calls fn for every to[].targetRef that names a MeshService or
// MeshHTTPRoute (label references are left alone: labels are the same in
// every zone) and re-encodes the spec when any was found.
func rewriteRefs(spec json.RawMessage, fn func(ref map[string]any)) (json.RawMessage, error) {
	if !bytes.Contains(spec, []byte(`"to"`)) {
		return spec, nil
	}
	obj, err := decodeObject(spec)
	if err != nil {
		return nil, err
	}
	to, _ := obj["to"].([]any)
	changed := false
	for _, item := range to {
		entry, _ := item.(map[string]any)
		ref, _ := entry["targetRef"].(map[string]any)
		kind, _ := ref["kind"].(string)
		name, _ := ref["name"].(string)
		if (kind == resource.KindMeshService || kind == resource.KindMeshHTTPRoute) && name != "" {
			fn(ref)
			changed = true
		}
	}
	if !changed {
		return spec, nil
	}
	return encodeObject(obj)
}

// referencesExternalService: some to[].targetRef is a MeshExternalService.
// An unreadable spec counts as referencing one, so it is not relayed.
func referencesExternalService(spec json.RawMessage) bool {
	if !bytes.Contains(spec, []byte(resource.KindMeshExternalService)) {
		return false
	}
	obj, err := decodeObject(spec)
	if err != nil {
		return true
	}
	to, _ := obj["to"].([]any)
	for _, item := range to {
		entry, _ := item.(map[string]any)
		ref, _ := entry["targetRef"].(map[string]any)
		if ref["kind"] == resource.KindMeshExternalService {
			return true
		}
	}
	return false
}

func decodeObject(spec json.RawMessage) (map[string]any, error) {
	v, err := resource.ParseJSON(spec)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	if v == nil {
		return nil, nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("spec: must be a JSON object, got %T", v)
	}
	return obj, nil
}

// encodeObject writes the canonical form the registry's Normalize produces
// (resource.CanonicalJSON).
func encodeObject(obj map[string]any) (json.RawMessage, error) {
	out, err := resource.CanonicalJSON(obj)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return out, nil
}

// clearStoreFields drops what the receiving store sets itself.
func clearStoreFields(r *resource.Resource) {
	r.Version = 0
	r.CreationTime = time.Time{}
	r.ModificationTime = time.Time{}
}
