package policy

import (
	"path/filepath"
	"testing"
)

// TestQuickSelectionAgrees: the summary matching reads (quickSel) decides
// exactly as selectsSection does, for every policy, Dataplane and section
// of every golden case (zones, namespaces, gateways, listeners, routes).
func TestQuickSelectionAgrees(t *testing.T) {
	t.Parallel()
	dirs, err := filepath.Glob("testdata/*/input.yaml")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	quick := map[quickKind]int{}
	for _, path := range dirs {
		_, snap := loadCase(t, path)
		for _, name := range snap.typeNames {
			ti := snap.types[name]
			for _, dp := range snap.dpList {
				matched := snap.matchedPolicies(ti, dp)
				for i, p := range ti.policies {
					quick[ti.quick[i].kind]++
					if want := snap.selectsDP(p, dp); matched[i] != want {
						t.Errorf("%s: %s %s on %s: matched %v, selectsDP %v", path, name, p.resName, dp.res.Name, matched[i], want)
					}
					for j := range dp.sections {
						sec := &dp.sections[j]
						if got, want := snap.selectsSectionAt(ti, i, dp, sec), snap.selectsSection(p, dp, sec, 0); got != want {
							t.Errorf("%s: %s %s on %s section %q (kind %d): quick %v, full %v", path, name, p.resName, dp.res.Name, sec.name, sec.kind, got, want)
						}
					}
				}
			}
		}
	}
	if quick[quickAll] == 0 || quick[quickService] == 0 || quick[quickNone] == 0 {
		t.Fatalf("the golden cases do not exercise every kind of summary: %v", quick)
	}
}
