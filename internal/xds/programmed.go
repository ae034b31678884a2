package xds

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// A policy's Programmed condition (docs/dataplane.md#programmed) says
// whether the connected proxies carry it: True when it selects connected
// proxies and none is left without part of it; False with reason
// PartiallyProgrammed when some of it is left out somewhere (naming the
// proxies and fields), NotProgrammed when no proxy carries any of it. A
// policy that selects no connected proxy and is left out of none has no
// such condition. Only what is left out is indexed per proxy (a few
// entries): a policy carried whole is known by the proxies it selects,
// so a zone with 10,000 policies and 1,000 proxies keeps no
// policy × proxy table.

// Programmed condition type and reasons.
const (
	CondProgrammed       = "Programmed"
	ReasonProgrammed     = "Programmed"
	ReasonPartially      = "PartiallyProgrammed"
	ReasonNotProgrammed  = "NotProgrammed"
	maxProgrammedDetails = 10
)

type meshPolicy struct {
	mesh string
	ref  PolicyRef
}

// programmedIndex aggregates, per policy, what the renderings of the
// connected proxies did with it. Safe for concurrent use: the controller
// writes, the API reads.
type programmedIndex struct {
	mu       sync.Mutex
	byPolicy map[meshPolicy]map[string]*Touch // proxy (namespace/name) → touch
	byNode   map[string][]meshPolicy          // node id → its policies
	// version moves whenever the index changes.
	version uint64
}

func newProgrammedIndex() *programmedIndex {
	return &programmedIndex{byPolicy: map[meshPolicy]map[string]*Touch{}, byNode: map[string][]meshPolicy{}}
}

// set replaces what node's rendering did with each policy.
func (p *programmedIndex) set(id Identity, touched map[PolicyRef]*Touch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked(id)
	if len(touched) > 0 {
		p.version++
	}
	proxy := proxyName(id)
	for ref, t := range touched {
		k := meshPolicy{id.Mesh, ref}
		if p.byPolicy[k] == nil {
			p.byPolicy[k] = map[string]*Touch{}
		}
		p.byPolicy[k][proxy] = t
		p.byNode[id.NodeID] = append(p.byNode[id.NodeID], k)
	}
}

// versionNow is the index's version.
func (p *programmedIndex) versionNow() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.version
}

// has says some proxy left part of the policy out.
func (p *programmedIndex) has(mesh string, ref PolicyRef) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byPolicy[meshPolicy{mesh, ref}]) > 0
}

// empty says nothing is left out anywhere.
func (p *programmedIndex) empty() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byPolicy) == 0
}

// forget drops a node that is gone.
func (p *programmedIndex) forget(id Identity) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked(id)
}

func (p *programmedIndex) forgetLocked(id Identity) {
	if len(p.byNode[id.NodeID]) > 0 {
		p.version++
	}
	proxy := proxyName(id)
	for _, k := range p.byNode[id.NodeID] {
		delete(p.byPolicy[k], proxy)
		if len(p.byPolicy[k]) == 0 {
			delete(p.byPolicy, k)
		}
	}
	delete(p.byNode, id.NodeID)
}

// condition is the Programmed condition of a policy of mesh that selects
// selected connected proxies; false when there is nothing to say.
func (p *programmedIndex) condition(mesh string, ref PolicyRef, selected int) (policy.Condition, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	proxies := p.byPolicy[meshPolicy{mesh, ref}]
	if len(proxies) == 0 {
		if selected == 0 {
			return policy.Condition{}, false
		}
		return policy.Condition{Type: CondProgrammed, Status: "True", Reason: ReasonProgrammed,
			Message: fmt.Sprintf("given to the %d connected proxies it selects", selected)}, true
	}
	names := make([]string, 0, len(proxies))
	for n := range proxies {
		names = append(names, n)
	}
	slices.Sort(names)
	carried, partial := max(selected-len(proxies), 0), 0
	var details []string
	for _, n := range names {
		t := proxies[n]
		if t.Carried {
			carried++
		}
		if len(t.Dropped) > 0 {
			partial++
			for _, d := range t.Dropped {
				if len(details) < maxProgrammedDetails {
					details = append(details, n+": "+d)
				}
			}
		}
	}
	c := policy.Condition{Type: CondProgrammed}
	switch {
	case partial == 0:
		c.Status, c.Reason = "True", ReasonProgrammed
		c.Message = fmt.Sprintf("given to the %d connected proxies it selects", max(selected, carried))
	case carried == 0:
		c.Status, c.Reason = "False", ReasonNotProgrammed
		c.Message = "no connected proxy can carry it: " + strings.Join(details, "; ")
	default:
		c.Status, c.Reason = "False", ReasonPartially
		c.Message = fmt.Sprintf("%d connected proxies carry only part of it: %s", partial, strings.Join(details, "; "))
	}
	if n := countDropped(proxies); n > len(details) {
		c.Message += fmt.Sprintf("; and %d more", n-len(details))
	}
	return c, true
}

func countDropped(proxies map[string]*Touch) int {
	n := 0
	for _, t := range proxies {
		n += len(t.Dropped)
	}
	return n
}

// proxyName is how a condition names a proxy: its Dataplane's name, with
// its namespace outside the system namespace.
func proxyName(id Identity) string {
	if id.Namespace != "" {
		return id.Namespace + "/" + id.Name
	}
	return id.Name
}
