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
		seqs := &lossSeq{}
		for round := range 3 {
			for i := range distinct {
				a.lose(seqs, fmt.Sprintf("winner-%d", i%7), lossAt{where: "to[0].default", path: fmt.Sprintf("p%d", i)})
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
	seqs := &lossSeq{} // one type's, as aggregate makes them
	// lost records losses as accumulate does: (winner, where, path)...,
	// then, past 32 losses, losses of the policy's own.
	lost := func(n int, parts ...string) func(*policyAgg) {
		return func(a *policyAgg) {
			for i := 0; i+2 < len(parts); i += 3 {
				a.lose(seqs, parts[i], lossAt{parts[i+1], parts[i+2]})
			}
			for i := range n {
				a.lose(seqs, "many", lossAt{"to[0].default", fmt.Sprint("p", i)})
			}
		}
	}
	reached := policyAgg{selected: true, reached: true}
	with := func(fs ...func(*policyAgg)) policyAgg {
		a := reached
		for _, f := range fs {
			f(&a)
		}
		return a
	}
	won := func(n int) func(*policyAgg) { return func(a *policyAgg) { a.won = n } }
	for _, tc := range []struct {
		name string
		a, b policyAgg
	}{
		{"won or not", with(won(1)), reached},
		{"won once or twice is alike", with(won(1)), with(won(2))},
		{"the same losses", with(lost(0, "w1", "to[0].default", "x")), with(lost(0, "w1", "to[0].default", "x"))},
		{"the same losses, one won", with(lost(0, "w1", "to[0].default", "x")), with(won(1), lost(0, "w1", "to[0].default", "x"))},
		{"winner", with(lost(0, "w1", "to[0].default", "x")), with(lost(0, "w2", "to[0].default", "x"))},
		{"parts' boundaries", with(lost(0, "w", "to[0].defaultx", "")), with(lost(0, "w", "to[0].default", "x"))},
		{"losses in another order", with(lost(0, "w1", "a", "x", "w2", "a", "y")), with(lost(0, "w2", "a", "y", "w1", "a", "x"))},
		{"long lists alike", with(lost(40)), with(lost(40))},
		{"long lists apart", with(lost(40)), with(lost(41))},
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
