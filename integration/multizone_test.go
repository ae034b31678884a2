package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cluster is a global and two zones as real processes: zone-1 Universal,
// zone-2 Kubernetes, both verifying the global's generated certificate.
type cluster struct {
	global       *node
	zone1, zone2 *node
	kdsAddress   string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	kds := freeAddress(t)
	c := &cluster{kdsAddress: kds}
	c.global = startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	c.zone1 = c.startZone(t, "zone-1", "universal", c.token(t, "zone-1"))
	c.zone2 = c.startZone(t, "zone-2", "kubernetes", c.token(t, "zone-2"))
	return c
}

func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// token issues a zone token through the CLI and writes it to a file.
func (c *cluster) token(t *testing.T, zone string) string {
	t.Helper()
	out := c.global.ctlToken("generate", "zone-token", "--zone", zone, "--valid-for", "1h")
	path := filepath.Join(t.TempDir(), zone+".token")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (c *cluster) startZone(t *testing.T, zone, env, tokenFile string) *node {
	t.Helper()
	return startNode(t, zone, bins.Zone, t.TempDir(), "--zone", zone, "--environment", env,
		"--global-address", c.kdsAddress, "--zone-token-file", tokenFile,
		"--kds-ca-file", filepath.Join(c.global.dataDir, "kds-server.crt"))
}

type stored struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
	Status    json.RawMessage   `json:"status"`
}

// get fetches one resource; ok is false on 404.
func (n *node) get(path string) (stored, bool, error) {
	status, body := n.request("GET", path, "")
	var r stored
	switch status {
	case 404:
		return r, false, nil
	case 200:
		return r, true, json.Unmarshal(body, &r)
	}
	return r, false, fmt.Errorf("GET %s: %d %s", path, status, body)
}

func waitPresent(t *testing.T, n *node, path string) stored {
	t.Helper()
	var r stored
	eventually(t, 15*time.Second, func() error {
		got, ok, err := n.get(path)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s: %s not there yet", n.proc.Name, path)
		}
		r = got
		return nil
	})
	return r
}

func waitAbsent(t *testing.T, n *node, path string) {
	t.Helper()
	eventually(t, 15*time.Second, func() error {
		_, ok, err := n.get(path)
		if err != nil {
			return err
		}
		if ok {
			return fmt.Errorf("%s: %s still there", n.proc.Name, path)
		}
		return nil
	})
}

func apply(t *testing.T, n *node, doc string) {
	t.Helper()
	if out, code := n.ctl(doc, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply on %s: %s", n.proc.Name, out)
	}
}

const globalTimeout = `type: MeshTimeout
mesh: default
name: default-timeout-global
spec:
  targetRef:
    kind: Mesh
  to:
    - targetRef:
        kind: Mesh
      default:
        idleTimeout: 1h
`

