// Package plane is the identity of a control plane: whether it is the
// global or a zone, which zone, the zone's environment and the system
// namespace. cmd/global and cmd/zone build one Plane from their flags and
// every package that behaves differently per plane receives it; nothing
// else defaults or re-derives these values (docs/architecture.md#the-plane).
//
// The same type describes a peer: the global knows each connected zone as
// a Plane built from the zone's handshake.
package plane

import (
	"errors"
	"fmt"
)

// Mode says which kind of control plane runs.
type Mode string

const (
	Global Mode = "global"
	Zone   Mode = "zone"
)

// Zone environments: custom namespaces exist only in Kubernetes zones.
const (
	EnvKubernetes = "kubernetes"
	EnvUniversal  = "universal"
)

// DefaultSystemNamespace is the system namespace when none is configured,
// as in Kuma.
const DefaultSystemNamespace = "kuma-system"

// Plane is one control plane's identity. Build it with NewGlobal or
// NewZone; the zero value is not a valid plane.
type Plane struct {
	Mode Mode
	// Zone is the zone's name (zone planes only).
	Zone string
	// Environment is EnvKubernetes or EnvUniversal (zone planes only).
	Environment string
	// SystemNamespace is the namespace whose resources are the control
	// plane's own (no namespace); never empty in a built Plane.
	SystemNamespace string
	// Federated is a zone connected to a global: its meshes come from the
	// global.
	Federated bool
}

// NewGlobal is the global control plane's identity. An empty
// systemNamespace means DefaultSystemNamespace.
func NewGlobal(systemNamespace string) Plane {
	return Plane{Mode: Global, SystemNamespace: orDefault(systemNamespace)}
}

// NewZone is a zone's identity; it checks the zone name and environment.
// An empty systemNamespace means DefaultSystemNamespace.
func NewZone(zone, environment, systemNamespace string, federated bool) (Plane, error) {
	p := Plane{Mode: Zone, Zone: zone, Environment: environment, SystemNamespace: orDefault(systemNamespace), Federated: federated}
	return p, p.Check()
}

// Check reports what makes p unusable: an unknown mode, a zone without a
// name or with an unknown environment, an empty system namespace.
func (p Plane) Check() error {
	switch p.Mode {
	case Global:
	case Zone:
		if p.Zone == "" {
			return errors.New("--zone is required")
		}
		if p.Environment != EnvKubernetes && p.Environment != EnvUniversal {
			return fmt.Errorf("--environment must be %s or %s, got %q", EnvKubernetes, EnvUniversal, p.Environment)
		}
	default:
		return fmt.Errorf("unknown control plane mode %q", p.Mode)
	}
	if p.SystemNamespace == "" {
		return errors.New("the system namespace is empty")
	}
	return nil
}

// IsGlobal reports whether p is the global control plane.
func (p Plane) IsGlobal() bool { return p.Mode == Global }

// IsZone reports whether p is a zone control plane.
func (p Plane) IsZone() bool { return p.Mode == Zone }

// Origin is the kuma.io/origin value of the resources this plane writes.
func (p Plane) Origin() string {
	if p.Mode == Zone {
		return "zone"
	}
	return "global"
}

// AllowsNamespaces reports whether resources here may live in custom
// namespaces: only in Kubernetes zones.
func (p Plane) AllowsNamespaces() bool {
	return p.Mode == Zone && p.Environment == EnvKubernetes
}

// Namespace maps the system namespace to "" (no namespace) and keeps any
// other namespace.
func (p Plane) Namespace(ns string) string {
	if ns == p.SystemNamespace {
		return ""
	}
	return ns
}

func orDefault(ns string) string {
	if ns == "" {
		return DefaultSystemNamespace
	}
	return ns
}
