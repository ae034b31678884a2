package policy

import (
	"encoding/json"
	"slices"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// MeshTrafficPermission → Envoy network RBAC (docs/policy.md#rbac).
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
	OrIDs         *PrincipalSet  `json:"or_ids,omitempty"`
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

// StringMatcher is type.matcher.v3.StringMatcher: exact, or prefix (SPIFFE
// ID prefixes of MeshTrafficPermission rules).
type StringMatcher struct {
	Exact  string `json:"exact,omitempty"`
	Prefix string `json:"prefix,omitempty"`
}

// Names of the RBAC policies (docs/policy.md#rbac).
const (
	rbacPolicy       = "MeshTrafficPermission"
	rbacShadowPolicy = "ShadowMeshTrafficPermission"
	mtpType          = "MeshTrafficPermission"
)

// rbacFilter converts an inbound's MeshTrafficPermission rules. rules holds
// the principals allowed now (ALLOW, ALLOW_WITH_SHADOW_DENY), shadow_rules
// those allowed if shadow actions took effect (ALLOW, DENY_WITH_SHADOW_ALLOW;
// a wider choice than listing only the latter: docs/policy.md#decisions-where-the-design-left-room).
//
// Deny all (no MeshTrafficPermission on the inbound, or no rule allowing
// anything) is an ALLOW config with no policies: Envoy requires at least
// one principal per policy, and an ALLOW RBAC without policies matches
// nothing, so it denies every connection.
func rbacFilter(mesh string, rules []Rule) RBACFilter {
	if lists, ok := ruleLists(rules); ok {
		return rulesRBAC(lists)
	}
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
		id := Principal{Authenticated: &Authenticated{PrincipalName: StringMatcher{Exact: IdentityOf(mesh, m.Key, m.Value)}}}
		if m.Not {
			inner := id
			id = Principal{NotID: &inner}
		}
		ids[i] = id
	}
	return Principal{AndIDs: &PrincipalSet{IDs: ids}}
}

// IdentityOf is the URI SAN a client certificate carries for a tag
// (docs/policy.md#rbac): spiffe://<mesh>/<service> for kuma.io/service,
// kuma://<key>/<value> for any other tag. What matches a from-rule's
// clients on a proxy matches these.
func IdentityOf(mesh, key, value string) string {
	if key == resource.ServiceTag {
		return "spiffe://" + mesh + "/" + value
	}
	return "kuma://" + key + "/" + value
}

// MeshTrafficPermission rules (Kuma 2.12+): SPIFFE ID matchers instead of
// tag subsets. As in Kuma 2.14, once any policy with rules applies to an
// inbound, its RBAC comes from the rules alone (from-based permissions of
// other policies on that inbound no longer count), and the rules of every
// policy are unioned: a deny anywhere wins over any allow, and a client
// matching no allow is denied.

// spiffeMatch is one rules[].default list item.
type spiffeMatch struct {
	SpiffeID *struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"spiffeID"`
}

// mtpLists are the unioned lists of every rule on an inbound.
type mtpLists struct {
	allow, allowWithShadowDeny, deny []spiffeMatch
}

// ruleLists unions the rule lists of the inbound's rules; ok is false when
// no rule carries any (a from-based inbound).
func ruleLists(rules []Rule) (mtpLists, bool) {
	var out mtpLists
	found := false
	seen := map[string]bool{}
	for _, r := range rules {
		var conf struct {
			Allow               []spiffeMatch `json:"allow"`
			AllowWithShadowDeny []spiffeMatch `json:"allowWithShadowDeny"`
			Deny                []spiffeMatch `json:"deny"`
		}
		if json.Unmarshal(r.Conf, &conf) != nil {
			continue
		}
		for _, l := range []struct {
			name string
			in   []spiffeMatch
			out  *[]spiffeMatch
		}{{"allow", conf.Allow, &out.allow}, {"shadow", conf.AllowWithShadowDeny, &out.allowWithShadowDeny}, {"deny", conf.Deny, &out.deny}} {
			for _, m := range l.in {
				found = true
				if m.SpiffeID == nil {
					continue
				}
				key := l.name + "\x00" + m.SpiffeID.Type + "\x00" + m.SpiffeID.Value
				if !seen[key] {
					seen[key] = true
					*l.out = append(*l.out, m)
				}
			}
		}
	}
	return out, found
}

// rulesRBAC: enforced, a client is allowed when it matches allow or
// allowWithShadowDeny and no deny; in the shadow config allowWithShadowDeny
// turns into a deny.
func rulesRBAC(l mtpLists) RBACFilter {
	return RBACFilter{
		Rules:       allowUnless(rbacPolicy, append(slices.Clone(l.allow), l.allowWithShadowDeny...), l.deny),
		ShadowRules: allowUnless(rbacShadowPolicy, l.allow, append(slices.Clone(l.deny), l.allowWithShadowDeny...)),
	}
}

func allowUnless(name string, allow, deny []spiffeMatch) *RBAC {
	cfg := &RBAC{Action: "ALLOW", Policies: map[string]RBACPolicy{}}
	if len(allow) == 0 {
		return cfg // nothing allowed: deny all
	}
	principal := anyOf(allow)
	if len(deny) > 0 {
		denied := anyOf(deny)
		principal = Principal{AndIDs: &PrincipalSet{IDs: []Principal{principal, {NotID: &denied}}}}
	}
	cfg.Policies[name] = RBACPolicy{Permissions: []Permission{{Any: true}}, Principals: []Principal{principal}}
	return cfg
}

// anyOf is one principal matching any of ms (or_ids when more than one).
func anyOf(ms []spiffeMatch) Principal {
	ids := make([]Principal, len(ms))
	for i, m := range ms {
		sm := StringMatcher{Exact: m.SpiffeID.Value}
		if m.SpiffeID.Type == "Prefix" {
			sm = StringMatcher{Prefix: m.SpiffeID.Value}
		}
		ids[i] = Principal{Authenticated: &Authenticated{PrincipalName: sm}}
	}
	if len(ids) == 1 {
		return ids[0]
	}
	return Principal{OrIDs: &PrincipalSet{IDs: ids}}
}
