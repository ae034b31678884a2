package policy

import "slices"

// Keyed append lists (docs/policy.md#merging): MeshHTTPRoute's rules
// accumulate across policies, and rules with equal matches merge into one,
// as Kuma 2.14 merges them (its mergeValuesByKey, with the route's
// reversing GetDefault and Transform):
//
//   - each block's rules are taken in reverse and the blocks concatenated
//     in apply order;
//   - a rule whose key equals an earlier one's replaces it at its own
//     place, its default merged over the earlier's (RFC 7396, later wins);
//   - the result is reversed.
//
// So the most specific block's rules come first, each block's in its own
// order, and a rule keeps the place of its most specific occurrence.

// mergeByKey renders a keyed list: items in apply order, counts[i] of them
// from the i-th block.
func mergeByKey(items []any, counts []int, key string) []any {
	type acc struct {
		key      string
		value    any
		defaults []any
		skip     bool
	}
	var accs []acc
	start := 0
	for _, n := range counts {
		block := items[start : start+n]
		start += n
		for i := len(block) - 1; i >= 0; i-- {
			rule, _ := block[i].(map[string]any)
			k := string(canonicalJSON(rule[key]))
			defaults := []any{rule["default"]}
			for j := range accs {
				if !accs[j].skip && accs[j].key == k {
					accs[j].skip = true
					defaults = append(slices.Clone(accs[j].defaults), defaults...)
				}
			}
			accs = append(accs, acc{key: k, value: rule[key], defaults: defaults})
		}
	}
	out := make([]any, 0, len(accs))
	for _, a := range accs {
		if a.skip {
			continue
		}
		var merged any
		for _, d := range a.defaults {
			merged = mergePatch(merged, d)
		}
		rule := map[string]any{key: a.value}
		if merged != nil {
			rule["default"] = merged
		}
		out = append(out, rule)
	}
	slices.Reverse(out)
	return out
}

// mergePatch applies patch to target as RFC 7396 does (objects merge, null
// deletes, anything else replaces); target is not changed.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	out := map[string]any{}
	if t, ok := target.(map[string]any); ok {
		for k, v := range t {
			out[k] = v
		}
	}
	for k, v := range p {
		if v == nil {
			delete(out, k)
			continue
		}
		out[k] = mergePatch(out[k], v)
	}
	return out
}
