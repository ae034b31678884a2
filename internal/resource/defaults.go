package resource

import "encoding/json"

// Schema defaults (docs/resources.md#defaults): the values Kuma's API
// schema declares for fields left out, filled into every conf block the
// engine merges, as Kubernetes fills them into stored resources, so that
// a proxy's effective conf shows what it will get.

// withDefault sets the value a field takes when its object is present and
// the field is absent. v is a JSON value as ParseJSON decodes it (numbers
// as json.Number).
func (s *Schema) withDefault(v any) *Schema {
	s.def = v
	return s
}

// defaultInt is withDefault for an integer.
func (s *Schema) defaultInt(n string) *Schema { return s.withDefault(json.Number(n)) }

// FillDefaults returns v with the schema's defaults filled in: each absent
// field with a default, inside every object present (a default never
// creates its parent). v is not changed: objects and lists that gain a
// field are copied, the rest is shared. A value of the wrong type is
// returned as it is (validation reports it).
func (s *Schema) FillDefaults(v any) any {
	if s == nil || !s.hasDefaults() {
		return v
	}
	out, _ := s.fill(v)
	return out
}

// fill returns v with defaults and whether it differs from v.
func (s *Schema) fill(v any) (any, bool) {
	switch s.kind {
	case kindObject:
		obj, ok := v.(map[string]any)
		if !ok {
			return v, false
		}
		var out map[string]any
		set := func(k string, val any) {
			if out == nil {
				out = make(map[string]any, len(obj)+1)
				for ok, ov := range obj {
					out[ok] = ov
				}
			}
			out[k] = val
		}
		for _, k := range sortedKeys(s.fields) {
			fs := s.fields[k]
			if !fs.hasDefaults() {
				continue
			}
			cur, present := obj[k]
			switch {
			case !present && fs.def != nil:
				set(k, fs.def)
			case present && cur != nil:
				if nv, changed := fs.fill(cur); changed {
					set(k, nv)
				}
			}
		}
		if out == nil {
			return v, false
		}
		return out, true
	case kindList:
		list, ok := v.([]any)
		if !ok || !s.elem.hasDefaults() {
			return v, false
		}
		var out []any
		for i, item := range list {
			nv, changed := s.elem.fill(item)
			if !changed {
				continue
			}
			if out == nil {
				out = append([]any(nil), list...)
			}
			out[i] = nv
		}
		if out == nil {
			return v, false
		}
		return out, true
	}
	return v, false
}

// hasDefaults reports whether s or anything below it declares a default
// (marked by markDefaults when the registry is built).
func (s *Schema) hasDefaults() bool { return s != nil && s.defaults }

// markDefaults records, on s and every schema below it, whether a default
// is declared there or below, so that filling skips the rest.
func (s *Schema) markDefaults() bool {
	if s == nil {
		return false
	}
	has := s.def != nil
	for _, f := range s.fields {
		has = f.markDefaults() || has
	}
	if s.elem != nil {
		has = s.elem.markDefaults() || has
	}
	s.defaults = has
	return has
}

// ConfDefaults fills the schema defaults of d's conf into one conf block
// (a default or an override; for route types, one rule), as the engine
// merges it. Nothing else holds the defaults.
func (d *TypeDescriptor) ConfDefaults(conf any) any {
	return d.Conf.FillDefaults(conf)
}
