package resource

import "testing"

func TestRegistry(t *testing.T) {
	reg := NewDefaultRegistry()
	for _, name := range reg.Names() {
		d, _ := reg.Lookup(name)
		if p, ok := reg.LookupPlural(d.Plural); !ok || p != d {
			t.Errorf("%s: plural %q does not resolve", name, d.Plural)
		}
		for _, s := range []string{name, d.Plural} {
			if r, ok := reg.Resolve(s); !ok || r != d {
				t.Errorf("Resolve(%q) failed", s)
			}
		}
		switch d.Shape {
		case ShapeNone:
			if d.Spec == nil {
				t.Errorf("%s: no spec schema", name)
			}
		case ShapeTargetRef:
			if d.Conf == nil || len(d.TopLevelKinds) == 0 || (d.To && len(d.ToKinds) == 0) || (d.From && len(d.FromKinds) == 0) {
				t.Errorf("%s: incomplete targetRef descriptor", name)
			}
		default:
			if d.Spec == nil || !d.UniversalTopLevel {
				t.Errorf("%s: legacy policy without a spec schema", name)
			}
		}
	}
	if d, ok := reg.Resolve("meshtimeout"); !ok || d.Name != "MeshTimeout" {
		t.Error("case-insensitive Resolve failed")
	}
	if _, ok := reg.Resolve("nope"); ok {
		t.Error("Resolve found an unknown type")
	}
}

// TestDefaultTypesAreFresh: changing one registry's descriptors must not
// leak into another's.
func TestDefaultTypesAreFresh(t *testing.T) {
	a, b := NewDefaultRegistry(), NewDefaultRegistry()
	da, _ := a.Lookup("MeshTimeout")
	db, _ := b.Lookup("MeshTimeout")
	da.ToKinds[0] = "Changed"
	if db.ToKinds[0] == "Changed" {
		t.Error("descriptors share kind slices")
	}
	if da.Conf == db.Conf {
		t.Error("descriptors share conf schemas")
	}
}

func TestRedirectStatusCodes(t *testing.T) {
	f := httpRouteFilter()
	ok := f.Validate("f", mustParse(t, `{"type":"RequestRedirect","requestRedirect":{"statusCode":301,"scheme":"https","hostname":"example.com","port":443}}`))
	if len(ok) != 0 {
		t.Errorf("valid redirect: %q", renderCauses(ok))
	}
	bad := renderCauses(f.Validate("f", mustParse(t, `{"type":"RequestRedirect","requestRedirect":{"statusCode":304}}`)))
	if len(bad) != 1 || bad[0] != "f.requestRedirect.statusCode: invalid value 304: must be one of 301, 302, 303, 307, 308" {
		t.Errorf("invalid redirect: %q", bad)
	}
}

func TestDisplayName(t *testing.T) {
	r := &Resource{Name: "x-123"}
	if r.DisplayName() != "x-123" {
		t.Error(r.DisplayName())
	}
	r.Labels = NewLabels(map[string]string{LabelDisplayName: "x"})
	if r.DisplayName() != "x" {
		t.Error(r.DisplayName())
	}
}
