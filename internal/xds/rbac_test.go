package xds

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/policy"
)

// TestRBACProtoMatchesJSON: rbacProto gives what protojson reads from the
// RBAC's JSON, or fails where it fails, over random RBACs of every shape
// the type can hold (principals with no identifier or with several,
// matchers exact, by prefix, both or neither, unknown actions).
func TestRBACProtoMatchesJSON(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 7))
	failed, converted := 0, 0
	for i := range 20000 {
		in := randomRBAC(r)
		want := &rbacv3.RBAC{}
		wantErr := jsonToProto(in, want)
		got, gotErr := rbacProto(in)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("case %d: %+v: error %v, through JSON %v", i, in, gotErr, wantErr)
		}
		if gotErr != nil {
			failed++
			continue
		}
		converted++
		if !proto.Equal(got, want) {
			t.Fatalf("case %d: %+v:\n%v\nthrough JSON:\n%v", i, in, got, want)
		}
	}
	if failed < 1000 || converted < 1000 {
		t.Fatalf("%d cases failed and %d converted: both paths must be exercised", failed, converted)
	}
}

// jsonToProto reads v's JSON as m, as protojson does: how the RBAC was
// converted before rbacProto, and the reference it is held to.
func jsonToProto(v any, m proto.Message) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(raw, m)
}

func randomRBAC(r *rand.Rand) *policy.RBAC {
	out := &policy.RBAC{Action: []string{"ALLOW", "DENY", "LOG", "ALLOW", "DENY", "", "allow"}[r.IntN(7)]}
	switch r.IntN(4) {
	case 0:
		return out
	case 1:
		out.Policies = map[string]policy.RBACPolicy{}
		return out
	}
	out.Policies = map[string]policy.RBACPolicy{}
	for range 1 + r.IntN(3) {
		var p policy.RBACPolicy
		for range r.IntN(3) {
			p.Permissions = append(p.Permissions, policy.Permission{Any: r.IntN(2) == 0})
		}
		for range r.IntN(4) {
			p.Principals = append(p.Principals, randomPrincipal(r, 0))
		}
		out.Policies[[]string{"MeshTrafficPermission", "ShadowMeshTrafficPermission", "p", "é"}[r.IntN(4)]] = p
	}
	return out
}

// randomPrincipal sets each identifier with some chance, so that some
// principals set none and some several.
func randomPrincipal(r *rand.Rand, depth int) policy.Principal {
	var p policy.Principal
	chance := func() bool { return r.IntN(4) == 0 }
	if chance() {
		p.Any = true
	}
	set := func() *policy.PrincipalSet {
		s := &policy.PrincipalSet{}
		if r.IntN(5) == 0 {
			s.IDs = []policy.Principal{}
		}
		for range r.IntN(3) {
			s.IDs = append(s.IDs, randomPrincipal(r, depth+1))
		}
		return s
	}
	if depth < 3 && chance() {
		p.AndIDs = set()
	}
	if depth < 3 && chance() {
		p.OrIDs = set()
	}
	if depth < 3 && chance() {
		not := randomPrincipal(r, depth+1)
		p.NotID = &not
	}
	if r.IntN(2) == 0 {
		var m policy.StringMatcher
		switch r.IntN(5) {
		case 0:
			m.Exact = "spiffe://default/web"
		case 1:
			m.Prefix = "spiffe://default/"
		case 2:
			m.Exact, m.Prefix = "a", "b"
		case 3: // neither
		default:
			m.Exact = "kuma://version/v1"
		}
		p.Authenticated = &policy.Authenticated{PrincipalName: m}
	}
	return p
}
