package main

import (
	"fmt"
	"strings"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// resolveType reads a type argument (name or plural, any case); an unknown
// one is an error suggesting the closest known type.
func (a *app) resolveType(s string) (*resource.TypeDescriptor, error) {
	if d, ok := a.reg.Resolve(s); ok {
		return d, nil
	}
	if best := a.closestType(s); best != "" {
		return nil, fmt.Errorf("unknown resource type %q: did you mean %s?", s, best)
	}
	return nil, fmt.Errorf("unknown resource type %q (known: %s)", s, strings.Join(a.reg.Names(), ", "))
}

// closestType is the type whose name or plural is nearest to s (edit
// distance, case-insensitive), if it is near enough to be a typo.
func (a *app) closestType(s string) string {
	low := strings.ToLower(s)
	best, bestDist := "", len(low)/3+2
	for _, name := range a.reg.Names() {
		d, _ := a.reg.Lookup(name)
		for _, cand := range []string{strings.ToLower(name), d.Plural} {
			if dist := editDistance(low, cand); dist < bestDist {
				best, bestDist = name, dist
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
