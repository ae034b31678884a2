package integration

import (
	"encoding/json"
	"strings"
	"testing"
)

const backendDataplane = `type: Dataplane
mesh: default
name: backend-1
networking:
  address: 10.0.0.2
  inbound:
    - port: 8080
      tags:
        kuma.io/service: backend
        version: v1
  outbound:
    - port: 10001
      tags:
        kuma.io/service: payments
`

type evaluation struct {
	Inbound  int               `json:"inbound"`
	Client   map[string]string `json:"client"`
	Policies map[string]struct {
		Conf   map[string]any `json:"conf"`
		Origin []struct {
			Type string `json:"type"`
			Name string `json:"name"`
			Mesh string `json:"mesh"`
		} `json:"origin"`
	} `json:"policies"`
}

// TestStandaloneZoneEvaluatesSeed001Permissions: the MeshTrafficPermissions
// of examples/global-policies.yaml applied to a standalone zone; web v1
// calling backend is denied by backend-permissions.
func TestStandaloneZoneEvaluatesSeed001Permissions(t *testing.T) {
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal")
	if out, code := z.ctl("", "apply", "-f", examplePath(t, "global-policies.yaml")); code != 0 {
		t.Fatalf("apply: %s", out)
	}
	if out, code := z.ctl(backendDataplane, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply dataplane: %s", out)
	}
	cases := []struct {
		client, action string
		origins        []string
	}{
		// Every entry that matched the client, in apply order (as Kuma
		// lists origins); backend-permissions' are applied last.
		{"kuma.io/service:web,version:v1", "DENY", []string{"allow-only-infra", "backend-permissions", "backend-permissions"}},
		{"kuma.io/service:web,version:v2", "ALLOW", []string{"allow-only-infra", "backend-permissions"}},
		{"kuma.io/service:infra-logger", "ALLOW", []string{"allow-only-infra", "allow-only-infra", "backend-permissions"}},
	}
	for _, tc := range cases {
		status, body := z.request("GET", "/meshes/default/dataplanes/backend-1/_evaluate?inbound=8080&client="+tc.client, "")
		if status != 200 {
			t.Fatalf("%s: status %d: %s", tc.client, status, body)
		}
		var ev evaluation
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Fatal(err)
		}
		mtp, ok := ev.Policies["MeshTrafficPermission"]
		if !ok {
			t.Fatalf("%s: no MeshTrafficPermission in %s", tc.client, body)
		}
		if got := strings.ToUpper(strings.ReplaceAll(mtp.Conf["action"].(string), "-", "_")); got != tc.action {
			t.Errorf("%s: action %v, want %s (%s)", tc.client, mtp.Conf["action"], tc.action, body)
		}
		var names []string
		for _, o := range mtp.Origin {
			names = append(names, o.Name)
		}
		if strings.Join(names, ",") != strings.Join(tc.origins, ",") {
			t.Errorf("%s: origins %v, want %v", tc.client, names, tc.origins)
		}
	}

	out, code := z.ctl("", "inspect", "dataplane", "backend-1", "--config")
	if code != 0 || !strings.Contains(out, `"shadow_rules"`) || !strings.Contains(out, "spiffe://default/web") {
		t.Errorf("inspect --config: exit %d\n%s", code, out)
	}
	out, code = z.ctl("", "inspect", "dataplane", "backend-1", "--rules")
	if code != 0 || !strings.Contains(out, `"fromRules"`) || !strings.Contains(out, "default-timeout-global") {
		t.Errorf("inspect --rules: exit %d\n%s", code, out)
	}
	out, code = z.ctl("", "inspect", "dataplane", "backend-1")
	if code != 0 || !strings.Contains(out, "Inbound 8080 (backend)") || !strings.Contains(out, "MeshTrafficPermission") ||
		!strings.Contains(out, "from allow-only-infra, backend-permissions") {
		t.Errorf("inspect (summary): exit %d\n%s", code, out)
	}
	if status, body := z.request("GET", "/meshes/default/dataplanes/nope/_rules", ""); status != 404 {
		t.Errorf("unknown dataplane: %d %s", status, body)
	}
	status, body := z.request("GET", "/meshes/default/meshtrafficpermissions/backend-permissions/_resources/dataplanes", "")
	if status != 200 || !strings.Contains(string(body), `"backend-1"`) {
		t.Errorf("_resources/dataplanes: %d %s", status, body)
	}
}
