package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestGlobalApplyGetAndRejectInvalid(t *testing.T) {
	g := startNode(t, "global", bins.Global, t.TempDir())

	out, code := g.ctl("", "apply", "-f", examplePath(t, "global-policies.yaml"))
	if code != 0 {
		t.Fatalf("apply exit %d:\n%s", code, out)
	}
	for _, want := range []string{"MeshTimeout default/default-timeout-global created", "MeshTrafficPermission default/backend-permissions created"} {
		if !strings.Contains(out, want) {
			t.Errorf("apply output lacks %q:\n%s", want, out)
		}
	}
	out, code = g.ctl("", "apply", "-f", examplePath(t, "global-policies.yaml"))
	if code != 0 || !strings.Contains(out, "default-timeout-global unchanged") {
		t.Errorf("re-apply: exit %d:\n%s", code, out)
	}

	out, code = g.ctl("", "get", "meshtrafficpermission", "backend-permissions", "-o", "json")
	if code != 0 {
		t.Fatalf("get exit %d: %s", code, out)
	}
	var mtp struct {
		Type string `json:"type"`
		Name string `json:"name"`
		Spec struct {
			From []json.RawMessage `json:"from"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(out), &mtp); err != nil || mtp.Type != "MeshTrafficPermission" || len(mtp.Spec.From) != 2 {
		t.Errorf("get returned %s (err %v)", out, err)
	}
	out, _ = g.ctl("", "get", "meshtimeouts")
	if !strings.Contains(out, "default-timeout-global") {
		t.Errorf("table lacks the timeout:\n%s", out)
	}

	out, code = g.ctl("", "apply", "-f", examplePath(t, "invalid-policy.yaml"))
	if code == 0 {
		t.Fatalf("invalid apply succeeded:\n%s", out)
	}
	for _, want := range []string{"spec.to[0].default.connectionTimeout", "spec.targetRef.kind", "spec.from[0].default.action"} {
		if !strings.Contains(out, want) {
			t.Errorf("invalid apply output does not name %s:\n%s", want, out)
		}
	}
	if status, _ := g.request("GET", "/meshes/default/meshtimeouts/bad-timeout", ""); status != 404 {
		t.Errorf("invalid resource was stored: GET status %d", status)
	}
	// The applies above went through the store's committer: /metrics shows
	// its commits.
	status, metrics := g.request("GET", "/metrics", "")
	for _, want := range []string{"meridian_store_commit_writes_count", "meridian_store_commit_duration_seconds_bucket"} {
		if status != 200 || !strings.Contains(string(metrics), want) {
			t.Errorf("GET /metrics: status %d, no %s", status, want)
		}
	}
}

func TestApplyFromStdinAndDelete(t *testing.T) {
	g := startNode(t, "global", bins.Global, t.TempDir())
	doc := "type: MeshRetry\nmesh: default\nname: r1\nspec:\n  targetRef:\n    kind: Mesh\n  to:\n    - targetRef:\n        kind: Mesh\n      default:\n        http:\n          numRetries: 2\n"
	if out, code := g.ctl(doc, "apply", "-f", "-"); code != 0 || !strings.Contains(out, "MeshRetry default/r1 created") {
		t.Fatalf("apply -f -: exit %d\n%s", code, out)
	}
	if out, code := g.ctl("", "delete", "meshretry", "r1"); code != 0 {
		t.Fatalf("delete: exit %d\n%s", code, out)
	}
	if out, code := g.ctl("", "get", "meshretries", "r1"); code == 0 || !strings.Contains(out, "not found") {
		t.Errorf("get after delete: exit %d\n%s", code, out)
	}
}

func TestStandaloneZoneAcceptsNamespacedResources(t *testing.T) {
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "kubernetes")
	out, code := z.ctl("", "apply", "-f", examplePath(t, "zone-1-resources.yaml"))
	if code != 0 {
		t.Fatalf("apply exit %d:\n%s", code, out)
	}
	out, code = z.ctl("", "get", "meshtimeout", "backend-timeouts", "-n", "backend-ns", "-o", "json")
	if code != 0 || !strings.Contains(out, `"kuma.io/policy-role": "producer"`) || !strings.Contains(out, `"kuma.io/zone": "zone-1"`) {
		t.Errorf("get: exit %d\n%s", code, out)
	}
	// A universal zone refuses custom namespaces.
	u := startNode(t, "zone-2", bins.Zone, t.TempDir(), "--zone", "zone-2", "--environment", "universal")
	out, code = u.ctl("", "apply", "-f", examplePath(t, "zone-1-resources.yaml"))
	if code == 0 || !strings.Contains(out, "namespace") {
		t.Errorf("universal zone accepted namespaced resources: exit %d\n%s", code, out)
	}
}

// TestKill9KeepsAcknowledgedWrites writes from several clients, kills the
// global with SIGKILL mid-stream, restarts it on the same data dir and checks
// that every write the API acknowledged is there.
func TestKill9KeepsAcknowledgedWrites(t *testing.T) {
	dir := t.TempDir()
	g := startNode(t, "global", bins.Global, dir)
	for round := 0; round < 3; round++ {
		acked := writeUntilKilled(t, g, round)
		if len(acked) == 0 {
			t.Fatalf("round %d: no write was acknowledged before the kill", round)
		}
		g.start()
		for name, ackedSeconds := range acked {
			status, body := g.request("GET", "/meshes/default/meshtimeouts/"+name, "")
			if status != 200 {
				t.Fatalf("round %d: acknowledged %s lost after kill -9: %d %s", round, name, status, body)
			}
			// A write in flight at the kill may have landed unacknowledged,
			// so the stored value is the acknowledged one or a later one.
			var stored struct {
				Spec struct {
					To []struct {
						Default struct {
							IdleTimeout string `json:"idleTimeout"`
						} `json:"default"`
					} `json:"to"`
				} `json:"spec"`
			}
			var seconds int
			if err := json.Unmarshal(body, &stored); err != nil || len(stored.Spec.To) != 1 {
				t.Fatalf("round %d: %s: unreadable %s", round, name, body)
			}
			if _, err := fmt.Sscanf(stored.Spec.To[0].Default.IdleTimeout, "%ds", &seconds); err != nil || seconds < ackedSeconds {
				t.Fatalf("round %d: %s has stale content %s, acknowledged %ds", round, name, body, ackedSeconds)
			}
		}
		t.Logf("round %d: %d acknowledged writes survived kill -9", round, len(acked))
	}
}

func writeUntilKilled(t *testing.T, g *node, round int) map[string]int {
	var (
		mu      sync.Mutex
		acked   = map[string]int{}
		count   atomic.Int64
		stopped atomic.Bool
		wg      sync.WaitGroup
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stopped.Load(); i++ {
				name := fmt.Sprintf("r%d-w%d-%d", round, w, i%50)
				timeout := fmt.Sprintf("%ds", i+1)
				body := fmt.Sprintf("type: MeshTimeout\nmesh: default\nname: %s\nspec:\n  targetRef:\n    kind: Mesh\n  to:\n    - targetRef:\n        kind: Mesh\n      default:\n        idleTimeout: %s\n", name, timeout)
				status, err := tryPut(g.api+"/meshes/default/meshtimeouts/"+name, body)
				if err != nil {
					return // the server is gone
				}
				if status == 200 || status == 201 {
					mu.Lock()
					acked[name] = i + 1
					mu.Unlock()
					count.Add(1)
				}
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for count.Load() < 200 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := g.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	stopped.Store(true)
	wg.Wait()
	return acked
}

func TestGracefulShutdownOnSIGTERM(t *testing.T) {
	g := startNode(t, "global", bins.Global, t.TempDir())
	start := time.Now()
	if err := g.proc.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := g.proc.ExitErr(); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %s", d)
	}
}

func TestStartupErrorsAreOneLine(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	badConfig := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(badConfig, []byte("data-dri: /tmp/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	locked := startNode(t, "holder", bins.Global, t.TempDir())
	openToken := filepath.Join(t.TempDir(), "zone.token")
	if err := os.WriteFile(openToken, []byte("x.y"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		bin  string
		args []string
		want string
	}{
		{"port in use", bins.Global, []string{"--data-dir", t.TempDir(), "--api-address", busy.Addr().String()}, "address already in use"},
		{"data dir is a file", bins.Global, []string{"--data-dir", notADir, "--api-address", "127.0.0.1:0"}, "data dir"},
		{"data dir in use", bins.Global, []string{"--data-dir", locked.dataDir, "--api-address", "127.0.0.1:0"}, "data dir"},
		{"bad config key", bins.Global, []string{"--config", badConfig, "--data-dir", t.TempDir()}, `unknown key "data-dri"`},
		{"zone without name", bins.Zone, []string{"--data-dir", t.TempDir(), "--api-address", "127.0.0.1:0"}, "--zone is required"},
		{"zone token file readable by others", bins.Zone, []string{"--zone", "z", "--data-dir", t.TempDir(), "--api-address", "127.0.0.1:0",
			"--global-address", "127.0.0.1:1", "--zone-token-file", openToken, "--kds-skip-verify"}, "has mode 0644"},
		{"heartbeat timeout below interval", bins.Global, []string{"--data-dir", t.TempDir(), "--api-address", "127.0.0.1:0",
			"--kds-heartbeat-interval", "5s", "--kds-heartbeat-timeout", "2s"}, "--kds-heartbeat-timeout (2s) must be more than --kds-heartbeat-interval (5s)"},
		{"bad environment", bins.Zone, []string{"--zone", "z", "--environment", "mars", "--data-dir", t.TempDir(), "--api-address", "127.0.0.1:0"}, "--environment"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.bin, tc.args...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("exited 0; stderr: %s", stderr.String())
				}
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("did not exit; stderr: %s", stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			if !strings.Contains(last, tc.want) || !strings.Contains(last, "error") {
				t.Errorf("last stderr line %q lacks %q; all:\n%s", last, tc.want, stderr.String())
			}
		})
	}
}
