package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Decoding a policy depends on the resource alone (and the system
// namespace, for its role), not on the rest of the snapshot. It is the
// expensive part of building a snapshot (JSON), so a snapshot built with
// Inputs.Previous reuses the decoded form of every unchanged policy.

// rawEntry is one to/from item as written.
type rawEntry struct {
	TargetRef *targetRef      `json:"targetRef"`
	Default   json.RawMessage `json:"default"`
	Rules     json.RawMessage `json:"rules"`
	Hostnames json.RawMessage `json:"hostnames"`
}

type selector struct {
	Match map[string]string `json:"match"`
}

// rawSpec covers every policy shape: targetRef policies and both legacy
// shapes. Fields a shape does not use stay empty.
type rawSpec struct {
	TargetRef    *targetRef      `json:"targetRef"`
	To           []rawEntry      `json:"to"`
	From         []rawEntry      `json:"from"`
	Default      json.RawMessage `json:"default"`
	Sources      []selector      `json:"sources"`
	Destinations []selector      `json:"destinations"`
	Selectors    []selector      `json:"selectors"`
	Conf         json.RawMessage `json:"conf"`
}

// confBlock is a decoded conf and its compiled patch. A nil value means the
// entry carries no conf.
type confBlock struct {
	value any
	patch *patch
}

func compileConf(v any) confBlock { return confBlock{value: v, patch: compilePatch(v)} }

// decodedPolicy is everything derived from a policy resource alone. It is
// immutable, so snapshots can share it.
type decodedPolicy struct {
	role     string
	top      *targetRef
	to, from []decodedEntry
	proxy    confBlock

	sources, destinations, selectors []selector
	legacy                           confBlock
}

type decodedEntry struct {
	ref  *targetRef
	conf confBlock
}

// cachedDecode remembers what a decode was computed from.
type cachedDecode struct {
	spec   json.RawMessage
	labels map[string]string
	dec    *decodedPolicy
	err    error
}

// sameSource reports whether r would decode the same: same spec bytes and
// labels (labels carry the role of synced copies). The key, namespace
// included, is the cache's own key.
func (c *cachedDecode) sameSource(r *resource.Resource) bool {
	return bytes.Equal(c.spec, r.Spec) && maps.Equal(c.labels, r.Labels)
}

func decodePolicy(r *resource.Resource, d *resource.TypeDescriptor, sysNS string) (*decodedPolicy, error) {
	var spec rawSpec
	if len(r.Spec) > 0 {
		if err := json.Unmarshal(r.Spec, &spec); err != nil {
			return nil, fmt.Errorf("decoding spec: %w", err)
		}
	}
	if d.Shape != resource.ShapeTargetRef {
		return decodeLegacy(&spec)
	}
	role, err := roleOf(r, d, sysNS)
	if err != nil {
		return nil, err
	}
	dec := &decodedPolicy{role: role, top: spec.TargetRef}
	if d.To {
		if dec.to, err = decodeEntries(d, "to", spec.To); err != nil {
			return nil, err
		}
	}
	if d.From {
		if dec.from, err = decodeEntries(d, "from", spec.From); err != nil {
			return nil, err
		}
	}
	if d.ProxyWide {
		conf, err := decodeJSON(spec.Default)
		if err != nil {
			return nil, fmt.Errorf("spec.default: %w", err)
		}
		dec.proxy = compileConf(normalizeConf(d.Name, conf))
	}
	return dec, nil
}

// roleOf computes the SPEC 3.1 role with resource.PolicyRole. A synced copy
// lives in the system namespace but keeps the role it had where it was
// written, carried by the kuma.io/policy-role label (with its original
// namespace in k8s.kuma.io/namespace).
func roleOf(r *resource.Resource, d *resource.TypeDescriptor, sysNS string) (string, error) {
	if r.Namespace == "" || r.Namespace == sysNS {
		switch l := r.Labels[resource.LabelPolicyRole]; l {
		case resource.RoleProducer, resource.RoleConsumer, resource.RoleWorkloadOwner:
			if r.Labels[resource.LabelNamespace] != "" {
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

func decodeEntries(d *resource.TypeDescriptor, list string, items []rawEntry) ([]decodedEntry, error) {
	out := make([]decodedEntry, len(items))
	for i, item := range items {
		conf, err := entryConf(d, item)
		if err != nil {
			return nil, fmt.Errorf("spec.%s[%d]: %w", list, i, err)
		}
		out[i] = decodedEntry{ref: item.TargetRef, conf: compileConf(conf)}
	}
	return out, nil
}

// entryConf decodes an entry's default, or for route types the rules (and
// hostnames) the entry attaches to its target.
func entryConf(d *resource.TypeDescriptor, item rawEntry) (any, error) {
	if !d.Rules {
		conf, err := decodeJSON(item.Default)
		if err != nil {
			return nil, fmt.Errorf("default: %w", err)
		}
		return normalizeConf(d.Name, conf), nil
	}
	rules, err := decodeJSON(item.Rules)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	if rules == nil {
		return nil, nil
	}
	conf := map[string]any{"rules": rules}
	if hosts, err := decodeJSON(item.Hostnames); err != nil {
		return nil, fmt.Errorf("hostnames: %w", err)
	} else if hosts != nil {
		conf["hostnames"] = hosts
	}
	return conf, nil
}

// decodeLegacy reads seed 000's shapes: sources/destinations/conf or
// selectors/conf. Legacy policies are cluster-wide (role system).
func decodeLegacy(spec *rawSpec) (*decodedPolicy, error) {
	conf, err := decodeJSON(spec.Conf)
	if err != nil {
		return nil, fmt.Errorf("conf: %w", err)
	}
	if conf == nil {
		conf = map[string]any{} // TrafficPermission has no conf: it still applies
	}
	return &decodedPolicy{role: resource.RoleSystem, sources: spec.Sources, destinations: spec.Destinations,
		selectors: spec.Selectors, legacy: compileConf(conf)}, nil
}
