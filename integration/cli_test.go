package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
)

// TestCLIPolish runs the real meridianctl against a real global and zone:
// apply of files, directories and repeated -f with --dry-run, the errors a
// user meets (server down, wrong plane, no name, a typo in a type, an
// unknown mesh), version, the readable inspect summary, YAML that apply
// takes back, and delete's output.
func TestCLIPolish(t *testing.T) {
	c := startCluster(t)
	g, z := c.global, c.zone1
	waitPresent(t, z, "/meshes/default")

	dir := t.TempDir()
	write := func(rel, content string) string {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	timeoutDoc := func(name, idle string) string {
		return "type: MeshTimeout\nmesh: default\nname: " + name + "\nspec:\n  targetRef:\n    kind: Mesh\n  to:\n    - targetRef:\n        kind: Mesh\n      default:\n        idleTimeout: " + idle + "\n"
	}
	write("policies/a.yaml", timeoutDoc("cli-a", "1s"))
	write("policies/nested/b.yml", timeoutDoc("cli-b", "2s")+"---\n"+timeoutDoc("cli-c", "3s"))
	write("policies/nested/c.json", `{"type":"MeshTimeout","mesh":"default","name":"cli-d","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"4s"}}]}}`)
	write("policies/README.md", "not a resource")
	single := write("e.yaml", timeoutDoc("cli-e", "5s"))

	// --dry-run checks on the server and stores nothing.
	out, code := g.ctl("", "apply", "-f", filepath.Join(dir, "policies"), "-f", single, "--dry-run")
	if code != 0 || strings.Count(out, "(dry run)") != 5 {
		t.Fatalf("apply --dry-run: exit %d\n%s", code, out)
	}
	if out, code := g.ctl("", "get", "meshtimeout", "cli-a"); code == 0 {
		t.Fatalf("a dry run stored cli-a:\n%s", out)
	}
	out, code = g.ctl("", "apply", "-f", filepath.Join(dir, "policies"), "-f", single)
	if code != 0 || strings.Count(out, "created") != 5 || !strings.Contains(out, "MeshTimeout default/cli-d created") {
		t.Fatalf("apply of a directory and a file: exit %d\n%s", code, out)
	}

	// get -o yaml: envelope order, one document per resource, which apply
	// takes back unchanged.
	out, code = g.ctl("", "get", "meshtimeouts", "-o", "yaml")
	if code != 0 || strings.Count(out, "\n---\n") != 4 || !strings.HasPrefix(out, "type: MeshTimeout\nmesh: default\nname: cli-a\n") {
		t.Fatalf("get -o yaml:\n%s", out)
	}
	back, code := g.ctl(out, "apply", "-f", "-")
	if code != 0 || strings.Count(back, "unchanged") != 5 {
		t.Fatalf("apply of get -o yaml: exit %d\n%s", code, back)
	}

	out, code = g.ctl("", "delete", "meshtimeout", "cli-e")
	if code != 0 || strings.TrimSpace(out) != "MeshTimeout default/cli-e deleted" {
		t.Errorf("delete: exit %d %q", code, out)
	}

	for _, tc := range []struct {
		name string
		n    *node
		args []string
		want string
	}{
		{"document without a name", g, []string{"apply", "-f", write("noname.yaml", "type: MeshTimeout\nmesh: default\nspec: {}\n")}, "MeshTimeout without a name: set name"},
		{"typo in a type", g, []string{"get", "meshtimeoutz"}, `did you mean MeshTimeout?`},
		{"unknown mesh", g, []string{"get", "meshtimeouts", "-m", "nope"}, `mesh "nope" not found`},
		{"zone command on the global", g, []string{"inspect", "dataplane", "web-1"}, "needs a zone control plane"},
		{"global command on a zone", z, []string{"inspect", "zones"}, "needs a global control plane"},
	} {
		out, code := tc.n.ctl("", tc.args...)
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want an error containing %q:\n%s", tc.name, code, tc.want, out)
		}
	}

	out, code = g.ctl("", "version")
	if code != 0 || !strings.Contains(out, "Client: meridianctl") || !strings.Contains(out, "global control plane") {
		t.Errorf("version: exit %d\n%s", code, out)
	}
	out, code = z.ctl("", "version")
	if code != 0 || !strings.Contains(out, `zone control plane "zone-1" (universal)`) {
		t.Errorf("version on a zone: exit %d\n%s", code, out)
	}
	out, code = g.ctl("", "get", "meshes")
	if code != 0 || !strings.HasPrefix(out, "NAME") || !strings.Contains(out, "MTLS") || !strings.Contains(out, "default") {
		t.Errorf("get meshes: exit %d\n%s", code, out)
	}

	// Kuma 2.14 resources: a MeshMultiZoneService reaches the zones like a
	// global MeshService; a Dataplane is refused on the global.
	apply(t, g, "type: MeshMultiZoneService\nmesh: default\nname: backend-mz\nspec:\n  selector:\n    meshService:\n      matchLabels:\n        kuma.io/display-name: backend\n  ports:\n    - port: 80\n      appProtocol: http\n")
	waitPresent(t, z, "/meshes/default/meshmultizoneservices/"+mapping.HashedName("default", "backend-mz"))
	out, code = g.ctl("type: Dataplane\nmesh: default\nname: dp-1\nnetworking:\n  address: 10.0.0.1\n  inbound:\n    - port: 80\n      tags:\n        kuma.io/service: web\n", "apply", "-f", "-")
	if code == 0 || !strings.Contains(out, "created on the zone control plane") {
		t.Errorf("a Dataplane on the global: exit %d\n%s", code, out)
	}

	// A control plane that is not there: the address tried and the flag.
	addr := freeAddress(t)
	cmd := exec.Command(bins.Meridianctl, "--api-address", "http://"+addr, "get", "meshes")
	raw, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(raw), "cannot reach a control plane at http://"+addr) ||
		!strings.Contains(string(raw), "--api-address") {
		t.Errorf("server down: %v\n%s", err, raw)
	}
}
