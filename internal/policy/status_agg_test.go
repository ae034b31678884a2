package policy

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestLoseRecordsEachLossOnce: past the list's switch to a set too.
func TestLoseRecordsEachLossOnce(t *testing.T) {
	for _, distinct := range []int{1, 31, 32, 33, 200} {
		var a policyAgg
		for round := range 3 {
			for i := range distinct {
				a.lose(fmt.Sprintf("winner-%d", i%7), lossAt{where: "to[0].default", path: fmt.Sprintf("p%d", i)})
			}
			if len(a.lost) != distinct {
				t.Fatalf("%d distinct losses, round %d: %d recorded", distinct, round, len(a.lost))
			}
		}
	}
}

// TestStatusMemoTellsAggsApart: policies share a memoized status only when
// their statuses are the same; each case's pair differs in one thing a
// status says.
func TestStatusMemoTellsAggsApart(t *testing.T) {
	s := &MeshSnapshot{zone: "zone-1"}
	p := &policy{policyDef: &policyDef{top: &targetRef{Kind: "Mesh"}}}
	lost := func(parts ...string) []loss {
		var out []loss
		for i := 0; i+2 < len(parts)+1; i += 3 {
			out = append(out, loss{parts[i], lossAt{parts[i+1], parts[i+2]}})
		}
		return out
	}
	reached := policyAgg{selected: true, reached: true}
	with := func(f func(*policyAgg)) policyAgg { a := reached; f(&a); return a }
	for _, tc := range []struct {
		name string
		a, b policyAgg
	}{
		{"won or not", with(func(a *policyAgg) { a.won = 1 }), reached},
		{"won once or twice is alike", with(func(a *policyAgg) { a.won = 1 }), with(func(a *policyAgg) { a.won = 2 })},
		{"winner", with(func(a *policyAgg) { a.lost = lost("w1", "to[0].default", "x") }),
			with(func(a *policyAgg) { a.lost = lost("w2", "to[0].default", "x") })},
		{"parts' boundaries", with(func(a *policyAgg) { a.lost = lost("w", "to[0].defaultx", "") }),
			with(func(a *policyAgg) { a.lost = lost("w", "to[0].default", "x") })},
		{"when false", with(func(a *policyAgg) { a.whenFalse = map[string]bool{"to[0].default": true} }), reached},
		{"ignored unset", with(func(a *policyAgg) { a.ignored = map[string]bool{"unset x ignored: o overrides it": true} }), reached},
		{"not reached", policyAgg{selected: true}, reached},
	} {
		t.Run(tc.name, func(t *testing.T) {
			memo, same := statusMemo{}, statusInterner{}
			a, b := tc.a, tc.b
			want := fmt.Sprint(s.statusOf(p, &a)) == fmt.Sprint(s.statusOf(p, &b))
			a, b = tc.a, tc.b
			got := memo.statusOf(s, p, &a, same) == memo.statusOf(s, p, &b, same)
			if got != want {
				t.Fatalf("shared: %v; statuses equal: %v", got, want)
			}
		})
	}
}

// TestGlobalPolicyStatusesAgreeWithLookups: the report lists every global
// policy once, each with the status PolicyStatus gives it, and none of the
// zone's own.
func TestGlobalPolicyStatusesAgreeWithLookups(t *testing.T) {
	rs := timeouts(300)
	for i, r := range rs {
		if i%3 != 0 {
			r.Labels = resource.LabelsOf("kuma.io/origin", "global", "kuma.io/display-name", r.Name)
		}
	}
	s, err := NewMeshSnapshot(Inputs{SystemNamespace: "kuma-system", Registry: resource.NewDefaultRegistry(), Mesh: "default", Zone: "zone-1",
		Resources: append(rs, benchDataplane("dp", 2, 0))})
	if err != nil {
		t.Fatal(err)
	}
	report := s.GlobalPolicyStatuses()
	if len(report) != 200 {
		t.Fatalf("%d statuses reported, want the 200 global policies'", len(report))
	}
	seen := map[string]bool{}
	for _, st := range report {
		want, err := s.PolicyStatus(st.Type, st.LocalName, st.LocalNamespace)
		if err != nil {
			t.Fatal(err)
		}
		if seen[st.Name] || !reflect.DeepEqual(st.Conditions, want.Conditions) {
			t.Fatalf("%s: reported twice (%v) or %v, PolicyStatus %v", st.Name, seen[st.Name], st.Conditions, want.Conditions)
		}
		seen[st.Name] = true
	}
}
