package policy

import (
	"encoding/json"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// MeshTrafficPermission → Envoy network RBAC (SPEC 3.5, seed 003).
//
// The types below mirror envoy.config.rbac.v3 in proto JSON with proto field
// names (and_ids, not_id, principal_name, shadow_rules), for the subset the
// engine emits. go-control-plane's generated types would give the same JSON
// but pull a large dependency tree into a pure package for five structs.

// RBAC is config.rbac.v3.RBAC.
type RBAC struct {
	Action   string                `json:"action"`
	Policies map[string]RBACPolicy `json:"policies"`
}

// RBACPolicy is config.rbac.v3.Policy.
type RBACPolicy struct {
	Permissions []Permission `json:"permissions"`
	Principals  []Principal  `json:"principals"`
}

// Permission is config.rbac.v3.Permission (only `any` is emitted).
type Permission struct {
	Any bool `json:"any"`
}

// Principal is config.rbac.v3.Principal: exactly one field is set.
type Principal struct {
	Any           bool           `json:"any,omitempty"`
	AndIDs        *PrincipalSet  `json:"and_ids,omitempty"`
	NotID         *Principal     `json:"not_id,omitempty"`
	Authenticated *Authenticated `json:"authenticated,omitempty"`
}

// PrincipalSet is config.rbac.v3.Principal.Set.
type PrincipalSet struct {
	IDs []Principal `json:"ids"`
}

// Authenticated is config.rbac.v3.Principal.Authenticated.
type Authenticated struct {
	PrincipalName StringMatcher `json:"principal_name"`
}

// StringMatcher is type.matcher.v3.StringMatcher (exact only).
type StringMatcher struct {
	Exact string `json:"exact"`
}

// Names of the RBAC policies (SPEC 3.5).
const (
	rbacPolicy       = "MeshTrafficPermission"
	rbacShadowPolicy = "ShadowMeshTrafficPermission"
	mtpType          = "MeshTrafficPermission"
)

// rbacFilter converts an inbound's MeshTrafficPermission rules. rules holds
// the principals allowed now (ALLOW, ALLOW_WITH_SHADOW_DENY), shadow_rules
// those allowed if shadow actions took effect (ALLOW, DENY_WITH_SHADOW_ALLOW;
// SPEC 9 widens seed 003, which listed only the latter).
//
// Deny all (no MeshTrafficPermission on the inbound, or no rule allowing
// anything) is an ALLOW config with no policies: Envoy requires at least
// one principal per policy, and an ALLOW RBAC without policies matches
// nothing, so it denies every connection.
func rbacFilter(mesh string, rules []Rule) RBACFilter {
	return RBACFilter{
		Rules: rbacConfig(mesh, rbacPolicy, rules, func(a string) bool {
			return a == resource.ActionAllow || a == resource.ActionAllowWithShadowDeny
		}),
		ShadowRules: rbacConfig(mesh, rbacShadowPolicy, rules, func(a string) bool {
			return a == resource.ActionAllow || a == resource.ActionDenyWithShadowAllow
		}),
	}
}

func rbacConfig(mesh, name string, rules []Rule, allowed func(string) bool) *RBAC {
	cfg := &RBAC{Action: "ALLOW", Policies: map[string]RBACPolicy{}}
	var principals []Principal
	for _, r := range rules {
		if allowed(ruleAction(r)) {
			principals = append(principals, principalOf(mesh, r.Matchers))
		}
	}
	if len(principals) > 0 {
		cfg.Policies[name] = RBACPolicy{Permissions: []Permission{{Any: true}}, Principals: principals}
	}
	return cfg
}

// ruleAction reads a rule's canonical action; "" when there is none (a rule
// without an action allows nothing).
func ruleAction(r Rule) string {
	var conf struct {
		Action string `json:"action"`
	}
	if json.Unmarshal(r.Conf, &conf) != nil {
		return ""
	}
	a, _ := resource.CanonicalTrafficAction(conf.Action)
	return a
}

// principalOf: and_ids of the matchers' identities; a rule without matchers
// is any.
func principalOf(mesh string, ms []Matcher) Principal {
	if len(ms) == 0 {
		return Principal{Any: true}
	}
	ids := make([]Principal, len(ms))
	for i, m := range ms {
		id := Principal{Authenticated: &Authenticated{PrincipalName: StringMatcher{Exact: identity(mesh, m.Key, m.Value)}}}
		if m.Not {
			inner := id
			id = Principal{NotID: &inner}
		}
		ids[i] = id
	}
	return Principal{AndIDs: &PrincipalSet{IDs: ids}}
}

// identity is the URI SAN a client certificate carries for a tag (seed 003,
// SPEC 9): spiffe://<mesh>/<service> for kuma.io/service, kuma://<key>/<value>
// for any other tag.
func identity(mesh, key, value string) string {
	if key == resource.ServiceTag {
		return "spiffe://" + mesh + "/" + value
	}
	return "kuma://" + key + "/" + value
}
