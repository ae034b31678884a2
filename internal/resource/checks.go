package resource

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Reusable cross-field rules for object schemas. Each returns a checkFunc
// that runs only on an object value (the walker guarantees the type).

// present lists which of keys are set (non-null) in obj, in keys' order.
func present(obj map[string]any, keys ...string) []string {
	var set []string
	for _, k := range keys {
		if obj[k] != nil {
			set = append(set, k)
		}
	}
	return set
}

// exactlyOneOf requires exactly one of keys, as Kuma's one-of blocks
// (a backend is either tcp or file, never both).
func exactlyOneOf(keys ...string) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		if n := len(present(v.(map[string]any), keys...)); n != 1 {
			errs.Add(path, "exactly one of %s must be set", strings.Join(keys, ", "))
		}
	}
}

// atMostOneOf forbids setting more than one of keys.
func atMostOneOf(keys ...string) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		if set := present(v.(map[string]any), keys...); len(set) > 1 {
			errs.Add(path, "only one of %s may be set", strings.Join(set, ", "))
		}
	}
}

// atLeastOneOf requires one of keys, for blocks that mean nothing when empty.
func atLeastOneOf(keys ...string) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		if len(present(v.(map[string]any), keys...)) == 0 {
			errs.Add(path, "at least one of %s must be set", strings.Join(keys, ", "))
		}
	}
}

// union describes Kuma's "type + matching block" pattern: `type: Zipkin`
// goes with a `zipkin` block and no other. blocks maps each type value to
// its block's field name ("" when that type has no block); required says
// whether the block must be present for its type.
type union struct {
	typeField string
	blocks    map[string]string
	required  bool
}

func (u union) check(path string, v any, errs *ValidationError) {
	obj := v.(map[string]any)
	typ, _ := obj[u.typeField].(string)
	want, known := u.blocks[typ]
	if !known {
		return // the enum on the type field already reported it
	}
	for _, t := range sortedKeys(u.blocks) {
		block := u.blocks[t]
		if block != "" && block != want && obj[block] != nil {
			errs.Add(joinPath(path, block), "must not be set when %s is %s", u.typeField, typ)
		}
	}
	if u.required && want != "" && obj[want] == nil {
		errs.Add(joinPath(path, want), "must be set when %s is %s", u.typeField, typ)
	}
}

// types returns the type values, for the enum of the type field.
func (u union) types() []string { return sortedKeys(u.blocks) }

// requireTag checks that a tag map carries key (kuma.io/service on inbounds).
func requireTag(key string) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		if v.(map[string]any)[key] == nil {
			errs.Add(path, "must contain the %q tag", key)
		}
	}
}

// intIn restricts an integer to a set (HTTP redirect status codes).
func intIn(values ...int64) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		num, _ := v.(json.Number)
		n, err := num.Int64()
		if err != nil {
			return // not an integer: already reported
		}
		for _, x := range values {
			if n == x {
				return
			}
		}
		parts := make([]string, len(values))
		for i, x := range values {
			parts[i] = strconv.FormatInt(x, 10)
		}
		errs.Add(path, "invalid value %d: must be one of %s", n, strings.Join(parts, ", "))
	}
}

// stringCheck adapts a string predicate returning an error message ("" when
// fine) to a checkFunc.
func stringCheck(check func(string) string) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		if msg := check(v.(string)); msg != "" {
			errs.Add(path, "%s", msg)
		}
	}
}
