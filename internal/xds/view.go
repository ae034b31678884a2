package xds

import (
	"encoding/json"
	"time"

	"github.com/meridian-mesh/meridian/internal/meshca"
)

// View is a Dataplane's `_xds` document (docs/api.md#xds): its agent, its
// xDS stream, the mesh's mTLS, and what its proxy gets now.
type View struct {
	Node string `json:"node"`
	// Proxy is the kind of proxy rendered for (grpc).
	Proxy      string         `json:"proxy"`
	Agent      AgentStatus    `json:"agent"`
	Connection NodeStatus     `json:"connection"`
	MTLS       meshca.MeshTLS `json:"mtls"`
	// ConfigDump is what the proxy gets, in the shape of Envoy's admin
	// config dump, with each type's version.
	ConfigDump json.RawMessage `json:"configDump"`
	// Policies are the policies behind each resource, by type URL and
	// resource name.
	Policies map[string]map[string][]string `json:"policies,omitempty"`
	// Dropped are the policy fields the proxy cannot carry, left out of
	// its resources (docs/dataplane.md#not-enforceable).
	Dropped []string `json:"dropped,omitempty"`
}

// AgentStatus is what the zone knows of a Dataplane's agent (meridian-dp).
type AgentStatus struct {
	Connected bool      `json:"connected"`
	Since     time.Time `json:"since,omitzero"`
	Version   string    `json:"version,omitempty"`
	// Token is the id of the Dataplane token the agent joined with.
	Token string `json:"token,omitempty"`
	// LeftAt: the agent left then; the Dataplane goes at LeftAt+grace.
	LeftAt time.Time `json:"leftAt,omitzero"`
}