func TestMultizoneSync(t *testing.T) {
	c := startCluster(t)

	// The global's default mesh reaches both zones unhashed, origin global.
	for _, z := range []*node{c.zone1, c.zone2} {
		m := waitPresent(t, z, "/meshes/default")
		if m.Labels["kuma.io/origin"] != "global" {
			t.Errorf("%s: mesh labels %v", z.proc.Name, m.Labels)
		}
	}

	// A global policy reaches both zones under its hashed name.
	apply(t, c.global, globalTimeout)
	const hashedGlobal = "/meshes/default/meshtimeouts/default-timeout-global-54dbd4c66zwbcf9c"
	for _, z := range []*node{c.zone1, c.zone2} {
		r := waitPresent(t, z, hashedGlobal)
		if r.Labels["kuma.io/origin"] != "global" || r.Labels["kuma.io/display-name"] != "default-timeout-global" {
			t.Errorf("%s: labels %v", z.proc.Name, r.Labels)
		}
	}
	// A zone refuses to edit what came from the global.
	if status, body := c.zone1.request("DELETE", hashedGlobal, ""); status != 409 || !strings.Contains(string(body), "global") {
		t.Errorf("zone delete of a global policy: %d %s", status, body)
	}

	// A zone-1 policy reaches the global hashed with zone labels, never zone-2.
	apply(t, c.zone1, strings.ReplaceAll(globalTimeout, "default-timeout-global", "default-timeout-zone-1"))
	r := waitPresent(t, c.global, "/meshes/default/meshtimeouts/default-timeout-zone-1-c58w24w4vw27f454")
	if r.Labels["kuma.io/origin"] != "zone" || r.Labels["kuma.io/zone"] != "zone-1" || r.Labels["kuma.io/display-name"] != "default-timeout-zone-1" {
		t.Errorf("global copy labels %v", r.Labels)
	}
	// Labelled kds-sync: disabled, a policy moves nowhere.
	apply(t, c.zone1, strings.ReplaceAll(globalTimeout, "name: default-timeout-global", "name: local-only\nlabels:\n  kuma.io/kds-sync: disabled"))
	apply(t, c.global, strings.ReplaceAll(globalTimeout, "name: default-timeout-global", "name: global-only\nlabels:\n  kuma.io/kds-sync: disabled"))

	// Kubernetes zone-2: a producer policy reaches zone-1 through the global,
	// a consumer policy stays out of other zones.
	apply(t, c.zone2, `type: MeshTimeout
mesh: default
name: backend-producer
namespace: backend-ns
spec:
  targetRef:
    kind: Mesh
  to:
    - targetRef:
        kind: MeshService
        name: backend
      default:
        idleTimeout: 2m
---
type: MeshTimeout
mesh: default
name: web-consumer
namespace: web-ns
spec:
  targetRef:
    kind: Mesh
  to:
    - targetRef:
        kind: MeshService
        name: backend
        namespace: backend-ns
      default:
        idleTimeout: 3m
`)
	eventually(t, 15*time.Second, func() error {
		if n := countByDisplayName(t, c.zone1, "backend-producer"); n != 1 {
			return fmt.Errorf("zone-1 has %d copies of zone-2's producer policy", n)
		}
		return nil
	})
	// By now everything written before has crossed; what must not cross has not.
	for _, check := range []struct {
		n       *node
		display string
	}{
		{c.zone2, "default-timeout-zone-1"}, {c.global, "local-only"}, {c.zone2, "local-only"},
		{c.zone1, "global-only"}, {c.zone2, "global-only"}, {c.zone1, "web-consumer"},
	} {
		if n := countByDisplayName(t, check.n, check.display); n != 0 {
			t.Errorf("%s has %d copies of %s", check.n.proc.Name, n, check.display)
		}
	}

	// The global refuses to edit it.
	if status, body := c.global.request("DELETE", "/meshes/default/meshtimeouts/default-timeout-zone-1-c58w24w4vw27f454", ""); status != 409 {
		t.Errorf("global delete of a zone policy: %d %s", status, body)
	}

	// A MeshService of zone-1 reaches zone-2 through the global, without status.
	apply(t, c.zone1, "type: MeshService\nmesh: default\nname: redis-zone-1\nspec:\n  selector:\n    dataplaneTags:\n      kuma.io/service: redis\n  ports:\n    - port: 6379\n      targetPort: 6379\n      appProtocol: tcp\n")
	svc := waitPresent(t, c.zone2, "/meshes/default/meshservices/redis-zone-1-2v6wfvvcvbc9f55d")
	if len(svc.Status) > 0 && string(svc.Status) != "null" && string(svc.Status) != "{}" {
		t.Errorf("relayed MeshService carries status %s", svc.Status)
	}

	// Deleting on the global removes the policy everywhere.
	if out, code := c.global.ctl("", "delete", "meshtimeout", "default-timeout-global"); code != 0 {
		t.Fatalf("delete: %s", out)
	}
	for _, z := range []*node{c.zone1, c.zone2} {
		waitAbsent(t, z, hashedGlobal)
	}

	// The zones show as online.
	out, code := c.global.ctl("", "inspect", "zones")
	if code != 0 || strings.Count(out, "Online") != 2 {
		t.Errorf("inspect zones: exit %d\n%s", code, out)
	}
}

// TestZoneOfflineCatchesUp kills a zone with SIGKILL, changes the global while
// it is down (a create and a delete), and checks the zone serves its last
// state meanwhile... and converges after restart.
func TestZoneOfflineCatchesUp(t *testing.T) {
	c := startCluster(t)
	apply(t, c.global, globalTimeout)
	const hashedGlobal = "/meshes/default/meshtimeouts/default-timeout-global-54dbd4c66zwbcf9c"
	waitPresent(t, c.zone2, hashedGlobal)

	if err := c.zone2.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	if out, code := c.global.ctl("", "delete", "meshtimeout", "default-timeout-global"); code != 0 {
		t.Fatalf("delete: %s", out)
	}
	apply(t, c.global, strings.ReplaceAll(globalTimeout, "default-timeout-global", "while-offline"))
	c.zone2.start()
	waitAbsent(t, c.zone2, hashedGlobal)
	r := waitPresent(t, c.zone2, "/meshes/default/meshtimeouts/while-offline-"+hashSuffix(t, c.zone2, "while-offline"))
	if r.Labels["kuma.io/display-name"] != "while-offline" {
		t.Errorf("labels %v", r.Labels)
	}

	// With the global down, the zone keeps serving what it has.
	if err := c.global.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.zone2.get("/meshes/default/meshtimeouts/while-offline-" + hashSuffix(t, c.zone2, "while-offline")); err != nil || !ok {
		t.Errorf("zone lost its policy while the global is down: ok=%v err=%v", ok, err)
	}
	c.global.start()
	eventually(t, 20*time.Second, func() error {
		out, _ := c.global.ctl("", "inspect", "zones")
		if strings.Count(out, "Online") != 2 {
			return fmt.Errorf("zones not reconnected:\n%s", out)
		}
		return nil
	})
}

