package console

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// The API's JSON as the pages read it (SPEC 5 shapes; unknown fields are
// ignored, so the API may grow).

type meta struct {
	Type      string            `json:"type"`
	Mesh      string            `json:"mesh"`
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
	Entry     *int              `json:"entry,omitempty"`
}

// Origin is the kuma.io/origin label ("global" or "zone").
func (m meta) Origin() string { return m.Labels["kuma.io/origin"] }

// Ref names the resource as a user would: namespace/name, with the name its
// author gave it (kuma.io/display-name) when it is a synced copy stored
// under a hashed name.
func (m meta) Ref() string {
	n := resource.NamingFromMap(m.Name, m.Namespace, m.Labels)
	if n.Synced() {
		return n.String() + ", stored as " + m.Name
	}
	return n.String()
}

// Provenance says where a policy comes from: "global", or "zone z".
func (m meta) Provenance() string {
	switch o := m.Origin(); {
	case o == "zone" && m.Labels["kuma.io/zone"] != "":
		return "zone " + m.Labels["kuma.io/zone"]
	default:
		return o
	}
}

type list[T any] struct {
	Total int `json:"total"`
	Items []T `json:"items"`
}

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// stored is a resource as GET returns it (the spec is read by the types
// embedding it, or shown as the raw document).
type stored struct {
	meta
	CreationTime     time.Time `json:"creationTime"`
	ModificationTime time.Time `json:"modificationTime"`
	Version          uint64    `json:"version"`
	Status           struct {
		Conditions []condition `json:"conditions"`
	} `json:"status"`
}

// Condition returns the condition of type t ("" status when absent).
func (s stored) Condition(t string) condition {
	for _, c := range s.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return condition{Type: t}
}

type dataplane struct {
	stored
	Networking struct {
		Address string `json:"address"`
		Inbound []struct {
			Port int               `json:"port"`
			Name string            `json:"name"`
			Tags map[string]string `json:"tags"`
		} `json:"inbound"`
		Outbound []struct {
			Port int               `json:"port"`
			Tags map[string]string `json:"tags"`
		} `json:"outbound"`
	} `json:"networking"`
}

type matcher struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	Not   bool   `json:"not"`
}

type rule struct {
	Matchers []matcher      `json:"matchers"`
	Conf     map[string]any `json:"conf"`
	Origin   []meta         `json:"origin"`
}

// Subset is the rule's client subset in words.
func (r rule) Subset() string {
	if len(r.Matchers) == 0 {
		return "every client"
	}
	parts := make([]string, 0, len(r.Matchers))
	for _, m := range r.Matchers {
		op := "="
		if m.Not {
			op = "≠"
		}
		parts = append(parts, m.Key+" "+op+" "+m.Value)
	}
	return strings.Join(parts, ", ")
}

// Action is a MeshTrafficPermission rule's decision in words and its
// class for the page's colours.
func (r rule) Action() (string, string) {
	a, _ := r.Conf["action"].(string)
	return actionWords(a)
}

func actionWords(a string) (string, string) {
	switch strings.ToUpper(strings.ReplaceAll(a, "-", "_")) {
	case "ALLOW":
		return "allowed", "allow"
	case "DENY":
		return "denied", "deny"
	case "ALLOW_WITH_SHADOW_DENY", "ALLOWWITHSHADOWDENY":
		return "allowed (shadow deny: logged as denied)", "shadow"
	}
	return a, ""
}

type typeConf struct {
	Conf   json.RawMessage `json:"conf"`
	Origin []meta          `json:"origin"`
	Rules  []rule          `json:"rules"`
}

type config struct {
	Dataplane meta `json:"dataplane"`
	Inbounds  []struct {
		Port     int                 `json:"port"`
		Tags     map[string]string   `json:"tags"`
		Policies map[string]typeConf `json:"policies"`
	} `json:"inbounds"`
	Outbounds []struct {
		Port     int                 `json:"port"`
		Service  string              `json:"service"`
		Tags     map[string]string   `json:"tags"`
		Policies map[string]typeConf `json:"policies"`
	} `json:"outbounds"`
	Proxy map[string]typeConf `json:"proxy"`
}

// describe names a block of an explanation (policy.BlockRef, by value or
// pointer): the policy as its author named it, where it comes from, the
// entry and the block.
func describe(v any) string {
	var b *policy.BlockRef
	switch x := v.(type) {
	case *policy.BlockRef:
		b = x
	case policy.BlockRef:
		b = &x
	}
	if b == nil {
		return "—"
	}
	m := meta{Type: b.Policy.Type, Mesh: b.Policy.Mesh, Name: b.Policy.Name, Namespace: b.Policy.Namespace, Labels: b.Policy.Labels.Map()}
	s := m.Ref()
	if p := m.Provenance(); p != "" {
		s += " [" + p + "]"
	}
	if b.Entry != nil {
		s += fmt.Sprintf(" entry %d", *b.Entry)
	}
	if b.Block != "" {
		s += " (" + b.Block + ")"
	}
	return s
}

type evaluation struct {
	Inbound  int                 `json:"inbound"`
	Client   map[string]string   `json:"client"`
	Policies map[string]typeConf `json:"policies"`
}

// zoneStatus is GET /zones' item: the sync package's status with the
// API's name and, in the overview, the resources the zone rejected.
type zoneStatus struct {
	Name string `json:"name"`
	kds.ZoneStatus
	Rejected []struct {
		Type, Mesh, Namespace, Name, Message string
	} `json:"rejected"`
}
