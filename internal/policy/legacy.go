package policy

import (
	"cmp"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Legacy source/destination policies (docs/policy.md#legacy-policies): one policy of a
// type applies per connection, the most specific one.

// legacyKind says what a legacy type attaches to.
type legacyKind int

const (
	notLegacy       legacyKind = iota
	legacyInbound              // inbound connection policy: destinations select inbounds, sources filter clients
	legacyOutbound             // outbound connection policy: sources select the proxy, destinations its outbounds
	legacyDataplane            // dataplane policy: selectors select the proxy
)

// legacyKindOf classifies a type. Kuma documents TrafficPermission,
// FaultInjection and RateLimit as inbound connection policies and the other
// source/destination types as outbound ones. The TypeDescriptor does not
// carry this (yet), so the table lives here.
func legacyKindOf(d *resource.TypeDescriptor) legacyKind {
	switch d.Shape {
	case resource.ShapeLegacySelectors:
		return legacyDataplane
	case resource.ShapeLegacySourceDestination:
		switch d.Name {
		case "TrafficPermission", "FaultInjection", "RateLimit":
			return legacyInbound
		}
		return legacyOutbound
	}
	return notLegacy
}

// rank is a selector's specificity: (number of tags, number of exact
// values), compared in that order (Kuma's TagSelectorRank).
type rank struct{ tags, exact int }

func (r rank) plus(o rank) rank { return rank{r.tags + o.tags, r.exact + o.exact} }

func compareRank(a, b rank) int {
	return cmp.Or(cmp.Compare(a.tags, b.tags), cmp.Compare(a.exact, b.exact))
}

func selectorRank(match map[string]string) rank {
	r := rank{tags: len(match)}
	for _, v := range match {
		if v != "*" {
			r.exact++
		}
	}
	return r
}

// bestMatch is the highest rank of the selectors matching any tag set.
func bestMatch(sels []selector, sets ...map[string]string) (rank, bool) {
	var best rank
	found := false
	for _, sel := range sels {
		for _, tags := range sets {
			if !tagsMatch(sel.Match, tags) {
				continue
			}
			if r := selectorRank(sel.Match); !found || compareRank(r, best) > 0 {
				best, found = r, true
			}
		}
	}
	return best, found
}

// legacyWinner keeps the best candidate: higher rank, then newer
// creationTime; equal creation times (e.g. resources without one) fall back
// to the smaller name, as docs/policy.md#ordering keys 4 does, so the choice is stable.
type legacyWinner struct {
	p *policy
	r rank
}

func (w *legacyWinner) offer(p *policy, r rank) {
	if w.p == nil {
		w.p, w.r = p, r
		return
	}
	c := compareRank(r, w.r)
	if c == 0 {
		switch a, b := p.legacy.created, w.p.legacy.created; {
		case a.After(b):
			c = 1
		case a.Before(b):
			c = -1
		default:
			c = compareNames(p, w.p)
		}
	}
	if c > 0 {
		w.p, w.r = p, r
	}
}

// legacyForOutbound picks the outbound connection policy for dp's outbound:
// sources must match the proxy, destinations the outbound; ranks add up.
func legacyForOutbound(t *typeIndex, dp *dataplane, o *outbound) *policy {
	var w legacyWinner
	sets := dp.tagSets()
	for _, p := range t.policies {
		src, ok := bestMatch(p.legacy.sources, sets...)
		if !ok {
			continue
		}
		if dst, ok := bestMatch(p.legacy.destinations, o.tags); ok {
			w.offer(p, src.plus(dst))
		}
	}
	return w.p
}

// legacyForInbound picks the inbound connection policy of an inbound by its
// destinations alone: the client is not known when the inbound is
// configured, so of two equally specific policies the newer one wins and
// only its sources are allowed (the warning of docs/policy.md#legacy-policies).
func legacyForInbound(t *typeIndex, in *inbound) *policy {
	var w legacyWinner
	for _, p := range t.policies {
		if r, ok := bestMatch(p.legacy.destinations, in.tags); ok {
			w.offer(p, r)
		}
	}
	return w.p
}

// legacyForProxy picks the dataplane policy by its selectors.
func legacyForProxy(t *typeIndex, dp *dataplane) *policy {
	var w legacyWinner
	sets := dp.tagSets()
	for _, p := range t.policies {
		if r, ok := bestMatch(p.legacy.selectors, sets...); ok {
			w.offer(p, r)
		}
	}
	return w.p
}

// legacyApplied renders the selected policy: its conf, itself as origin.
func legacyApplied(p *policy) Applied {
	return Applied{Conf: canonicalJSON(p.legacyConf.conf), Origin: []Origin{p.legacyConf.origin()}}
}

// legacySourceRules shows an inbound policy's sources as rules: one per
// source selector, with the policy's conf. Unlike from-rules they may
// overlap; a '*' value matches any value of the key.
func legacySourceRules(p *policy) []Rule {
	ap := legacyApplied(p)
	rules := make([]Rule, 0, len(p.legacy.sources))
	for _, src := range p.legacy.sources {
		ms := []Matcher{}
		for _, k := range sortedKeys(src.Match) {
			ms = append(ms, Matcher{Key: k, Value: src.Match[k]})
		}
		rules = append(rules, Rule{Matchers: ms, Conf: ap.Conf, Origin: ap.Origin})
	}
	return rules
}

// sourcesMatch reports whether a client matches any of p's sources.
func sourcesMatch(p *policy, client map[string]string) bool {
	_, ok := bestMatch(p.legacy.sources, client)
	return ok
}
