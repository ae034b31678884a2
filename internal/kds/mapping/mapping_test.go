package mapping

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/meridian-mesh/meridian/internal/resource"
)

func TestHashedNameVectors(t *testing.T) {
	// docs/kds.md#names-labels-references's Kuma vectors: (mesh, name[, zone[, namespace]]).
	cases := []struct {
		mesh, name string
		values     []string
		want       string
	}{
		{"default", "default-timeout-global", nil, "default-timeout-global-54dbd4c66zwbcf9c"},
		{"default", "default-timeout-zone-1", []string{"zone-1"}, "default-timeout-zone-1-c58w24w4vw27f454"},
		{"default", "redis-zone-1", []string{"zone-1"}, "redis-zone-1-2v6wfvvcvbc9f55d"},
		{"producer-policy-flow", "to-test-server", []string{"kuma-2", "producer-policy-flow-ns"}, "to-test-server-4cx47v8b5wcd4764"},
		// Absent labels are skipped, not hashed as empty strings.
		{"default", "redis-zone-1", []string{"zone-1", ""}, "redis-zone-1-2v6wfvvcvbc9f55d"},
		{"default", "default-timeout-global", []string{"", ""}, "default-timeout-global-54dbd4c66zwbcf9c"},
	}
	for _, tc := range cases {
		if got := HashedName(tc.mesh, tc.name, tc.values...); got != tc.want {
			t.Errorf("HashedName(%q, %q, %q) = %q, want %q", tc.mesh, tc.name, tc.values, got, tc.want)
		}
	}
}

func TestHashedNameTruncates(t *testing.T) {
	long := strings.Repeat("a", 300)
	got := HashedName("default", long)
	if len(got) != 253 || !strings.HasPrefix(got, strings.Repeat("a", 236)+"-") {
		t.Errorf("len %d, %q", len(got), got[230:])
	}
	// The hash covers the full name: two names equal in their first 236
	// characters still differ.
	if HashedName("default", long) == HashedName("default", long+"b") {
		t.Error("truncated names collide")
	}
	if n := len(HashedName("default", strings.Repeat("a", 236))); n != 253 {
		t.Errorf("236-char name: length %d", n)
	}
	// Every valid name's synced name is valid (a single 63-character label
	// used to become 80 and be refused by the receiver), including one cut
	// right after a dot.
	for _, name := range []string{strings.Repeat("a", 47), strings.Repeat("b", 63), strings.Repeat("c", 253),
		strings.Repeat("d", 235) + ".efgh"} {
		for _, values := range [][]string{nil, {"zone-1"}, {"zone-1", "ns"}} {
			if h := HashedName("default", name, values...); !validName(h) {
				t.Errorf("HashedName of a %d-char name %v is invalid: %q", len(name), values, h)
			}
		}
	}
}

var reg = resource.NewDefaultRegistry()

func desc(t *testing.T, name string) *resource.TypeDescriptor {
	t.Helper()
	d, ok := reg.Lookup(name)
	if !ok {
		t.Fatalf("no type %s", name)
	}
	return d
}

func res(typ, name string, labels map[string]string, spec string) *resource.Resource {
	mesh := "default"
	if typ == "Mesh" || typ == "Zone" {
		mesh = ""
	}
	r := &resource.Resource{Type: typ, Mesh: mesh, Name: name, Labels: resource.NewLabels(labels)}
	if spec != "" {
		r.Spec = json.RawMessage(spec)
	}
	return r
}

const (
	producerSpec = `{"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"http":{"requestTimeout":"5s"}}}]}`
	consumerSpec = `{"to":[{"targetRef":{"kind":"MeshService","name":"backend","namespace":"backend-ns"},"default":{"http":{"requestTimeout":"3s"}}}]}`
	mesSpec      = `{"to":[{"targetRef":{"kind":"MeshExternalService","name":"httpbin"},"default":{"http":{"requestTimeout":"3s"}}}]}`
)

func zoneLabels(zone, ns, role string) map[string]string {
	l := map[string]string{resource.LabelOrigin: resource.OriginZone, resource.LabelZone: zone}
	if ns != "" {
		l[resource.LabelNamespace] = ns
	}
	if role != "" {
		l[resource.LabelPolicyRole] = role
	}
	return l
}

