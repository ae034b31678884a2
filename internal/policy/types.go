package policy

import (
	"encoding/json"
	"errors"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// ErrNotFound is returned (wrapped) when a query names a Dataplane, an
// inbound, an outbound or a policy the snapshot does not hold. Handlers map
// it to 404 with errors.Is.
var ErrNotFound = errors.New("not found")

// Meta identifies a resource in inspect output (docs/api.md). Every key is always
// present so that the shape never changes: Namespace is "" for the system
// namespace and Labels is {} when there are none.
type Meta struct {
	Type      string          `json:"type"`
	Mesh      string          `json:"mesh"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Labels    resource.Labels `json:"labels"`
}

// Origin is one contribution to a merged conf: the policy, plus the index of
// the to/from entry that carried the conf (absent for proxy-wide and legacy
// policies). Origins are listed in apply order (docs/policy.md#ordering): the last one won
// where they disagree.
type Origin struct {
	Meta
	Entry *int `json:"entry,omitempty"`
	// Block is "override" for an override block (docs/policy.md#defaults-and-overrides); absent for
	// defaults, so plain policies keep docs/api.md's shape.
	Block string `json:"block,omitempty"`
	// List is "rules" when Entry indexes spec.rules (Kuma 2.10+ inbound
	// rules); absent for to/from entries.
	List string `json:"list,omitempty"`
}

// Matcher is one condition on a client's tags: tag Key equals Value, or,
// with Not, the client does not carry Key=Value (it may lack Key).
type Matcher struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	Not   bool   `json:"not"`
}

// Rule is a conjunction of matchers with the conf every client it matches
// gets. The rules of one inbound are pairwise disjoint (docs/policy.md#rule-views). An empty
// Matchers list matches every client.
type Rule struct {
	Matchers []Matcher       `json:"matchers"`
	Conf     json.RawMessage `json:"conf"`
	Origin   []Origin        `json:"origin"`
	lazy     lazyOrigin
}

// lazyOrigin holds, in a `_rules` result, the blocks an origin is written
// from instead of the Origin values: a proxy matched by 100,000 policies
// has as many origins per target, 13 MB of Origin values a zone allocated
// per query only to encode them (RulesResult's encoder writes them from
// the blocks). Results other views return carry Origin.
type lazyOrigin struct {
	set    bool
	blocks []*contribution
}

// Applied is a merged conf with its origin. Conf is canonical JSON (object
// keys sorted).
type Applied struct {
	Conf   json.RawMessage `json:"conf"`
	Origin []Origin        `json:"origin"`
	lazy   lazyOrigin
}

// RouteConf is the conf a policy type gives traffic on one route of an
// outbound: the outbound-level entries plus the entries naming the route,
// merged in the order of docs/policy.md#ordering.
type RouteConf struct {
	Route  Meta            `json:"route"`
	Conf   json.RawMessage `json:"conf"`
	Origin []Origin        `json:"origin"`
	lazy   lazyOrigin
}

// InboundRef names an inbound in rule views: its port and its effective
// tags (including the implicit kuma.io/zone and k8s.kuma.io/namespace).
type InboundRef struct {
	Port int               `json:"port"`
	Tags map[string]string `json:"tags"`
}

// OutboundRef names an outbound in rule views.
type OutboundRef struct {
	Port    int               `json:"port"`
	Address string            `json:"address,omitempty"`
	Service string            `json:"service"`
	Tags    map[string]string `json:"tags"`
}

// FromRules are the rules of one policy type on one inbound.
type FromRules struct {
	Inbound InboundRef `json:"inbound"`
	Rules   []Rule     `json:"rules"`
}

// ToRule is what one policy type gives one outbound. Conf is null when only
// route-level entries apply.
type ToRule struct {
	Outbound OutboundRef     `json:"outbound"`
	Conf     json.RawMessage `json:"conf"`
	Origin   []Origin        `json:"origin"`
	Routes   []RouteConf     `json:"routes,omitempty"`
	lazy     lazyOrigin
}

// TypeRules is the `_rules` view of one policy type on one Dataplane.
type TypeRules struct {
	Type      string      `json:"type"`
	Warnings  []string    `json:"warnings"`
	ProxyRule *Applied    `json:"proxyRule"`
	ToRules   []ToRule    `json:"toRules"`
	FromRules []FromRules `json:"fromRules"`
}

// RulesResult is the `_rules` response (docs/api.md). Rules holds one item per
// policy type that gives the Dataplane anything or has warnings for it,
// sorted by type name. Warnings are about the Dataplane itself. Its origins
// are written by its JSON encoding (AppendJSON, WriteJSON, MarshalJSON),
// not held as Origin values: read them from the JSON.
type RulesResult struct {
	Resource Meta        `json:"resource"`
	Rules    []TypeRules `json:"rules"`
	Warnings []string    `json:"warnings,omitempty"`
}

// OutboundPolicy is one policy type's effect on an outbound.
type OutboundPolicy struct {
	Conf   json.RawMessage `json:"conf"`
	Origin []Origin        `json:"origin"`
	Routes []RouteConf     `json:"routes,omitempty"`
	lazy   lazyOrigin
	result uint64
}

// ResultID identifies the computation p comes from: values with the same
// non-zero id, from this snapshot or the ones built from it, have equal
// confs, origins and routes. The xDS rendering reuses what it rendered
// from an id it has seen in the same lineage (ConfigResult.Lineage); 0
// says nothing.
func (p OutboundPolicy) ResultID() uint64 { return p.result }

// InboundPolicy is one policy type's rules on an inbound.
type InboundPolicy struct {
	Rules []Rule `json:"rules"`
}

// RBACFilter is the pair of Envoy network RBAC configs of one inbound.
type RBACFilter struct {
	Rules       *RBAC `json:"rules"`
	ShadowRules *RBAC `json:"shadow_rules"`
}

// InboundConfig is one inbound in the `_config` response.
type InboundConfig struct {
	Port     int                      `json:"port"`
	Tags     map[string]string        `json:"tags"`
	Policies map[string]InboundPolicy `json:"policies"`
	RBAC     RBACFilter               `json:"rbac"`
}

// OutboundConfig is one outbound in the `_config` response.
type OutboundConfig struct {
	Port    int               `json:"port"`
	Service string            `json:"service"`
	Tags    map[string]string `json:"tags"`
	// Policies point to values that outbounds with the same result
	// share; they are read-only.
	Policies map[string]*OutboundPolicy `json:"policies"`
}

// ConfigResult is the `_config` response (docs/api.md).
type ConfigResult struct {
	Dataplane Meta               `json:"dataplane"`
	Inbounds  []InboundConfig    `json:"inbounds"`
	Outbounds []OutboundConfig   `json:"outbounds"`
	Proxy     map[string]Applied `json:"proxy"`
	Warnings  []string           `json:"warnings,omitempty"`
	lineage   uint64
}

// Lineage identifies the snapshots whose ResultIDs may be compared with
// this result's: the snapshot it comes from and those built from it, or
// it was built from, by changes. A snapshot built from every resource (a
// mesh reloaded from the store) starts a lineage of its own, whose ids
// restart and may equal the other's for other results.
func (r *ConfigResult) Lineage() uint64 { return r.lineage }

// InboundEvaluation is the `_evaluate?inbound=PORT&client=...` response: the
// conf each inbound policy type gives that client. A type that gives the
// client nothing is absent.
type InboundEvaluation struct {
	Inbound  int                `json:"inbound"`
	Client   map[string]string  `json:"client"`
	Policies map[string]Applied `json:"policies"`
}

// OutboundEvaluation is the `_evaluate?outbound=SERVICE` response.
type OutboundEvaluation struct {
	Outbound string                    `json:"outbound"`
	Policies map[string]OutboundPolicy `json:"policies"`
}
