// Package policy is Meridian's pure policy engine (docs/policy.md): it
// computes what policies give each proxy of one mesh in one zone. It reads
// resource envelopes and the type registry from internal/resource and
// nothing else: no store, no network, no goroutines.
//
// # Use
//
// Build a MeshSnapshot once per change of the mesh's resources, then query
// it from any number of goroutines:
//
//	s, err := policy.NewMeshSnapshot(policy.Inputs{Registry: reg, Mesh: "default",
//		Zone: "zone-1", SystemNamespace: "kuma-system", Resources: rs, Previous: old})
//	rules, err := s.Rules("web-1", "web-ns")                  // GET …/dataplanes/{name}/_rules
//	cfg, err := s.Config("web-1", "web-ns")                   // GET …/_config (with RBAC)
//	in, err := s.EvaluateInbound("web-1", "web-ns", 8080, client) // …/_evaluate?inbound=
//	out, err := s.EvaluateOutbound("web-1", "web-ns", "backend")  // …/_evaluate?outbound=
//	dps, err := s.MatchedDataplanes("MeshTimeout", "t", "web-ns") // …/_resources/dataplanes
//	ex, err := s.Explain("web-1", "web-ns", "MeshTimeout", policy.ExplainTarget{Outbound: "backend"}) // …/_explain
//	st, err := s.PolicyStatus("MeshTimeout", "t", "web-ns")       // status.conditions
//
// Unknown Dataplanes, inbounds, outbounds and policies are errors wrapping
// ErrNotFound. Problems inside resources (undecodable specs, mixed roles,
// references to missing gateways or routes) are warnings in the results.
// Results are plain JSON-serializable structs; they share immutable parts
// (confs, origins, rules) with the snapshot and with each other, so callers
// must not modify them. Namespace arguments take "" or the system namespace
// for the system namespace.
//
// # How it works
//
//   - snapshot.go, dataplane.go, decode.go, parse.go: inputs are indexed once.
//     Each policy gets its role (resource.PolicyRole; a synced copy keeps the
//     role of its kuma.io/policy-role label), its effective top-level
//     targetRef (the implicit targetRef of its role) and implicit scope, and its entries are
//     concatenated per type and sorted by docs/policy.md#ordering with Kuma 2.14's kind
//     order and Dataplane tie-breaks (order.go). spec.rules items (Kuma
//     2.10+) are from entries of kind Mesh (with their SPIFFE ID matches as
//     client tags spiffeID.exact/prefix). The next snapshot (Inputs.Previous)
//     keeps every unchanged policy's parse and sort order, merging in the
//     changed ones; it holds an unchanged policy as it is when the policy's
//     numbers (positions, override orders) and resolved targets stay the same
//     (share.go), and clones the small per-snapshot structs around the shared
//     definitions otherwise (clone.go). Built from Inputs.Changes instead of
//     the full list (delta.go, splice.go), it splices the changed policies
//     into the previous lists and costs what changed, not what is there. A
//     parsed policy keeps what output needs of its resource (name,
//     namespace, labels) and a fingerprint of its spec, not the resource: a
//     caller that builds from changes need not keep the resources either.
//   - shape.go: a fold skips a default block whose patch shape already
//     filled nothing into the same state; select.go's quickSel matches the
//     common top-level kinds from an array beside the policies, summarized
//     once per type into runs of policies that select alike (a Dataplane's
//     view decides each run once) and the list of policies with warnings.
//     A change that leaves every selector alike (a policy edited in place)
//     shares the previous snapshot's array and summary instead of copying.
//   - select.go: top-level selection per section of a Dataplane (each
//     inbound, embedded listener and the gateway): tag kinds over the
//     inbound's tags (plus the implicit kuma.io/zone and
//     k8s.kuma.io/namespace), kind Dataplane by name, labels or all, with
//     sectionName naming one inbound or listener; to-entry resolution through
//     MeshService resources (a synced copy is found by display name and
//     labels) with a fallback to kuma.io/service and namespace tags.
//   - merge.go: every default or override block is a contribution. The
//     defaults pass folds defaults from the most specific down, filling only
//     what is unset (RFC 7396 with append fields, equal to docs/policy.md#merging forward
//     merging), with atomic defaults, unset markers and `when` (CEL, see
//     internal/condition); the overrides pass then patches the result
//     forward in the order of order.go's compareOverrides. Every node
//     records the block that set it (provenance).
//   - trace.go, explain.go, status.go: a trace re-runs the same folds for one
//     target and records each block's fate and each field's winner;
//     `_explain` renders one trace, policy status aggregates the traces of
//     every target of every Dataplane (once per snapshot).
//   - fromrules.go: the from-rule view as a decision tree over entries that
//     prunes entries that cannot change the conf (no 2^n enumeration); an
//     entry with an override always splits, and each leaf runs the overrides
//     pass over the overrides of its entries.
//   - rbac.go: MeshTrafficPermission rules to Envoy RBAC proto JSON; an
//     inbound any policy with spec.rules applies to gets its RBAC from the
//     rules' SPIFFE ID lists alone (Kuma 2.14).
//   - legacy.go: the single most specific source/destination policy.
//   - views.go: the `_rules`, `_config`, `_evaluate` and matched-dataplanes
//     renderings, with memos shared by all queries of a snapshot: outbound
//     results by entry lists, and per type the to-entries by service and
//     the Mesh-wide ones with their key (every proxy a type's policies all
//     select takes those as made), carried to the next snapshot for what a
//     change left alone.
//
// # Decisions where the design leaves room
//
//   - Origin lists, as Kuma does, every entry that matched the target in
//     apply order (docs/policy.md#merging), then the overrides applied; a
//     default whose `when` was false is left out. A from-rule lists the
//     entries that match some client of it, so a rule merged from adjacent
//     rules with equal confs lists those of all of them. Memoized results
//     keep the blocks, and origins are rendered per query.
//   - No MeshTrafficPermission on an inbound (or none allowing anything)
//     is an RBAC config with action ALLOW and no policies: Envoy requires a
//     principal per policy, and an ALLOW config without policies denies all.
//   - Legacy inbound policies are selected per inbound by destination rank
//     (the client is unknown then); sources decide in `_evaluate`. Legacy
//     ties after rank and creationTime go to the smaller name. TrafficPermission
//     is reported but not turned into RBAC (docs/policy.md#rbac: RBAC is
//     MeshTrafficPermission's).
//   - Policies without kuma.io/origin sort as zone-originated and belong to
//     this zone; a policy without kuma.io/zone belongs to this zone.
//   - '*' is a wildcard in top-level and legacy selectors; in from-entries a
//     tag value is an exact client identity.
//   - Route rules of several MeshHTTPRoutes on one outbound concatenate in
//     apply order ("rules" is an append field for MeshHTTPRoute); a
//     MeshTCPRoute's one rule is replaced by a more specific one.
//   - A route's traffic gets the Mesh entries and the entries naming the
//     route, including those of policies whose top-level targetRef is the
//     route (docs/policy.md#routes); an outbound's conf never includes them.
package policy
