package storagetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func ptr(s string) *string { return &s }

func keysOf(items []*resource.Resource) []string {
	out := make([]string, len(items))
	for i, r := range items {
		out[i] = fmt.Sprintf("%s/%s/%s/%s", r.Type, r.Mesh, r.Namespace, r.Name)
	}
	return out
}

func testListFilters(t *testing.T, f Factory) {
	h := newHarness(t, f)
	fixture := []*resource.Resource{
		mk("MeshTimeout/other//a", `{}`, "team", "a"),
		mk("MeshTimeout/default/ns2/c", `{}`),
		mk("MeshTimeout/default//b", `{}`, "team", "b"),
		mk("Mesh///other", `{}`),
		mk("MeshTimeout/default/ns1/a", `{}`, "team", "a", "env", "prod"),
		mk("MeshTimeout/default-x//a", `{}`),
		mk("MeshRetry/default//a", `{}`, "team", "a"),
		mk("MeshTimeout/default//a", `{}`, "team", "a"),
		mk("Mesh///default", `{}`),
	}
	for _, r := range fixture {
		h.create(r)
	}
	tests := []struct {
		name string
		opts storage.ListOptions
		want []string
	}{
		{"type", storage.ListOptions{Type: "MeshTimeout"}, []string{
			"MeshTimeout/default//a", "MeshTimeout/default//b", "MeshTimeout/default/ns1/a", "MeshTimeout/default/ns2/c",
			"MeshTimeout/default-x//a", "MeshTimeout/other//a"}},
		{"global type", storage.ListOptions{Type: "Mesh"}, []string{"Mesh///default", "Mesh///other"}},
		{"type name prefix is not a type", storage.ListOptions{Type: "MeshTime"}, nil},
		{"unknown type", storage.ListOptions{Type: "Nope"}, nil},
		{"mesh", storage.ListOptions{Type: "MeshTimeout", Mesh: "default"}, []string{
			"MeshTimeout/default//a", "MeshTimeout/default//b", "MeshTimeout/default/ns1/a", "MeshTimeout/default/ns2/c"}},
		{"mesh name prefix is not a mesh", storage.ListOptions{Type: "MeshTimeout", Mesh: "defaul"}, nil},
		{"mesh and system namespace", storage.ListOptions{Type: "MeshTimeout", Mesh: "default", Namespace: ptr("")}, []string{
			"MeshTimeout/default//a", "MeshTimeout/default//b"}},
		{"mesh and namespace", storage.ListOptions{Type: "MeshTimeout", Mesh: "default", Namespace: ptr("ns1")}, []string{
			"MeshTimeout/default/ns1/a"}},
		{"system namespace in any mesh", storage.ListOptions{Type: "MeshTimeout", Namespace: ptr("")}, []string{
			"MeshTimeout/default//a", "MeshTimeout/default//b", "MeshTimeout/default-x//a", "MeshTimeout/other//a"}},
		{"namespace in any mesh", storage.ListOptions{Type: "MeshTimeout", Namespace: ptr("ns2")}, []string{
			"MeshTimeout/default/ns2/c"}},
		{"namespace prefix is not a namespace", storage.ListOptions{Type: "MeshTimeout", Namespace: ptr("ns")}, nil},
		{"label", storage.ListOptions{Type: "MeshTimeout", Labels: map[string]string{"team": "a"}}, []string{
			"MeshTimeout/default//a", "MeshTimeout/default/ns1/a", "MeshTimeout/other//a"}},
		{"two labels", storage.ListOptions{Type: "MeshTimeout", Labels: map[string]string{"team": "a", "env": "prod"}}, []string{
			"MeshTimeout/default/ns1/a"}},
		{"label value mismatch", storage.ListOptions{Type: "MeshTimeout", Labels: map[string]string{"team": "zzz"}}, nil},
		{"mesh and label", storage.ListOptions{Type: "MeshTimeout", Mesh: "other", Labels: map[string]string{"team": "a"}}, []string{
			"MeshTimeout/other//a"}},
	}
	for _, tc := range tests {
		got := h.list(tc.opts)
		if !slices.Equal(keysOf(got.Items), tc.want) || got.Total != len(tc.want) {
			t.Errorf("%s: got %v (total %d), want %v", tc.name, keysOf(got.Items), got.Total, tc.want)
		}
		for _, r := range got.Items {
			checkRes(t, tc.name, r, h.get(r.Key()))
		}
	}
}

func testListPagination(t *testing.T, f Factory) {
	h := newHarness(t, f)
	var all []string
	for _, mesh := range []string{"m1", "m2"} {
		for _, ns := range []string{"", "ns"} {
			for i := range 6 {
				all = append(all, fmt.Sprintf("MeshRetry/%s/%s/r%02d", mesh, ns, i))
			}
		}
	}
	shuffled := slices.Clone(all)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for i, p := range shuffled {
		h.create(mk(p, `{}`, "even", fmt.Sprint(i%2 == 0)))
	}
	var even []string
	for _, p := range all {
		if h.get(key(p)).Labels.Get("even") == "true" {
			even = append(even, p)
		}
	}
	page := func(s []string, off, lim int) []string {
		off = min(off, len(s))
		end := len(s)
		if lim > 0 {
			end = min(off+lim, len(s))
		}
		return s[off:end]
	}
	tests := []struct {
		name        string
		opts        storage.ListOptions
		universe    []string
		offset, lim int
	}{
		{"first page", storage.ListOptions{}, all, 0, 10},
		{"middle page", storage.ListOptions{}, all, 10, 10},
		{"last partial page", storage.ListOptions{}, all, 20, 10},
		{"offset at end", storage.ListOptions{}, all, 24, 10},
		{"offset past end", storage.ListOptions{}, all, 100, 0},
		{"offset without limit", storage.ListOptions{}, all, 5, 0},
		{"limit without offset", storage.ListOptions{}, all, 0, 3},
		{"limit above total", storage.ListOptions{}, all, 0, 1000},
		{"filtered page", storage.ListOptions{Labels: map[string]string{"even": "true"}}, even, 4, 5},
		{"mesh page", storage.ListOptions{Mesh: "m2"}, all[12:], 3, 4},
	}
	for _, tc := range tests {
		opts := tc.opts
		opts.Type, opts.Offset, opts.Limit = "MeshRetry", tc.offset, tc.lim
		got := h.list(opts)
		want := page(tc.universe, tc.offset, tc.lim)
		if !slices.Equal(keysOf(got.Items), want) {
			t.Errorf("%s: items %v, want %v", tc.name, keysOf(got.Items), want)
		}
		if got.Total != len(tc.universe) {
			t.Errorf("%s: total %d, want %d", tc.name, got.Total, len(tc.universe))
		}
	}
}
