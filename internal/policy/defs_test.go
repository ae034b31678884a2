package policy

import (
	"fmt"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestDefTableSharesOnlyEqualDefinitions parses two policies into one
// snapshot and checks which of their first to-entry's definitions are
// shared: equal content must share, any difference that output or a fold
// reads must not.
func TestDefTableSharesOnlyEqualDefinitions(t *testing.T) {
	const mesh = `{"targetRef":{"kind":"Mesh"},"to":[%s]}`
	tests := []struct {
		name                       string
		a, b                       string // the first to item of each
		shareContrib, shareEntry   bool
		specA, specB, typeA, typeB string // whole specs, when set
		// second compares b's second to item with a's first, fromB b's
		// first from item.
		second, fromB bool
	}{
		{name: "equal", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, shareContrib: true, shareEntry: true},
		{name: "equal, keys in another order", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s","connectionTimeout":"1s"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"1s","idleTimeout":"5s"}}`, shareContrib: true, shareEntry: true},
		{name: "other value", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"6s"}}`, shareEntry: true},
		{name: "other key", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"5s"}}`, shareEntry: true},
		{name: "nested object vs value", a: `{"targetRef":{"kind":"Mesh"},"default":{"http":{"requestTimeout":"5s"}}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"http":{"requestTimeout":"5s","idleTimeout":"1s"}}}`, shareEntry: true},
		{name: "other target", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, b: `{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"idleTimeout":"5s"}}`, shareContrib: true},
		{name: "with and without override", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"},"override":{"idleTimeout":"7s"}}`, shareContrib: true, shareEntry: true},
		{name: "strategy", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"},"strategy":{"default":"atomic"}}`, shareEntry: true},
		{name: "unset", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"},"unset":["connectionTimeout"]}`, shareEntry: true},
		{name: "other unset path", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"},"unset":["connectionTimeout"]}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"},"unset":["idleTimeout"]}`, shareEntry: true},
		{name: "to and from", typeA: "MeshTimeout", typeB: "MeshTimeout",
			specA: `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}]}`,
			specB: `{"targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}]}`, fromB: true, shareEntry: true},
		{name: "when is never shared", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"},"when":{"default":"true"}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"},"when":{"default":"true"}}`, shareEntry: true},
		{name: "list values", typeA: "MeshRetry", typeB: "MeshRetry",
			specA: `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"numRetries":3,"retryOn":["5xx","Reset"]}}}]}`,
			specB: `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"numRetries":3,"retryOn":["5xx","Reset"]}}}]}`, shareContrib: true, shareEntry: true},
		{name: "list order", typeA: "MeshRetry", typeB: "MeshRetry",
			specA: `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"retryOn":["5xx","Reset"]}}}]}`,
			specB: `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"retryOn":["Reset","5xx"]}}}]}`, shareEntry: true},
		{name: "number vs string", a: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":3}}`, b: `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"3"}}`, shareEntry: true},
		{name: "other entry", typeA: "MeshTimeout", typeB: "MeshTimeout",
			specA: `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}]}`,
			specB: `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}},{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5s"}}]}`, second: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typeA, typeB := "MeshTimeout", "MeshTimeout"
			specA, specB := fmt.Sprintf(mesh, tt.a), fmt.Sprintf(mesh, tt.b)
			if tt.specA != "" {
				typeA, typeB, specA, specB = tt.typeA, tt.typeB, tt.specA, tt.specB
			}
			s := mustSnapshot(t, "zone-1", []*resource.Resource{res(typeA, "a", specA), res(typeB, "b", specB)})
			pa, pb := parsedPolicyNamed(t, s, typeA, "a"), parsedPolicyNamed(t, s, typeB, "b")
			ea := pa.to[0]
			var eb *entry
			switch {
			case tt.second:
				eb = pb.to[1]
			case tt.fromB:
				eb = pb.from[0]
			default:
				eb = pb.to[0]
			}
			if got := ea.c.contributionDef == eb.c.contributionDef; got != tt.shareContrib {
				t.Errorf("default blocks shared = %v, want %v", got, tt.shareContrib)
			}
			if got := ea.entryDef == eb.entryDef; got != tt.shareEntry {
				t.Errorf("entries shared = %v, want %v", got, tt.shareEntry)
			}
			// A shared definition still says what its own policy wrote.
			for i, e := range []*entry{ea, eb} {
				want := 0
				if i == 1 && tt.second {
					want = 1
				}
				list := "to"
				if i == 1 && tt.fromB {
					list = "from"
				}
				if e.c.where() != fmt.Sprintf("%s[%d].default", list, want) || e.index != want || *e.c.origin().Entry != want {
					t.Errorf("%s: where %q, index %d, origin entry %d", e.pol.resName, e.c.where(), e.index, *e.c.origin().Entry)
				}
			}
		})
	}
}

// parsedPolicyNamed is the snapshot's parsed policy of that type and name.
func parsedPolicyNamed(t *testing.T, s *MeshSnapshot, typ, name string) *policy {
	t.Helper()
	if ti := s.types[typ]; ti != nil {
		for _, p := range ti.policies {
			if p.resName == name {
				return p
			}
		}
	}
	t.Fatalf("no parsed %s %s (warnings: %v)", typ, name, s.types[typ])
	return nil
}

func TestDefTableIsBounded(t *testing.T) {
	defs := newDefTable()
	first := defs.contributionDef(0, "to", blockDefault, compileConf("first"))
	for i := range maxSharedDefs + 10 {
		defs.contributionDef(0, "to", blockDefault, compileConf(fmt.Sprint(i)))
	}
	if n := len(defs.contribs); n > maxSharedDefs {
		t.Fatalf("table holds %d definitions, more than %d", n, maxSharedDefs)
	}
	if first.patch.value != "first" {
		t.Fatalf("a definition handed out before the table started afresh changed: %v", first.patch.value)
	}
	if again := defs.contributionDef(0, "to", blockDefault, compileConf(fmt.Sprint(maxSharedDefs+9))); again.patch.value != fmt.Sprint(maxSharedDefs+9) {
		t.Fatalf("a recent definition came back as %v", again.patch.value)
	}
}