func TestGlobalToZone(t *testing.T) {
	global := map[string]string{resource.LabelOrigin: resource.OriginGlobal}
	disabled := map[string]string{resource.LabelOrigin: resource.OriginGlobal, resource.LabelKDSSync: "disabled"}
	cases := []struct {
		name string
		r    *resource.Resource
		want Verdict
	}{
		{"mesh", res("Mesh", "default", global, `{}`), Send},
		{"global policy", res("MeshTimeout", "t", global, `{}`), Send},
		{"unlabelled global policy", res("MeshTimeout", "t", nil, `{}`), Send},
		{"global policy referencing a MeshExternalService", res("MeshTimeout", "t", global, mesSpec), Send},
		{"MeshExternalService", res("MeshExternalService", "httpbin", global, `{}`), Send},
		{"MeshGateway", res("MeshGateway", "edge", global, `{}`), Send},
		{"legacy policy", res("TrafficPermission", "tp", global, `{}`), Send},
		{"kds-sync disabled", res("MeshTimeout", "t", disabled, `{}`), Remove},
		{"Zone is not synced", res("Zone", "zone-1", global, `{}`), Skip},
		{"Dataplane of zone-1", res("Dataplane", "dp", zoneLabels("zone-1", "", ""), `{}`), Skip},
		{"MeshService of zone-1", res("MeshService", "redis", zoneLabels("zone-1", "", ""), `{}`), Send},
		{"MeshService of zone-2 (own)", res("MeshService", "redis", zoneLabels("zone-2", "", ""), `{}`), Skip},
		{"producer of k8s zone-1", res("MeshTimeout", "p", zoneLabels("zone-1", "backend-ns", "producer"), producerSpec), Send},
		{"producer of zone-2 (own)", res("MeshTimeout", "p", zoneLabels("zone-2", "backend-ns", "producer"), producerSpec), Skip},
		{"consumer of zone-1", res("MeshTimeout", "c", zoneLabels("zone-1", "frontend-ns", "consumer"), consumerSpec), Remove},
		{"workload-owner of zone-1", res("MeshTrafficPermission", "w", zoneLabels("zone-1", "backend-ns", "workload-owner"), `{}`), Remove},
		{"system-namespace policy of zone-1", res("MeshTimeout", "s", zoneLabels("zone-1", "", "system"), `{}`), Remove},
		{"universal zone policy (no namespace label)", res("MeshTimeout", "default-timeout-zone-1", zoneLabels("zone-1", "", "system"), `{}`), Remove},
		{"producer referencing a MeshExternalService", res("MeshTimeout", "p", zoneLabels("zone-1", "backend-ns", "producer"), mesSpec), Remove},
		{"producer labelled kds-sync disabled", res("MeshTimeout", "p", func() map[string]string {
			l := zoneLabels("zone-1", "backend-ns", "producer")
			l[resource.LabelKDSSync] = "disabled"
			return l
		}(), producerSpec), Remove},
		{"zone resource without a zone label", res("MeshService", "x", map[string]string{resource.LabelOrigin: resource.OriginZone}, `{}`), Skip},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := reg.Lookup(tc.r.Type)
			if got := GlobalToZone(d, tc.r, "zone-2"); got != tc.want {
				t.Errorf("GlobalToZone = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestRemovals(t *testing.T) {
	mt, ms, dp := desc(t, "MeshTimeout"), desc(t, "MeshService"), desc(t, "Dataplane")
	global := map[string]string{resource.LabelOrigin: resource.OriginGlobal}
	cases := []struct {
		name string
		got  bool
		want bool
	}{
		{"global policy to zone", GlobalToZoneRemoval(mt, resource.NewLabels(global), "zone-2"), true},
		{"zone-1 policy to zone-2", GlobalToZoneRemoval(mt, resource.NewLabels(zoneLabels("zone-1", "ns", "consumer")), "zone-2"), true},
		{"zone-2 policy to zone-2", GlobalToZoneRemoval(mt, resource.NewLabels(zoneLabels("zone-2", "ns", "producer")), "zone-2"), false},
		{"dataplane to zone", GlobalToZoneRemoval(dp, resource.NewLabels(zoneLabels("zone-1", "", "")), "zone-2"), false},
		{"own MeshService to global", ZoneToGlobalRemoval(ms, resource.NewLabels(zoneLabels("zone-1", "", "")), "zone-1"), true},
		{"unlabelled zone resource to global", ZoneToGlobalRemoval(ms, resource.Labels{}, "zone-1"), true},
		{"global copy to global", ZoneToGlobalRemoval(mt, resource.NewLabels(global), "zone-1"), false},
		{"relayed copy to global", ZoneToGlobalRemoval(ms, resource.NewLabels(zoneLabels("zone-2", "", "")), "zone-1"), false},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestZoneToGlobal(t *testing.T) {
	global := map[string]string{resource.LabelOrigin: resource.OriginGlobal}
	cases := []struct {
		name string
		r    *resource.Resource
		want Verdict
	}{
		{"own consumer policy (visible on the global)", res("MeshTimeout", "c", zoneLabels("zone-1", "frontend-ns", "consumer"), consumerSpec), Send},
		{"own universal policy", res("MeshTimeout", "default-timeout-zone-1", zoneLabels("zone-1", "", "system"), `{}`), Send},
		{"own MeshService", res("MeshService", "redis-zone-1", zoneLabels("zone-1", "", ""), `{}`), Send},
		{"own Dataplane", res("Dataplane", "dp-1", zoneLabels("zone-1", "", ""), `{}`), Send},
		{"unlabelled", res("MeshService", "redis", nil, `{}`), Send},
		{"own, kds-sync disabled", res("MeshTimeout", "x", map[string]string{resource.LabelKDSSync: "disabled"}, `{}`), Remove},
		{"copy from the global", res("MeshTimeout", "x-54dbd4c66zwbcf9c", global, `{}`), Skip},
		{"relayed copy of zone-2", res("MeshService", "redis-abc", zoneLabels("zone-2", "", ""), `{}`), Skip},
		{"Mesh never goes up", res("Mesh", "default", zoneLabels("zone-1", "", ""), `{}`), Skip},
		{"MeshGateway never goes up", res("MeshGateway", "edge", nil, `{}`), Skip},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := reg.Lookup(tc.r.Type)
			if got := ZoneToGlobal(d, tc.r, "zone-1"); got != tc.want {
				t.Errorf("ZoneToGlobal = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestToZone(t *testing.T) {
	mesh := res("Mesh", "default", map[string]string{resource.LabelOrigin: resource.OriginGlobal}, `{}`)
	mesh.Version = 3
	got := ToZone(desc(t, "Mesh"), mesh)
	if got.Name != "default" || got.Labels.Get(resource.LabelOrigin) != "global" || got.Version != 0 {
		t.Errorf("mesh copy: %+v", got)
	}

	pol := res("MeshTimeout", "default-timeout-global", map[string]string{resource.LabelOrigin: resource.OriginGlobal, "team": "a"}, `{"x":1}`)
	pol.Status = json.RawMessage(`{"s":1}`)
	got = ToZone(desc(t, "MeshTimeout"), pol)
	want := map[string]string{resource.LabelOrigin: "global", resource.LabelDisplayName: "default-timeout-global", "team": "a"}
	if got.Name != "default-timeout-global-54dbd4c66zwbcf9c" || got.Status != nil || !equalLabels(got.Labels, resource.NewLabels(want)) {
		t.Errorf("policy copy: %s %s %v", got.Name, got.Status, got.Labels)
	}
	if pol.Name != "default-timeout-global" || pol.Status == nil || pol.Labels.Len() != 2 {
		t.Error("ToZone changed its input")
	}

	// A relayed MeshService keeps the global's name and labels, loses status.
	relayed := res("MeshService", "redis-zone-1-2v6wfvvcvbc9f55d", map[string]string{
		resource.LabelOrigin: "zone", resource.LabelZone: "zone-1", resource.LabelDisplayName: "redis-zone-1"}, `{}`)
	relayed.Status = json.RawMessage(`{"addresses":[]}`)
	got = ToZone(desc(t, "MeshService"), relayed)
	if got.Name != relayed.Name || got.Status != nil || !equalLabels(got.Labels, relayed.Labels) {
		t.Errorf("relayed copy: %+v", got)
	}
	if n := ZoneName(desc(t, "MeshService"), relayed.Key(), relayed.Labels); n != relayed.Name {
		t.Errorf("ZoneName of relayed = %s", n)
	}
}

func TestFromZone(t *testing.T) {
	z := plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvUniversal, SystemNamespace: plane.DefaultSystemNamespace}
	mt := desc(t, "MeshTimeout")
	src := res("MeshTimeout", "default-timeout-zone-1", map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1"},
		`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"2s"}}]}`)
	got, err := FromZone(mt, src, z, plane.DefaultSystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1",
		resource.LabelDisplayName: "default-timeout-zone-1", resource.LabelPolicyRole: "system"}
	if got.Name != "default-timeout-zone-1-c58w24w4vw27f454" || got.Namespace != "" || !equalLabels(got.Labels, resource.NewLabels(want)) {
		t.Errorf("got %s %q %v", got.Name, got.Namespace, got.Labels)
	}
	if string(got.Spec) != string(src.Spec) {
		t.Errorf("spec without MeshService references changed: %s", got.Spec)
	}
	if k := GlobalKey(src.Key(), z); k != got.Key() {
		t.Errorf("GlobalKey = %v, want %v", k, got.Key())
	}

	for _, bad := range []map[string]string{
		{resource.LabelOrigin: "global"},
		{resource.LabelZone: "zone-2"},
	} {
		if _, err := FromZone(mt, res("MeshTimeout", "x", bad, `{}`), z, plane.DefaultSystemNamespace); !errors.Is(err, ErrForeign) {
			t.Errorf("labels %v: error = %v, want ErrForeign", bad, err)
		}
	}

	// Vector 4: a namespaced resource of a Kubernetes zone.
	k8s := plane.Plane{Mode: plane.Zone, Zone: "kuma-2", Environment: plane.EnvKubernetes, SystemNamespace: plane.DefaultSystemNamespace}
	r := &resource.Resource{Type: "MeshService", Mesh: "producer-policy-flow", Name: "to-test-server", Namespace: "producer-policy-flow-ns"}
	got, err = FromZone(desc(t, "MeshService"), r, k8s, plane.DefaultSystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "to-test-server-4cx47v8b5wcd4764" || got.Labels.Get(resource.LabelNamespace) != "producer-policy-flow-ns" {
		t.Errorf("vector 4: %s %v", got.Name, got.Labels)
	}
	// The zone's system namespace counts as no namespace.
	r.Namespace = "kuma-system"
	if k := GlobalKey(r.Key(), k8s); k.Name != HashedName("producer-policy-flow", "to-test-server", "kuma-2") {
		t.Errorf("system namespace key: %v", k)
	}
}

// TestReferenceRewrite is the reference rewrite's example: a producer MeshTimeout in
// zone-1's backend-ns references MeshService backend (namespace omitted =
// the policy's own). After both cross zone-1 -> global -> zone-2, the
// policy's reference names zone-2's copy of the MeshService.
func TestReferenceRewrite(t *testing.T) {
	zone1 := plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvKubernetes, SystemNamespace: plane.DefaultSystemNamespace}
	zone2 := plane.Plane{Mode: plane.Zone, Zone: "zone-2", Environment: plane.EnvKubernetes, SystemNamespace: "mesh-system"}
	mt, ms := desc(t, "MeshTimeout"), desc(t, "MeshService")

	svc := &resource.Resource{Type: "MeshService", Mesh: "default", Name: "backend", Namespace: "backend-ns",
		Labels: resource.NewLabels(zoneLabels("zone-1", "backend-ns", "")), Spec: json.RawMessage(`{"ports":[{"port":80}]}`)}
	pol := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: "producer-timeout", Namespace: "backend-ns",
		Labels: resource.NewLabels(zoneLabels("zone-1", "backend-ns", "producer")), Spec: json.RawMessage(
			`{"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"http":{"requestTimeout":"5s"}}},` +
				`{"targetRef":{"kind":"MeshHTTPRoute","name":"backend-v2","namespace":"backend-ns"},"default":{}}]}`)}
	consumer := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: "consumer", Namespace: "frontend-ns",
		Labels: resource.NewLabels(zoneLabels("zone-1", "frontend-ns", "")), Spec: json.RawMessage(consumerSpec)}

	gSvc, err := FromZone(ms, svc, zone1, plane.DefaultSystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	gPol, err := FromZone(mt, pol, zone1, plane.DefaultSystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	refs := toRefs(t, gPol.Spec)
	if refs[0]["name"] != gSvc.Name || refs[0]["namespace"] != "kuma-system" {
		t.Errorf("global reference %v, want name %s in kuma-system", refs[0], gSvc.Name)
	}
	if refs[1]["name"] != HashedName("default", "backend-v2", "zone-1", "backend-ns") {
		t.Errorf("route reference %v", refs[1])
	}
	if gPol.Labels.Get(resource.LabelPolicyRole) != "producer" {
		t.Errorf("role label %v", gPol.Labels)
	}
	// The consumer's reference points at another namespace; it is rewritten
	// too (so it resolves on the global) though the policy is not relayed.
	gCons, err := FromZone(mt, consumer, zone1, plane.DefaultSystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if gCons.Labels.Get(resource.LabelPolicyRole) != "consumer" || GlobalToZone(mt, gCons, "zone-2") != Remove {
		t.Errorf("consumer: %v", gCons.Labels)
	}
	if toRefs(t, gCons.Spec)[0]["name"] != gSvc.Name {
		t.Errorf("consumer reference %v", toRefs(t, gCons.Spec)[0])
	}

	// Global -> zone-2: both relayed, same names; the zone sets its own
	// system namespace on the references.
	if GlobalToZone(ms, gSvc, "zone-2") != Send || GlobalToZone(mt, gPol, "zone-2") != Send {
		t.Fatal("service or producer policy not relayed to zone-2")
	}
	if GlobalToZone(mt, gPol, "zone-1") != Skip {
		t.Error("producer policy sent back to its own zone")
	}
	zSvc, err := FromGlobal(ms, ToZone(ms, gSvc), zone2)
	if err != nil {
		t.Fatal(err)
	}
	zPol, err := FromGlobal(mt, ToZone(mt, gPol), zone2)
	if err != nil {
		t.Fatal(err)
	}
	ref := toRefs(t, zPol.Spec)[0]
	if ref["name"] != zSvc.Name || ref["namespace"] != "mesh-system" || zSvc.Namespace != "" {
		t.Errorf("zone-2 reference %v does not name zone-2's copy %s in its system namespace", ref, zSvc.Name)
	}
	if zSvc.Labels.Get(resource.LabelZone) != "zone-1" || zSvc.Labels.Get(resource.LabelNamespace) != "backend-ns" {
		t.Errorf("relayed labels lost: %v", zSvc.Labels)
	}
	if err := reg.Validate(zPol, plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvKubernetes, SystemNamespace: "mesh-system"}); err != nil {
		t.Errorf("zone-2 copy invalid: %v", err)
	}
	if err := reg.Validate(gPol, plane.Plane{Mode: plane.Global, SystemNamespace: plane.DefaultSystemNamespace}); err != nil {
		t.Errorf("global copy invalid: %v", err)
	}
}

func TestLabelReferencesUntouched(t *testing.T) {
	spec := `{"to":[{"targetRef":{"kind":"MeshService","labels":{"kuma.io/display-name":"backend"}},"default":{}}]}`
	pol := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: "p", Namespace: "ns", Spec: json.RawMessage(spec)}
	got, err := FromZone(desc(t, "MeshTimeout"), pol, plane.Plane{Mode: plane.Zone, Zone: "z", Environment: plane.EnvKubernetes, SystemNamespace: plane.DefaultSystemNamespace}, plane.DefaultSystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Spec) != spec {
		t.Errorf("label reference rewritten: %s", got.Spec)
	}
}

func toRefs(t *testing.T, spec json.RawMessage) []map[string]any {
	t.Helper()
	var s struct {
		To []struct {
			TargetRef map[string]any `json:"targetRef"`
		} `json:"to"`
	}
	if err := json.Unmarshal(spec, &s); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range s.To {
		out = append(out, e.TargetRef)
	}
	return out
}

func equalLabels(a, b resource.Labels) bool {
	if a.Len() != b.Len() {
		return false
	}
	for k, v := range a.All() {
		if b.Get(k) != v {
			return false
		}
	}
	return true
}

// validName reports whether the registry accepts name as a resource's name.
func validName(name string) bool {
	err := resource.NewDefaultRegistry().Validate(&resource.Resource{Type: "Mesh", Name: name, Spec: []byte("{}")}, plane.NewGlobal(""))
	var verr *resource.ValidationError
	if !errors.As(err, &verr) {
		return err == nil
	}
	for _, c := range verr.Causes {
		if c.Field == "name" {
			return false
		}
	}
	return true
}
