package api_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// labelValidationDeviations are the cases of Kuma's multizone
// label-validation e2e suite where Meridian answers differently on
// purpose, with the reason.
var labelValidationDeviations = map[string]string{
	"global.meshtimeout.mesh-other":         "a kuma.io/mesh label naming another mesh is refused everywhere (Kuma refuses it on zones, stores it on the global)",
	"global.meshexternalservice.mesh-other": "a kuma.io/mesh label naming another mesh is refused everywhere (Kuma refuses it on zones, stores it on the global)",
	"global.meshtimeout.zone-current": "the global refuses kuma.io/zone on its own resources: sync would take the resource for that zone's copy " +
		"and replace the zone's own resource with it",
	"global.meshexternalservice.zone-current": "the global refuses kuma.io/zone on its own resources: sync would take the resource for that zone's copy " +
		"and replace the zone's own resource with it",
	"zone-k8s.meshexternalservice.kube-namespace": "k8s.kuma.io/namespace naming another namespace than the resource's is refused " +
		"(Kuma's webhook overwrites it silently; the control plane owns the label)",
	"zone-uni.meshtimeout.no-labels": "a zone's own writes get kuma.io/origin: zone automatically (Kuma demands the label); " +
		"another value is still refused",
	"zone-uni.meshexternalservice.no-labels": "a zone's own writes get kuma.io/origin: zone automatically (Kuma demands the label); " +
		"another value is still refused",
}

// TestKumaLabelValidation replays Kuma 2.14's multizone label-validation
// e2e cases (test/e2e_env/multizone/validation: a MeshTimeout and a
// MeshExternalService applied with each system label, on the global, a
// Universal zone and a Kubernetes zone) and requires Kuma's verdict — the
// golden file's HTTP status, or kubectl's success — for each.
func TestKumaLabelValidation(t *testing.T) {
	inputs, err := filepath.Glob("testdata/kuma-label-validation/*.input.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no cases: %v", err)
	}
	sort.Strings(inputs)
	reg := resource.NewDefaultRegistry()
	const mesh = "multizone-label-validation"
	agree, deviate := 0, 0
	for _, input := range inputs {
		name := strings.TrimSuffix(filepath.Base(input), ".input.yaml")
		golden, err := os.ReadFile(strings.Replace(input, ".input.yaml", ".golden.yaml", 1))
		if err != nil {
			t.Fatal(err)
		}
		first, _, _ := strings.Cut(string(golden), "\n")
		kumaAccepts := strings.HasPrefix(first, "HTTP/1.1 2") || strings.Contains(first, " created") || strings.Contains(first, " configured")
		t.Run(name, func(t *testing.T) {
			cfg := api.Config{Plane: testGlobal, MaxBodyBytes: 1 << 20, LocalhostIsAdmin: true}
			switch target, _, _ := strings.Cut(name, "."); target {
			case "zone-uni":
				cfg = api.Config{Plane: zonePlane("kuma-4", plane.EnvUniversal, true), MaxBodyBytes: 1 << 20, LocalhostIsAdmin: true}
			case "zone-k8s":
				cfg = api.Config{Plane: zonePlane("kuma-1", plane.EnvKubernetes, true), MaxBodyBytes: 1 << 20, LocalhostIsAdmin: true}
			}
			srv, store := serveAPI(t, cfg)
			m := &resource.Resource{Type: "Mesh", Name: mesh, Spec: []byte(`{}`), Labels: resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal})}
			if _, err := store.Create(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(input)
			if err != nil {
				t.Fatal(err)
			}
			doc := strings.ReplaceAll(string(raw), "{{ .KumaNamespace }}", "kuma-system")
			problem := applyDoc(t, srv.URL, reg, []byte(doc))
			accepted := problem == ""
			why, deviation := labelValidationDeviations[name]
			switch {
			case deviation && accepted == kumaAccepts:
				t.Errorf("listed as a deviation (%s) but Meridian agrees with Kuma now", why)
			case deviation:
				deviate++
			case accepted != kumaAccepts:
				t.Errorf("Kuma %s, Meridian %s: %s\nKuma: %s", verdict(kumaAccepts), verdict(accepted), problem, first)
			default:
				agree++
			}
		})
	}
	t.Logf("%d cases: %d answered as Kuma 2.14 does, %d deliberate deviations", len(inputs), agree, deviate)
}

func verdict(accepted bool) string {
	if accepted {
		return "accepts"
	}
	return "refuses"
}