// hashSuffix finds the synced copy's name by its display name.
func hashSuffix(t *testing.T, n *node, display string) string {
	t.Helper()
	var name string
	eventually(t, 15*time.Second, func() error {
		status, body := n.request("GET", "/meshes/default/meshtimeouts?filter[labels.kuma.io/display-name]="+display, "")
		var page struct {
			Items []stored `json:"items"`
		}
		if status != 200 || json.Unmarshal(body, &page) != nil || len(page.Items) != 1 {
			return fmt.Errorf("no copy of %s: %d %s", display, status, body)
		}
		name = page.Items[0].Name
		return nil
	})
	return strings.TrimPrefix(name, display+"-")
}

func TestZoneWithWrongTokenIsRefused(t *testing.T) {
	kds := freeAddress(t)
	global := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	c := &cluster{global: global, kdsAddress: kds}
	// A token for zone-2 presented by zone-1.
	z := c.startZone(t, "zone-1", "universal", c.token(t, "zone-2"))
	eventually(t, 15*time.Second, func() error {
		status, body := z.request("GET", "/", "")
		var idx struct {
			Sync struct {
				Connected bool   `json:"connected"`
				LastError string `json:"lastError"`
			} `json:"sync"`
		}
		if status != 200 || json.Unmarshal(body, &idx) != nil {
			return fmt.Errorf("GET /: %d %s", status, body)
		}
		if idx.Sync.Connected || !strings.Contains(idx.Sync.LastError, "token") {
			return fmt.Errorf("zone status does not show the refusal: %s", body)
		}
		t.Logf("zone reports: %s", idx.Sync.LastError)
		return nil
	})
	if !strings.Contains(global.log.String(), "zone-1") {
		t.Errorf("global log does not mention the refused zone:\n%s", global.log.String())
	}
	if _, ok, _ := z.get("/meshes/default"); ok {
		t.Errorf("refused zone received the global's mesh")
	}
}

// countByDisplayName counts MeshTimeouts whose name or display name is name.
func countByDisplayName(t *testing.T, n *node, name string) int {
	t.Helper()
	count := 0
	for _, it := range listTimeouts(t, n) {
		if it.Name == name || it.Labels["kuma.io/display-name"] == name {
			count++
		}
	}
	return count
}

// TestGracefulShutdownWithStreams stops a global with zones connected, then a
// zone whose global is gone, each with SIGTERM: both exit 0 within 5 s.
func TestGracefulShutdownWithStreams(t *testing.T) {
	c := startCluster(t)
	waitPresent(t, c.zone1, "/meshes/default")
	for _, n := range []*node{c.global, c.zone1} {
		start := time.Now()
		if err := n.proc.Stop(5 * time.Second); err != nil {
			t.Fatalf("%s: %v", n.proc.Name, err)
		}
		if err := n.proc.ExitErr(); err != nil {
			t.Errorf("%s exit: %v", n.proc.Name, err)
		}
		t.Logf("%s stopped in %s", n.proc.Name, time.Since(start).Round(time.Millisecond))
	}
}

// TestZoneReturnsQuicklyAfterGlobalOutage: reconnect backoff is capped at
// 5 s (it grew to 30 s, and a zone write made during a 30 s outage
// reached the global 28 s after the global was back), and a zone waiting out
// its backoff retries as soon as its connection to the global is back (it
// once took 9.3 s: the sync client's 5 s backoff and gRPC's own 5 s dial
// backoff added up).
func TestZoneReturnsQuicklyAfterGlobalOutage(t *testing.T) {
	c := startCluster(t)
	waitPresent(t, c.zone1, "/meshes/default")
	if err := c.global.proc.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// 20 s: with the old 30 s cap the next attempt came ~11.5 s after the
	// global was back; now the zone's channel redials every second and the
	// client retries when it is ready.
	time.Sleep(20 * time.Second)
	apply(t, c.zone1, strings.ReplaceAll(globalTimeout, "default-timeout-global", "written-during-outage"))
	c.global.start()
	back := time.Now()
	eventually(t, 15*time.Second, func() error {
		status, body := c.global.request("GET", "/meshes/default/meshtimeouts?filter[labels.kuma.io/display-name]=written-during-outage", "")
		if status != 200 || strings.Contains(string(body), `"total":0`) {
			return fmt.Errorf("zone-1's write not on the global yet")
		}
		return nil
	})
	if d := time.Since(back); d > 4*time.Second {
		t.Errorf("zone-1's write reached the global %s after the global was back, want within ~2 s", d)
	}
	t.Logf("zone-1's write reached the global %s after the global was back", time.Since(back).Round(time.Millisecond))
}
