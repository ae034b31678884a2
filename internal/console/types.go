package console

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// The stored resources as the pages read them (unknown fields are ignored,
// so the API may grow); the other responses decode into the server's own
// types (api.List, api.ZoneItem, package policy's results).

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

// subsetWords is a rule's client subset in words.
func subsetWords(r policy.Rule) string {
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

// ruleAction is a MeshTrafficPermission rule's decision in words and its
// class for the page's colours.
func ruleAction(r policy.Rule) (string, string) {
	var conf struct {
		Action string `json:"action"`
	}
	_ = json.Unmarshal(r.Conf, &conf)
	return actionWords(conf.Action)
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
	m := metaOf(b.Policy)
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

// metaOf is the page's view of an engine result's resource reference.
func metaOf(m policy.Meta) meta {
	return meta{Type: m.Type, Mesh: m.Mesh, Name: m.Name, Namespace: m.Namespace, Labels: m.Labels.Map()}
}
