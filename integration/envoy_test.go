package integration

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/agent"
	"github.com/meridian-mesh/meridian/internal/launcher"
)

// TestEnvoySidecar: meridian-dp --proxy envoy writes Envoy's bootstrap,
// serves the workload's secrets over SDS and runs Envoy with it. Envoy
// cannot run here, so a stand-in (testdata/fakeenvoy) reads the bootstrap
// as Envoy would and fetches the secrets from the agent and the listeners
// and clusters from the zone: Kuma's layout, rendered for the kind of
// proxy the node says it is.
func TestEnvoySidecar(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "envoy")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/fakeenvoy").CombinedOutput(); err != nil {
		t.Fatalf("build fakeenvoy: %v\n%s", err, out)
	}
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal")
	mtlsMesh(t, z, "24h")
	apply(t, z, allowAll)
	backendPort := freePort(t)
	startWorkload(t, z, "backend-1", greeterDataplane("backend-1", "backend", backendPort), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", backendPort))

	webPort := freePort(t)
	dp := callerDataplane("web-1", "web", webPort, "backend")
	dir := t.TempDir()
	token := z.ctlToken("generate", "dataplane-token", "--mesh", "default", "--name", "web-1", "--valid-for", "1h")
	for file, data := range map[string]string{"dp.yaml": dp, "token": token} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := func(envoy string) []string {
		return []string{"run", "--proxy", "envoy", "--envoy-binary", envoy, "--cp-address", "https://" + z.xds,
			"--dataplane-file", filepath.Join(dir, "dp.yaml"), "--dataplane-token-file", filepath.Join(dir, "token"),
			"--ca-cert-file", filepath.Join(z.dataDir, "xds-server.crt"), "--dir", filepath.Join(dir, "agent")}
	}

	// No Envoy binary: one line, non-zero, nothing registered.
	out, err := exec.Command(bins.MeridianDP, args(filepath.Join(dir, "no-such-envoy"))...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--envoy-binary") || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
		t.Errorf("without Envoy: %v\n%s", err, out)
	}
	if status, _ := z.request("GET", "/meshes/default/dataplanes/web-1", ""); status != 404 {
		t.Errorf("web-1 registered without Envoy: %d", status)
	}

	w := &workload{t: t, name: "web-1", log: &logBuffer{}, dir: filepath.Join(dir, "agent")}
	w.proc = &launcher.Process{Name: "web-1", Path: bins.MeridianDP, Log: w.log, Args: args(bin)}
	if err := w.proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.proc.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("web-1 log:\n%s", w.log.String())
		}
	})
	want := []string{"sds identity_cert:secret:default key=yes", "sds mesh_ca:secret:default key=no",
		fmt.Sprintf("lds inbound:127.0.0.1:%d", webPort), "lds outbound:127.0.0.1:20001", "cds backend", fmt.Sprintf("cds localhost:%d", webPort)}
	eventually(t, 40*time.Second, func() error {
		for _, l := range want {
			if !strings.Contains(w.log.String(), l+"\n") {
				return fmt.Errorf("no %q yet", l)
			}
		}
		return nil
	})
	// The key file stays in the agent's directory, 0600; the socket too.
	for _, f := range []string{"certs/key.pem", "sds.sock", "envoy.json"} {
		info, err := os.Stat(filepath.Join(dir, "agent", f))
		if err != nil || info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: %v %v", f, err, info)
		}
	}
	// _xds shows what the node connected as.
	_, body := z.request("GET", "/meshes/default/dataplanes/web-1/_xds", "")
	if !strings.Contains(string(body), `"proxy":"envoy"`) {
		t.Errorf("_xds of an Envoy node: %.300s", body)
	}

	// A MeshAccessLog with a tcp backend: the zone renders Envoy's file
	// logger onto the agent's pipe (named by the node's metadata), and the
	// agent sends what Envoy writes there to the backend. Envoy's part is
	// played here: one line written to the pipe the dump names.
	logs, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	received := make(chan string, 1)
	go func() {
		c, err := logs.Accept()
		if err != nil {
			return
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		received <- line
	}()
	apply(t, z, accessLogToAll("to-logstash", fmt.Sprintf(`type: Tcp
            tcp: {address: %q}`, logs.Addr().String())))
	pipe := filepath.Join(dir, "agent", agent.AccessLogPipe)
	eventually(t, 10*time.Second, func() error {
		_, body := z.request("GET", "/meshes/default/dataplanes/web-1/_xds?proxy=envoy", "")
		if !strings.Contains(string(body), `"path":"`+pipe+`"`) || !strings.Contains(string(body), logs.Addr().String()) {
			return fmt.Errorf("no access log on the agent's pipe in %.300s", body)
		}
		return nil
	})
	f, err := os.OpenFile(pipe, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, `{"address":%q,"message":"[2026] web -> backend 200\n"}`+"\n", logs.Addr().String()); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-received:
		if line != "[2026] web -> backend 200\n" {
			t.Errorf("the backend got %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Error("the agent forwarded nothing to the access log backend")
	}

	// Kuma 2.14's shared collector: an access log names it by backendRef
	// (labels, the display name being its name), and Envoy exports to it
	// directly; moving the collector moves the proxy's cluster.
	collector := func(address string) string {
		return fmt.Sprintf("type: MeshOpenTelemetryBackend\nmesh: default\nname: main-collector\nspec:\n  endpoint: {address: %s, port: 4317}\n  protocol: grpc\n", address)
	}
	apply(t, z, collector("otel-a.observability"))
	apply(t, z, accessLogToAll("to-collector", `type: OpenTelemetry
            openTelemetry:
              backendRef:
                kind: MeshOpenTelemetryBackend
                labels: {kuma.io/display-name: main-collector}`))
	for _, address := range []string{"otel-a.observability", "otel-b.observability"} {
		if address != "otel-a.observability" {
			apply(t, z, collector(address))
		}
		cluster := "system_meshaccesslog_" + strings.ReplaceAll(address, ".", "-") + "-4317"
		eventually(t, 10*time.Second, func() error {
			_, body := z.request("GET", "/meshes/default/dataplanes/web-1/_xds?proxy=envoy", "")
			if !strings.Contains(string(body), `"cluster_name":"`+cluster+`"`) || !strings.Contains(string(body), `"address":"`+address+`"`) {
				i := max(0, strings.Index(string(body), "meshaccesslog_")-200)
				return fmt.Errorf("no access log to %s in ...%.600s", cluster, body[i:])
			}
			return nil
		})
	}
}

// accessLogToAll is a MeshAccessLog of every outbound with one backend
// (its YAML, indented as the list item's body).
func accessLogToAll(name, backend string) string {
	return `type: MeshAccessLog
mesh: default
name: ` + name + `
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: Mesh}
      default:
        backends:
          - ` + backend + "\n"
}
