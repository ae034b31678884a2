package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Defaults and overrides across real processes (docs/policy.md#defaults-and-overrides): a
// global override reaches both zones and wins there over the zone's own
// policies, read through _evaluate, _config's RBAC, _explain, the CLI, and
// the policies' status, which follows policy and Dataplane changes.

const overridesZoneResources = `type: Dataplane
mesh: default
name: web-1
networking:
  address: 10.0.0.1
  inbound:
    - port: 8080
      tags:
        kuma.io/service: web
  outbound:
    - port: 10001
      tags:
        kuma.io/service: backend
---
type: MeshTimeout
mesh: default
name: zone-backend-timeouts
spec:
  targetRef:
    kind: Mesh
  to:
    - targetRef:
        kind: MeshService
        name: backend
      default:
        connectionTimeout: 3s
        http:
          requestTimeout: 5s
---
type: MeshTrafficPermission
mesh: default
name: zone-allow-all
spec:
  targetRef:
    kind: MeshService
    name: web
  from:
    - targetRef:
        kind: Mesh
      default:
        action: Allow
`

const overridesGlobalPolicies = `type: MeshTimeout
mesh: default
name: mesh-timeout-guardrail
spec:
  targetRef:
    kind: Mesh
  to:
    - targetRef:
        kind: Mesh
      override:
        connectionTimeout: 1s
        idleTimeout: 1m
---
type: MeshTrafficPermission
mesh: default
name: deny-dev
spec:
  targetRef:
    kind: Mesh
  from:
    - targetRef:
        kind: MeshSubset
        tags:
          env: dev
      override:
        action: Deny
`

type statusConditions struct {
	Conditions []struct {
		Type, Status, Reason, Message string
	} `json:"conditions"`
}

func (s statusConditions) reason(typ string) string {
	for _, c := range s.Conditions {
		if c.Type == typ {
			return c.Status + "/" + c.Reason
		}
	}
	return "-"
}

func TestGlobalOverrideWinsInBothZones(t *testing.T) {
	c := startCluster(t)
	for _, z := range []*node{c.zone1, c.zone2} {
		waitPresent(t, z, "/meshes/default")
		apply(t, z, overridesZoneResources)
		// A zone connected to a global creates no mesh.
		if status, body := z.request("PUT", "/meshes/zone-made", `{"type":"Mesh","name":"zone-made"}`); status != 403 || !strings.Contains(string(body), "create meshes there") {
			t.Errorf("%s: PUT /meshes/zone-made: %d %s", z.proc.Name, status, body)
		}
	}
	apply(t, c.global, overridesGlobalPolicies)

	for _, z := range []*node{c.zone1, c.zone2} {
		name := z.proc.Name
		// _evaluate: the override wins connectionTimeout, adds idleTimeout,
		// and the zone's requestTimeout stays (D2).
		eventually(t, 15*time.Second, func() error {
			var ev struct {
				Policies map[string]struct {
					Conf map[string]any `json:"conf"`
				} `json:"policies"`
			}
			if err := getJSON(z, "/meshes/default/dataplanes/web-1/_evaluate?outbound=backend", &ev); err != nil {
				return err
			}
			got, _ := json.Marshal(ev.Policies["MeshTimeout"].Conf)
			want := `{"connectionTimeout":"1s","http":{"requestTimeout":"5s"},"idleTimeout":"1m"}`
			if string(got) != want {
				return fmt.Errorf("%s: MeshTimeout conf %s, want %s", name, got, want)
			}
			return nil
		})
		// _evaluate inbound: env=dev is denied even though the zone allows all.
		// (The MeshTrafficPermission override may arrive in a later batch.)
		for client, want := range map[string]string{"kuma.io/service:payments,env:dev": "DENY", "kuma.io/service:payments,env:prod": "ALLOW"} {
			eventually(t, 15*time.Second, func() error {
				var ev struct {
					Policies map[string]struct {
						Conf map[string]any `json:"conf"`
					} `json:"policies"`
				}
				if err := getJSON(z, "/meshes/default/dataplanes/web-1/_evaluate?inbound=8080&client="+client, &ev); err != nil {
					return err
				}
				if got := ev.Policies["MeshTrafficPermission"].Conf["action"]; got != want {
					return fmt.Errorf("%s: client %s: action %v, want %s", name, client, got, want)
				}
				return nil
			})
		}
		// _config: the RBAC excludes env=dev.
		status, body := z.request("GET", "/meshes/default/dataplanes/web-1/_config", "")
		if status != 200 || !strings.Contains(string(body), `"not_id":{"authenticated":{"principal_name":{"exact":"kuma://env/dev"}}}`) {
			t.Errorf("%s: _config RBAC does not exclude env=dev: %d %s", name, status, body)
		}
		// _explain: connectionTimeout set by the global override, the zone's 3s lost.
		var ex struct {
			Fields []struct {
				Path  string `json:"path"`
				SetBy *struct {
					Policy struct {
						Labels map[string]string `json:"labels"`
					} `json:"policy"`
					Block string `json:"block"`
				} `json:"setBy"`
				Lost []struct {
					Reason string `json:"reason"`
				} `json:"lost"`
			} `json:"fields"`
		}
		if err := getJSON(z, "/meshes/default/dataplanes/web-1/_explain?type=MeshTimeout&outbound=backend", &ex); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range ex.Fields {
			if f.Path != "connectionTimeout" {
				continue
			}
			found = true
			if f.SetBy == nil || f.SetBy.Block != "override" || f.SetBy.Policy.Labels["kuma.io/display-name"] != "mesh-timeout-guardrail" {
				t.Errorf("%s: connectionTimeout set by %+v", name, f.SetBy)
			}
			if len(f.Lost) != 1 || !strings.Contains(f.Lost[0].Reason, "overridden by") {
				t.Errorf("%s: connectionTimeout lost %+v", name, f.Lost)
			}
		}
		if !found {
			t.Errorf("%s: _explain has no connectionTimeout field", name)
		}
		// The CLI's table says the same.
		out, code := z.ctl("", "inspect", "dataplane", "web-1", "--explain", "--type", "MeshTimeout", "--outbound", "backend")
		if code != 0 || !strings.Contains(out, "connectionTimeout") || !strings.Contains(out, "zone-backend-timeouts [0].default \"3s\": overridden by") {
			t.Errorf("%s: inspect --explain:\n%s", name, out)
		}
		// Status: the zone's policy is partially enforced, naming the winner
		// (statuses follow changes within the view's debounce).
		waitCondition(t, z, "/meshes/default/meshtimeouts/zone-backend-timeouts", "Enforced", "True/PartiallyEnforced")
		out, code = z.ctl("", "get", "meshtimeouts")
		if code != 0 || !strings.Contains(out, "STATUS") || !strings.Contains(out, "PartiallyEnforced") {
			t.Errorf("%s: get meshtimeouts:\n%s", name, out)
		}
	}

	// The global shows each zone's status of its policy (the zones report
	// what their engines computed).
	eventually(t, 15*time.Second, func() error {
		var r struct {
			Status struct {
				Zones []struct {
					Zone       string `json:"zone"`
					Conditions []struct {
						Type, Status, Reason string
					} `json:"conditions"`
				} `json:"zones"`
			} `json:"status"`
		}
		if err := getJSON(c.global, "/meshes/default/meshtimeouts/mesh-timeout-guardrail", &r); err != nil {
			return err
		}
		var got []string
		for _, z := range r.Status.Zones {
			for _, c := range z.Conditions {
				if c.Type == "Enforced" {
					got = append(got, z.Zone+":"+c.Status+"/"+c.Reason)
				}
			}
		}
		if strings.Join(got, ",") != "zone-1:True/Enforced,zone-2:True/Enforced" {
			return fmt.Errorf("per-zone status on the global: %v (%+v)", got, r.Status)
		}
		return nil
	})

	// Status follows policy changes: without the guardrail, the zone policy
	// is fully enforced again.
	if out, code := c.global.ctl("", "delete", "meshtimeout", "mesh-timeout-guardrail"); code != 0 {
		t.Fatalf("delete: %s", out)
	}
	for _, z := range []*node{c.zone1, c.zone2} {
		waitCondition(t, z, "/meshes/default/meshtimeouts/zone-backend-timeouts", "Enforced", "True/Enforced")
	}
	// ... and Dataplane changes: without web-1 nothing is selected.
	if out, code := c.zone1.ctl("", "delete", "dataplane", "web-1"); code != 0 {
		t.Fatalf("delete dataplane: %s", out)
	}
	waitCondition(t, c.zone1, "/meshes/default/meshtimeouts/zone-backend-timeouts", "Accepted", "False/TargetNotFound")
}

func waitCondition(t *testing.T, z *node, path, typ, want string) {
	t.Helper()
	eventually(t, 15*time.Second, func() error {
		var r struct {
			Status statusConditions `json:"status"`
		}
		if err := getJSON(z, path, &r); err != nil {
			return err
		}
		if got := r.Status.reason(typ); got != want {
			return fmt.Errorf("%s: %s %s is %s, want %s (%+v)", z.proc.Name, path, typ, got, want, r.Status)
		}
		return nil
	})
}

func getJSON(n *node, path string, v any) error {
	status, body := n.request("GET", path, "")
	if status != 200 {
		return fmt.Errorf("GET %s: %d %s", path, status, body)
	}
	return json.Unmarshal(body, v)
}
