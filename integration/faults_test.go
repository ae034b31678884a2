package integration

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestKill9DuringSyncConverges writes and deletes policies on the global
// while the zone, and once the global, is killed with SIGKILL at random
// points; after restarts the zone holds exactly the global's policies
// (nothing lost, nothing stale, nothing duplicated).
func TestKill9DuringSyncConverges(t *testing.T) {
	c := startCluster(t)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("random seed %d", seed)
	for round := 0; round < 4; round++ {
		victim := c.zone2
		if round == 2 {
			victim = c.global
		}
		killAt := rng.Intn(60)
		for i := 0; i < 80; i++ {
			name := fmt.Sprintf("fault-%d", rng.Intn(40))
			if rng.Intn(4) == 0 {
				c.global.request("DELETE", "/meshes/default/meshtimeouts/"+name, "")
			} else if status, _ := tryPutRetry(c.global, name, fmt.Sprintf("%ds", round*100+i+1)); status >= 300 {
				t.Fatalf("PUT %s: status %d", name, status)
			}
			if i == killAt {
				if err := victim.proc.Kill(); err != nil {
					t.Fatal(err)
				}
				if victim == c.global {
					victim.start()
				}
			}
		}
		if victim != c.global {
			victim.start()
		}
	}
	want := globalTimeouts(t, c.global)
	eventually(t, 30*time.Second, func() error {
		got := zoneCopies(t, c.zone2)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			return fmt.Errorf("zone has %d policies, global %d:\nzone:   %v\nglobal: %v", len(got), len(want), got, want)
		}
		return nil
	})
	t.Logf("converged on %d policies", len(want))
}

// tryPutRetry PUTs a MeshTimeout, retrying while the global restarts.
func tryPutRetry(g *node, name, idle string) (int, error) {
	body := fmt.Sprintf("type: MeshTimeout\nmesh: default\nname: %s\nspec:\n  targetRef:\n    kind: Mesh\n  to:\n    - targetRef:\n        kind: Mesh\n      default:\n        idleTimeout: %s\n", name, idle)
	var err error
	for attempt := 0; attempt < 100; attempt++ {
		var status int
		status, err = tryPut(g.api+"/meshes/default/meshtimeouts/"+name, body)
		if err == nil {
			return status, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, err
}

type timeoutItem struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	Spec   json.RawMessage   `json:"spec"`
}

func listTimeouts(t *testing.T, n *node) []timeoutItem {
	t.Helper()
	status, body := n.request("GET", "/meshes/default/meshtimeouts?size=10000", "")
	if status != 200 {
		t.Fatalf("list: %d %s", status, body)
	}
	var page struct {
		Items []timeoutItem `json:"items"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatal(err)
	}
	return page.Items
}

// globalTimeouts renders the global's own policies as "name spec" lines.
func globalTimeouts(t *testing.T, g *node) []string {
	var out []string
	for _, it := range listTimeouts(t, g) {
		if it.Labels["kuma.io/origin"] == "global" {
			out = append(out, it.Name+" "+string(it.Spec))
		}
	}
	sort.Strings(out)
	return out
}

// zoneCopies renders the zone's copies of global policies the same way,
// by display name.
func zoneCopies(t *testing.T, z *node) []string {
	var out []string
	for _, it := range listTimeouts(t, z) {
		if it.Labels["kuma.io/origin"] == "global" {
			out = append(out, it.Labels["kuma.io/display-name"]+" "+string(it.Spec))
		}
	}
	sort.Strings(out)
	return out
}
