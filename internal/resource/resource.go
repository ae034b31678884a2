// Package resource defines Meridian's resource envelope, the registry of resource
// types, the YAML/JSON codecs and per-type validation. It depends on nothing else
// in the project; every other package speaks in terms of these types.
package resource

import (
	"encoding/json"
	"fmt"
	"time"
)

// Labels the system reads or writes (docs/resources.md).
const (
	LabelOrigin      = "kuma.io/origin"
	LabelZone        = "kuma.io/zone"
	LabelDisplayName = "kuma.io/display-name"
	LabelNamespace   = "k8s.kuma.io/namespace"
	LabelPolicyRole  = "kuma.io/policy-role"
	LabelKDSSync     = "kuma.io/kds-sync"
	LabelMesh        = "kuma.io/mesh"
	// LabelEffect "shadow" keeps a policy out of what proxies get: it
	// shows only in the shadow view (docs/dataplane.md#shadow), as in Kuma.
	LabelEffect = "kuma.io/effect"

	OriginGlobal = "global"
	OriginZone   = "zone"
	EffectShadow = "shadow"
)

// Key identifies a resource: (type, mesh, namespace, name). Mesh is empty for
// global-scoped types (Mesh, Zone). Namespace is empty for the system namespace.
type Key struct {
	Type      string
	Mesh      string
	Namespace string
	Name      string
}

func (k Key) String() string {
	s := k.Type + " "
	if k.Mesh != "" {
		s += k.Mesh + "/"
	}
	if k.Namespace != "" {
		s += k.Namespace + "/"
	}
	return s + k.Name
}

// Resource is the envelope of every stored object. Spec holds the type-specific
// body as compact JSON; for legacy types it holds the fields that Kuma's
// Universal format puts at the top level (e.g. Dataplane's networking).
//
// A Resource is treated as immutable once handed to another package: copy it
// (Clone) before changing it.
type Resource struct {
	Type      string          `json:"type"`
	Mesh      string          `json:"mesh,omitempty"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace,omitempty"`
	Labels    Labels          `json:"labels,omitzero"`
	Spec      json.RawMessage `json:"spec,omitempty"`
	Status    json.RawMessage `json:"status,omitempty"`

	// Read-only, set by the store.
	CreationTime     time.Time `json:"creationTime"`
	ModificationTime time.Time `json:"modificationTime"`
	// Version counts the writes to this resource, starting at 1 on create. A
	// write that carries a non-zero Version must match the stored one.
	Version uint64 `json:"version"`
}

// Key returns the resource's identity.
func (r *Resource) Key() Key {
	return Key{Type: r.Type, Mesh: r.Mesh, Namespace: r.Namespace, Name: r.Name}
}

// Clone returns a deep copy.
func (r *Resource) Clone() *Resource {
	c := *r // Labels are never written in place: the copy may share them
	if r.Spec != nil {
		c.Spec = append(json.RawMessage(nil), r.Spec...)
	}
	if r.Status != nil {
		c.Status = append(json.RawMessage(nil), r.Status...)
	}
	return &c
}

// DisplayName is the kuma.io/display-name label, else the name.
func (r *Resource) DisplayName() string {
	if d := r.Labels.Get(LabelDisplayName); d != "" {
		return d
	}
	return r.Name
}

// FieldError is one problem with one field, named by its path
// (e.g. "spec.to[1].default.connectionTimeout").
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// ValidationError carries every field problem found in one resource.
type ValidationError struct {
	Causes []FieldError
}

func (e *ValidationError) Error() string {
	if len(e.Causes) == 0 {
		return "invalid resource"
	}
	s := "invalid resource: " + e.Causes[0].Field + ": " + e.Causes[0].Message
	if n := len(e.Causes) - 1; n > 0 {
		s += fmt.Sprintf(" (and %d more)", n)
	}
	return s
}

// Add records a problem with field.
func (e *ValidationError) Add(field, format string, args ...any) {
	e.Causes = append(e.Causes, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// OrNil returns e if it holds any cause, else nil, so that callers can return it
// as an error without a typed-nil trap.
func (e *ValidationError) OrNil() error {
	if e == nil || len(e.Causes) == 0 {
		return nil
	}
	return e
}

// Naming is what a person is shown to name a resource (messages, tables,
// the console): the namespace and name its author wrote and, for a synced
// copy stored under a hashed name, where it came from. Its String is the
// one rendering of display names: "web-ns/timeouts (zone zone-1)",
// "guardrail (global)", "backend-timeouts".
type Naming struct {
	// Name and Namespace are the stored ones.
	Name, Namespace string
	// Labels reads the resource's labels (kuma.io/display-name,
	// kuma.io/origin, kuma.io/zone, k8s.kuma.io/namespace).
	Labels func(key string) string
}

// NamingOf is r's Naming.
func NamingOf(r *Resource) Naming {
	return Naming{Name: r.Name, Namespace: r.Namespace, Labels: r.Labels.Get}
}

// NamingFromMap is the Naming of a resource known by its name, namespace
// and label map (a decoded API response).
func NamingFromMap(name, namespace string, labels map[string]string) Naming {
	return Naming{Name: name, Namespace: namespace, Labels: func(k string) string { return labels[k] }}
}

// Synced reports whether the resource is a copy stored under another name
// than its author gave it.
func (n Naming) Synced() bool {
	d := n.Labels(LabelDisplayName)
	return d != "" && d != n.Name
}

func (n Naming) String() string {
	if !n.Synced() {
		return qualifiedName(n.Namespace, n.Name)
	}
	ns := n.Namespace
	if src := n.Labels(LabelNamespace); src != "" {
		ns = src // the namespace it was written in, in its zone
	}
	s := qualifiedName(ns, n.Labels(LabelDisplayName))
	switch z := n.Labels(LabelZone); {
	case n.Labels(LabelOrigin) == OriginGlobal:
		s += " (global)"
	case z != "":
		s += " (zone " + z + ")"
	}
	return s
}

func qualifiedName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}
