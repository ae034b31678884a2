package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/meridian-mesh/meridian/internal/condition"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Decoding a policy depends on the resource alone (and the system
// namespace, for its role), not on the rest of the snapshot. It is the
// expensive part of building a snapshot (JSON), so a snapshot built with
// Inputs.Previous reuses the decoded form of every unchanged policy.

// rawBlocks are the defaults-and-overrides fields of an entry or a proxy-wide spec
// (docs/policy.md#defaults-and-overrides).
type rawBlocks struct {
	Default  jsonValue `json:"default"`
	Override jsonValue `json:"override"`
	Strategy struct {
		Default  string `json:"default"`
		Override string `json:"override"`
	} `json:"strategy"`
	When struct {
		Default  string `json:"default"`
		Override string `json:"override"`
	} `json:"when"`
	Unset []string `json:"unset"`
}

// rawEntry is one to/from/rules item as written.
type rawEntry struct {
	rawBlocks
	TargetRef targetRef `json:"targetRef"` // absent: zero, read as none
	Rules     jsonValue `json:"rules"`
	Hostnames jsonValue `json:"hostnames"`
	// Matches (spec.rules items): the clients the rule applies to, by
	// SPIFFE ID; none = all inbound traffic.
	Matches []rawMatch `json:"matches"`
}

type rawMatch struct {
	SpiffeID *rawSpiffeID `json:"spiffeID"`
}

type rawSpiffeID struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

type selector struct {
	Match map[string]string `json:"match"`
}

// rawSpec covers every policy shape: targetRef policies and both legacy
// shapes. Fields a shape does not use stay empty.
type rawSpec struct {
	rawBlocks
	TargetRef targetRef  `json:"targetRef"` // absent: zero, read as none
	To        []rawEntry `json:"to"`
	From      []rawEntry `json:"from"`
	Rules     []rawEntry `json:"rules"` // inbound rules (Kuma 2.10+); to[].rules are routes'

	Sources      []selector `json:"sources"`
	Destinations []selector `json:"destinations"`
	Selectors    []selector `json:"selectors"`
	Conf         jsonValue  `json:"conf"`
}

// jsonValue is a JSON value of a spec kept decoded, as resource.ParseJSON
// decodes it (numbers exact); nil when absent or null.
type jsonValue struct{ v any }

// UnmarshalJSON decodes the value as resource.ParseJSON does, so that a
// spec read by encoding/json (readSpecStd) holds the same values as one
// read by the v2 decoder (readSpec).
func (j *jsonValue) UnmarshalJSON(b []byte) error {
	v, err := resource.ParseJSON(b)
	j.v = v
	return err
}

// confBlock is a decoded conf with its defaults-and-overrides qualifiers. A nil value
// means the entry carries no such block. The conf is compiled (patch) when
// its contribution's definition is made, unless an equal one is shared
// (defs.go).
type confBlock struct {
	value  any
	atomic bool
	when   *condition.Expr
	// unset (default blocks only): conf paths removed from less specific
	// defaults, each split at dots.
	unset [][]string
}

func compileConf(v any) confBlock { return confBlock{value: v} }

// blocks are the default and override blocks of one entry or proxy-wide spec.
type blocks struct {
	def, over confBlock
}

// decodeBlocks decodes default and override with their strategy, when and
// unset. conf turns a decoded block into the conf the engine merges
// (normalization; route types build it from rules instead).
func decodeBlocks(cond *condition.Env, raw rawBlocks, def any) (blocks, error) {
	var out blocks
	out.def = compileConf(def)
	if over := raw.Override.v; over != nil {
		out.over = compileConf(over)
	}
	out.def.atomic = raw.Strategy.Default == "atomic"
	out.over.atomic = raw.Strategy.Override == "atomic"
	var err error
	if out.def.when, err = compileWhen(cond, raw.When.Default); err != nil {
		return out, fmt.Errorf("when.default: %w", err)
	}
	if out.over.when, err = compileWhen(cond, raw.When.Override); err != nil {
		return out, fmt.Errorf("when.override: %w", err)
	}
	for _, u := range raw.Unset {
		if u != "" {
			out.def.unset = append(out.def.unset, strings.Split(u, "."))
		}
	}
	return out, nil
}

func compileWhen(cond *condition.Env, src string) (*condition.Expr, error) {
	if src == "" {
		return nil, nil
	}
	if cond == nil {
		return nil, errors.New("no CEL environment")
	}
	return cond.Compile(src)
}

// decodedPolicy is everything derived from a policy resource alone. It is
// immutable, so snapshots can share it.
type decodedPolicy struct {
	role     string
	top      targetRef // zero when absent
	to, from []decodedEntry
	// rules are spec.rules items (Kuma 2.10+): defaults for all inbound
	// traffic, merged like from entries of kind Mesh.
	rules []decodedEntry
	proxy blocks

	sources, destinations, selectors []selector
	legacy                           confBlock
}

type decodedEntry struct {
	ref targetRef // zero when absent
	blocks
	// matches of a rules item, as client tags (spiffeIDTag); each is an
	// alternative (Kuma expands a rule into one rule per match).
	matches []tag
}

// spiffeIDTag is the client "tag" a rule's SPIFFE ID match conditions on:
// spiffeID.exact or spiffeID.prefix with the ID as value. Clients are
// otherwise described by tags, so a match shows in rule views as a matcher
// on this key, and a client given without it matches only unconditioned
// rules.
func spiffeIDTag(typ, value string) tag {
	return tag{key: "spiffeID." + strings.ToLower(typ), value: value}
}

