package policy

import "github.com/meridian-mesh/meridian/internal/resource"

// The resources a snapshot was built from, for renderings that need more of
// them than the engine reads (the xDS rendering: inbound addresses,
// endpoint summaries). They are the immutable resources the snapshot
// holds; callers must not change them.

// Dataplane returns the Dataplane resource name in namespace ("" or the
// system namespace), or nil.
func (s *MeshSnapshot) Dataplane(name, namespace string) *resource.Resource {
	if dp := s.dataplanes[nsName{s.normNS(namespace), name}]; dp != nil {
		return dp.res
	}
	return nil
}

// DataplaneResources lists the mesh's Dataplanes, sorted by namespace and name.
func (s *MeshSnapshot) DataplaneResources() []*resource.Resource {
	out := make([]*resource.Resource, len(s.dpList))
	for i, dp := range s.dpList {
		out[i] = dp.res
	}
	return out
}

// Infrastructure lists the mesh's resources of a type that is neither a
// policy nor a Dataplane (MeshService, ZoneEndpoints...).
func (s *MeshSnapshot) Infrastructure(typ string) []*resource.Resource {
	var out []*resource.Resource
	for _, r := range s.infra {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

// ServiceNames are the mesh's services, sorted: those of the zone's
// Dataplanes' inbounds and those other zones summarize, the implicit
// outbounds of a Dataplane that declares none (docs/policy.md#outbounds).
// The list is shared: never write it.
func (s *MeshSnapshot) ServiceNames() []string { return s.meshServiceNames() }

// NormalizeNamespace maps the system namespace to "".
func (s *MeshSnapshot) NormalizeNamespace(ns string) string { return s.normNS(ns) }

// HasPolicies says whether the mesh holds policies of policyType.
func (s *MeshSnapshot) HasPolicies(policyType string) bool {
	t := s.types[policyType]
	return t != nil && len(t.policies) > 0
}
