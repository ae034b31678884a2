package policy

import (
	"path/filepath"
	"slices"
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
			checkSummary(t, path+": "+name, ti)
			for _, dp := range snap.dpList {
				matched := snap.matchedPolicies(ti, dp)
				if every := !slices.Contains(matched, false); every != ti.matchesEvery(matched) || every && len(matched) > 0 && &matched[0] != &ti.allMatched()[0] {
					t.Errorf("%s: %s on %s: every policy matched %v, but not the type's shared list", path, name, dp.res.Name, every)
				}
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

// checkSummary: a type's summary lists exactly its policies with warnings,
// and its runs cover its policies in order, each run's policies selecting
// alike.
func checkSummary(t *testing.T, where string, ti *typeIndex) {
	t.Helper()
	for i, p := range ti.policies {
		if q := quickSelOf(p); !alike(&q, &ti.quick[i]) || q.warned != ti.quick[i].warned {
			t.Errorf("%s: policy %d's quick selector %+v, want %+v", where, i, ti.quick[i], q)
		}
	}
	sum := ti.summary()
	var warned []int32
	for i, p := range ti.policies {
		if len(p.warnings) > 0 {
			warned = append(warned, int32(i))
		}
	}
	if !slices.Equal(sum.warned, warned) {
		t.Errorf("%s: summary lists warned policies %v, want %v", where, sum.warned, warned)
	}
	next := int32(0)
	for _, r := range sum.runs {
		if r.start != next || r.end <= r.start {
			t.Fatalf("%s: run [%d, %d) after %d", where, r.start, r.end, next)
		}
		if r.q != nil && r.q != &ti.quick[r.start] {
			t.Errorf("%s: run [%d, %d) reads its selector outside the type's quick array", where, r.start, r.end)
		}
		for i := r.start; i < r.end; i++ {
			q := &ti.quick[i]
			if r.q == nil && q.kind != quickNone || r.q != nil && !alike(q, r.q) {
				t.Errorf("%s: policy %d does not select as its run", where, i)
			}
		}
		next = r.end
	}
	if int(next) != len(ti.policies) {
		t.Errorf("%s: runs cover %d of %d policies", where, next, len(ti.policies))
	}
}
