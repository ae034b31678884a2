package resource

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/meridian-mesh/meridian/internal/plane"
)

// Validate checks a resource's envelope and spec and returns a
// *ValidationError carrying every problem found, or nil.
func (reg *Registry) Validate(r *Resource, opts plane.Plane) error {
	errs := &ValidationError{}
	d, ok := reg.Lookup(r.Type)
	switch {
	case r.Type == "":
		errs.Add("type", "must be set")
	case !ok:
		errs.Add("type", "unknown resource type %q", r.Type)
	}
	validateName(r.Name, errs)
	validateLabels(r.Labels, errs)
	if d == nil {
		return errs.OrNil()
	}
	validateMesh(d, r.Mesh, errs)
	if m, ok := r.Labels.Lookup(LabelMesh); ok && d.Scope == ScopeMesh && m != r.Mesh {
		errs.Add("labels["+strconv.Quote(LabelMesh)+"]", "%q does not match the resource's mesh %q", m, r.Mesh)
	}
	validateNamespace(d, r.Namespace, opts, errs)
	reg.validateSpec(d, r, opts, errs)
	return errs.OrNil()
}

func validateName(name string, errs *ValidationError) {
	switch {
	case name == "":
		errs.Add("name", "must be set")
	case !isResourceName(name):
		errs.Add("name", "invalid name %q: must be a lowercase RFC 1123 subdomain of at most 253 characters", name)
	}
}

func validateMesh(d *TypeDescriptor, mesh string, errs *ValidationError) {
	switch {
	case d.Scope == ScopeGlobal && mesh != "":
		errs.Add("mesh", "must not be set for type %s", d.Name)
	case d.Scope == ScopeMesh && mesh == "":
		errs.Add("mesh", "must be set")
	case d.Scope == ScopeMesh && !isDNSLabel(mesh):
		errs.Add("mesh", "invalid mesh name %q: must be a lowercase RFC 1123 label of at most 63 characters", mesh)
	}
}

func validateLabels(labels Labels, errs *ValidationError) {
	for k, v := range labels.All() {
		// The field name is made only for a problem: every resource a
		// zone receives passes through here with its labels.
		field := func() string { return "labels[" + strconv.Quote(k) + "]" }
		if msg := labelKeyProblem(k); msg != "" {
			errs.Add(field(), "%s", msg)
		}
		if msg := labelValueProblem(k, v); msg != "" {
			errs.Add(field(), "%s", msg)
		}
		if allowed := knownLabelValues(k); allowed != nil && !contains(allowed, v) {
			errs.Add(field(), "invalid value %q: must be one of %s", v, strings.Join(allowed, ", "))
		}
	}
}

// knownLabelValues lists the values of labels the system reads (docs/resources.md).
func knownLabelValues(key string) []string {
	switch key {
	case LabelOrigin:
		return []string{OriginGlobal, OriginZone}
	case LabelPolicyRole:
		return []string{RoleSystem, RoleProducer, RoleConsumer, RoleWorkloadOwner}
	}
	return nil
}

// validateNamespace: custom namespaces exist only in Kubernetes zones, and
// only for namespace-scoped types. Mesh, Zone, legacy policies,
// MeshGateway, MeshExternalService and MeshOpenTelemetryBackend live in the
// system namespace.
func validateNamespace(d *TypeDescriptor, ns string, opts plane.Plane, errs *ValidationError) {
	if isSystemNamespace(ns, opts.SystemNamespace) {
		return
	}
	switch {
	case !isDNSLabel(ns):
		errs.Add("namespace", "invalid namespace %q: must be a lowercase RFC 1123 label of at most 63 characters", ns)
	case !opts.AllowsNamespaces():
		errs.Add("namespace", "namespace %q is not allowed: only zones with the kubernetes environment have namespaces other than %q",
			ns, opts.SystemNamespace)
	case !namespaced(d):
		errs.Add("namespace", "%s must be in the system namespace %q", d.Name, opts.SystemNamespace)
	}
}

// namespaced reports whether a type may live in a custom namespace.
func namespaced(d *TypeDescriptor) bool {
	switch {
	case d.Scope == ScopeGlobal, d.Shape == ShapeLegacySourceDestination, d.Shape == ShapeLegacySelectors:
		return false
	case d.Name == "MeshGateway", d.Name == "MeshExternalService", d.Name == "MeshOpenTelemetryBackend":
		return false
	}
	return true
}

func (reg *Registry) validateSpec(d *TypeDescriptor, r *Resource, opts plane.Plane, errs *ValidationError) {
	// The tree is only read here, and the problems found are words: it
	// goes back to the pool when validation is done.
	s := reg.scratch.get()
	spec, err := decodeSpec(r.Spec, reg.vocab, s)
	defer func() { reg.scratch.put(s, spec) }()
	if err != nil {
		errs.Add("spec", "%v", err)
		return
	}
	if d.Shape == ShapeTargetRef {
		obj, ok := spec.(map[string]any)
		if !ok {
			errs.Add("spec", "must be an object, got %s", jsonType(spec))
			return
		}
		validateTargetRefPolicy(reg.cond, d, r, obj, opts.SystemNamespace, errs)
		return
	}
	if d.Spec != nil {
		d.Spec.validate("spec", spec, errs)
	}
}

// decodeSpec parses a stored spec; an absent or null spec is an empty object.
func decodeSpec(raw json.RawMessage, names internTable, s *scratch) (any, error) {
	v, err := parseJSONScratch(raw, names, s)
	if v == nil && err == nil {
		return s.object(), nil
	}
	return v, err
}

// decodeSpecObject parses a stored spec that must be an object.
func decodeSpecObject(raw json.RawMessage) (map[string]any, error) {
	v, err := decodeSpec(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("spec must be an object, got %s", jsonType(v))
	}
	return obj, nil
}

// Normalize brings a decoded resource to its canonical stored form: the
// system namespace is written as "" (docs/resources.md: absent = the system namespace),
// and spec and status are re-encoded compactly with sorted keys, so equal
// resources have equal bytes. Invalid JSON is left for Validate to report.
func (reg *Registry) Normalize(r *Resource, systemNamespace string) {
	if isSystemNamespace(r.Namespace, systemNamespace) {
		r.Namespace = ""
	}
	r.Spec = reg.canonicalOrSame(r.Spec)
	r.Status = reg.canonicalOrSame(r.Status)
}

// canonicalOrSame re-encodes raw canonically. The parsed tree is dropped
// once encoded (the bytes do not share it), so it comes from the pool.
func (reg *Registry) canonicalOrSame(raw json.RawMessage) json.RawMessage {
	s := reg.scratch.get()
	v, err := parseJSONScratch(raw, reg.vocab, s)
	defer func() { reg.scratch.put(s, v) }()
	if err != nil {
		return raw
	}
	if v == nil {
		return nil
	}
	out, err := canonicalJSON(v)
	if err != nil {
		return raw
	}
	return out
}