func decodePolicy(r *resource.Resource, d *resource.TypeDescriptor, sysNS string, cond *condition.Env) (*decodedPolicy, error) {
	spec, err := readSpec(r.Spec)
	if err != nil {
		return nil, fmt.Errorf("decoding spec: %w", err)
	}
	if d.Shape != resource.ShapeTargetRef {
		return decodeLegacy(spec), nil
	}
	role, err := roleOf(r, d, sysNS)
	if err != nil {
		return nil, err
	}
	dec := &decodedPolicy{role: role, top: spec.TargetRef}
	if d.To {
		if dec.to, err = decodeEntries(cond, d, "to", spec.To); err != nil {
			return nil, err
		}
	}
	if d.From {
		if dec.from, err = decodeEntries(cond, d, "from", spec.From); err != nil {
			return nil, err
		}
	}
	if d.InboundRules {
		if dec.rules, err = decodeEntries(cond, d, "rules", spec.Rules); err != nil {
			return nil, err
		}
	}
	if d.ProxyWide {
		if dec.proxy, err = decodeBlocks(cond, spec.rawBlocks, confOf(d, spec.Default.v)); err != nil {
			return nil, fmt.Errorf("spec: %w", err)
		}
		dec.proxy.over = normalizeBlock(d, dec.proxy.over)
	}
	return dec, nil
}

// roleOf computes the docs/policy.md#selection role with resource.PolicyRole. A synced copy
// lives in the system namespace but keeps the role it had where it was
// written, carried by the kuma.io/policy-role label (with its original
// namespace in k8s.kuma.io/namespace).
func roleOf(r *resource.Resource, d *resource.TypeDescriptor, sysNS string) (string, error) {
	if r.Namespace == "" || r.Namespace == sysNS {
		switch l := r.Labels.Get(resource.LabelPolicyRole); l {
		case resource.RoleProducer, resource.RoleConsumer, resource.RoleWorkloadOwner:
			if r.Labels.Get(resource.LabelNamespace) != "" {
				return l, nil
			}
		}
	}
	role, err := resource.PolicyRole(r, d, sysNS)
	if err != nil {
		return "", fmt.Errorf("policy role: %w", err)
	}
	return role, nil
}

func decodeEntries(cond *condition.Env, d *resource.TypeDescriptor, list string, items []rawEntry) ([]decodedEntry, error) {
	out := make([]decodedEntry, len(items))
	for i, item := range items {
		bl, err := decodeBlocks(cond, item.rawBlocks, entryConf(d, item))
		if err != nil {
			return nil, fmt.Errorf("spec.%s[%d]: %w", list, i, err)
		}
		bl.over = normalizeBlock(d, bl.over)
		out[i] = decodedEntry{ref: item.TargetRef, blocks: bl}
		for _, m := range item.Matches {
			if m.SpiffeID != nil {
				out[i].matches = append(out[i].matches, spiffeIDTag(m.SpiffeID.Type, m.SpiffeID.Value))
			}
		}
	}
	return out, nil
}

// normalizeBlock applies confOf to an override block.
func normalizeBlock(d *resource.TypeDescriptor, b confBlock) confBlock {
	if b.value == nil {
		return b
	}
	n := compileConf(confOf(d, b.value))
	n.atomic, n.when = b.atomic, b.when
	return n
}

// confOf is a conf block as the engine merges it: normalized, with the
// type's schema defaults filled in (resource.TypeDescriptor.ConfDefaults).
func confOf(d *resource.TypeDescriptor, v any) any {
	if v == nil {
		return nil
	}
	return d.ConfDefaults(normalizeConf(d.Name, v))
}

// entryConf decodes an entry's default, or for route types the rules (and
// hostnames) the entry attaches to its target, each rule with its
// defaults. A MeshTCPRoute entry without rules sends all its traffic to
// its target (Kuma's default rule).
func entryConf(d *resource.TypeDescriptor, item rawEntry) any {
	if !d.Rules {
		return confOf(d, item.Default.v)
	}
	rules, _ := item.Rules.v.([]any)
	if item.Rules.v == nil {
		if !d.OneRule {
			return nil
		}
		rules = []any{map[string]any{"default": map[string]any{"backendRefs": []any{backendOf(item.TargetRef)}}}}
	}
	withDefaults := make([]any, len(rules))
	for i, r := range rules {
		withDefaults[i] = d.ConfDefaults(r)
	}
	conf := map[string]any{"rules": withDefaults}
	if hosts := item.Hostnames.v; hosts != nil {
		conf["hostnames"] = hosts
	}
	return conf
}

// backendOf is the backendRef of a route entry's own target, with weight 1.
func backendOf(ref targetRef) map[string]any {
	out := map[string]any{"kind": ref.Kind, "weight": json.Number("1")}
	for k, v := range map[string]string{"name": ref.Name, "namespace": ref.Namespace, "sectionName": ref.SectionName} {
		if v != "" {
			out[k] = v
		}
	}
	if len(ref.Labels) > 0 {
		labels := make(map[string]any, len(ref.Labels))
		for k, v := range ref.Labels {
			labels[k] = v
		}
		out["labels"] = labels
	}
	return out
}

// decodeLegacy reads the legacy shapes: sources/destinations/conf or
// selectors/conf. Legacy policies are cluster-wide (role system).
func decodeLegacy(spec *rawSpec) *decodedPolicy {
	conf := spec.Conf.v
	if conf == nil {
		conf = map[string]any{} // TrafficPermission has no conf: it still applies
	}
	return &decodedPolicy{role: resource.RoleSystem, sources: spec.Sources, destinations: spec.Destinations,
		selectors: spec.Selectors, legacy: compileConf(conf)}
}
