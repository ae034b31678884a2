package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/launcher"
	greeterv1 "github.com/meridian-mesh/meridian/proto/meridian/greeter/v1"
)

// Real workloads (docs/dataplane.md): grpc-go xDS clients and servers
// (examples/greeter) under real meridian-dp agents, configured by real zone
// control planes synced from a real global.

// dpCluster is a global and two Universal zones serving xDS.
type dpCluster struct {
	global, zone1, zone2 *node
}

func startDPCluster(t *testing.T) *dpCluster {
	t.Helper()
	kds := freeAddress(t)
	c := &cluster{kdsAddress: kds}
	c.global = startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	z1 := c.startZone(t, "zone-1", "universal", c.token(t, "zone-1"))
	z2 := c.startZone(t, "zone-2", "universal", c.token(t, "zone-2"))
	return &dpCluster{global: c.global, zone1: z1, zone2: z2}
}

// mtlsMesh turns mTLS on for mesh default (builtin CA) with leaf
// certificates living validity, on the global.
func mtlsMesh(t *testing.T, g *node, validity string) {
	t.Helper()
	apply(t, g, `type: Mesh
name: default
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
      dpCert:
        rotation:
          expiration: `+validity+"\n")
}

// workload is one meridian-dp running a greeter.
type workload struct {
	t    *testing.T
	name string
	proc *launcher.Process
	log  *logBuffer
	dir  string
}

// greeterDataplane is a Universal Dataplane of service svc listening on
// port (127.0.0.1), calling nothing in particular.
func greeterDataplane(name, svc string, port int) string {
	return fmt.Sprintf(`type: Dataplane
mesh: default
name: %s
networking:
  address: 127.0.0.1
  inbound:
    - port: %d
      tags:
        kuma.io/service: %s
`, name, port, svc)
}

// startWorkload runs `meridian-dp run` for Dataplane dp (its name is
// name) in zone z with a token for it, running greeter with args.
func startWorkload(t *testing.T, z *node, name, dp string, args ...string) *workload {
	t.Helper()
	dir := t.TempDir()
	token := z.ctlToken("generate", "dataplane-token", "--mesh", "default", "--name", name, "--valid-for", "1h")
	return startWorkloadWith(t, z, name, dp, token, dir, args...)
}

func startWorkloadWith(t *testing.T, z *node, name, dp, token, dir string, args ...string) *workload {
	t.Helper()
	for file, data := range map[string]string{"dp.yaml": dp, "token": token} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w := &workload{t: t, name: name, log: &logBuffer{}, dir: filepath.Join(dir, "agent")}
	w.proc = &launcher.Process{Name: name, Path: bins.MeridianDP, Log: w.log, Args: append([]string{"run",
		"--cp-address", "https://" + z.xds, "--dataplane-file", filepath.Join(dir, "dp.yaml"),
		"--dataplane-token-file", filepath.Join(dir, "token"), "--ca-cert-file", filepath.Join(z.dataDir, "xds-server.crt"),
		"--dir", w.dir, "--", bins.Greeter}, args...)}
	if err := w.proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.proc.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("%s log:\n%s", name, w.log.String())
		}
	})
	return w
}

// lines are the workload's output lines so far.
func (w *workload) lines() []string {
	return strings.Split(strings.TrimRight(w.log.String(), "\n"), "\n")
}

// mark is where the output is now; waitCall looks after it.
func (w *workload) mark() int { return len(w.lines()) }

// waitCall waits for a call result line (after mark) that has prefix,
// and returns when it came.
func (w *workload) waitCall(mark int, prefix string, timeout time.Duration) time.Time {
	w.t.Helper()
	var at time.Time
	eventually(w.t, timeout, func() error {
		lines := w.lines()
		for _, l := range lines[min(mark, len(lines)):] {
			if strings.HasPrefix(l, prefix) {
				at = time.Now()
				return nil
			}
		}
		last := ""
		if len(lines) > 0 {
			last = lines[len(lines)-1]
		}
		return fmt.Errorf("%s: no call result %q yet (last line %q)", w.name, prefix, last)
	})
	return at
}

// callResults counts the result lines after mark: ok and failed.
func (w *workload) callResults(mark int) (ok, failed []string) {
	lines := w.lines()
	for _, l := range lines[min(mark, len(lines)):] {
		switch {
		case strings.HasPrefix(l, "ok "):
			ok = append(ok, l)
		case strings.HasPrefix(l, "error "):
			failed = append(failed, l)
		}
	}
	return ok, failed
}

const allowAll = `type: MeshTrafficPermission
mesh: default
name: allow-all
spec:
  targetRef: {kind: Mesh}
  from:
    - targetRef: {kind: Mesh}
      default: {action: Allow}
`

// TestProxylessGRPCAcrossZones: a client in zone-1 calls the greeter of
// zone-1; with it stopped, it fails over to zone-2's; a global
// MeshTrafficPermission denying the client gives PermissionDenied within
// a second of the write, allowing it again restores the calls; a global
// Deny override is not re-allowed by a zone policy; a client without a
// mesh certificate is refused by the server.
func TestProxylessGRPCAcrossZones(t *testing.T) {
	c := startDPCluster(t)
	mtlsMesh(t, c.global, "24h")
	apply(t, c.global, allowAll)
	waitPresent(t, c.zone1, "/meshes/default/meshtrafficpermissions")
	p1, p2 := freePort(t), freePort(t)
	g1 := startWorkload(t, c.zone1, "greeter-1", greeterDataplane("greeter-1", "greeter", p1), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", p1))
	startWorkload(t, c.zone2, "greeter-2", greeterDataplane("greeter-2", "greeter", p2), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", p2))
	// The client declares no outbound: it may call every service, and
	// the policies of each reach it (implicit outbounds).
	client := startWorkload(t, c.zone1, "client-1", greeterDataplane("client-1", "client", freePort(t)),
		"call", "--service", "greeter", "--every", "50ms", "--timeout", "1s")

	client.waitCall(0, "ok zone-1 default.greeter-1", 30*time.Second)

	// Failover: zone-1's instance goes away.
	if err := g1.proc.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	client.waitCall(client.mark(), "ok zone-2 default.greeter-2", 30*time.Second)
	// crossZone failover rules decide which zones take over: with none
	// admitting zone-2, the calls fail instead of leaving zone-1; a rule
	// admitting only zone-2 brings them back.
	failover := `type: MeshLoadBalancingStrategy
mesh: default
name: greeter-failover
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: greeter}
      default:
        localityAwareness:
          crossZone:
            failover:
              - to: {type: %s}
`
	apply(t, c.global, fmt.Sprintf(failover, "None"))
	m := client.mark()
	client.waitCall(m, "error ", 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	if ok, _ := client.callResults(client.mark() - 3); len(ok) > 0 {
		t.Errorf("calls left zone-1 with no failover rule admitting zone-2: %v", ok)
	}
	apply(t, c.global, fmt.Sprintf(failover, "Only, zones: [zone-2]"))
	client.waitCall(client.mark(), "ok zone-2 default.greeter-2", 10*time.Second)
	// Back: an instance in zone-1 again takes the calls from zone-2.
	p1b := freePort(t)
	startWorkload(t, c.zone1, "greeter-1b", greeterDataplane("greeter-1b", "greeter", p1b), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", p1b))
	client.waitCall(client.mark(), "ok zone-1 default.greeter-1b", 30*time.Second)

	// A global deny for the client's service, then allow again.
	deny := `type: MeshTrafficPermission
mesh: default
name: deny-client
spec:
  targetRef: {kind: Mesh}
  from:
    - targetRef: {kind: MeshService, name: client}
      default: {action: Deny}
`
	m = client.mark()
	wrote := time.Now()
	apply(t, c.global, deny)
	denied := client.waitCall(m, "error PermissionDenied", 10*time.Second)
	t.Logf("global deny → PermissionDenied in a zone-1 client: %s", denied.Sub(wrote))
	if d := denied.Sub(wrote); d > time.Second {
		t.Errorf("PermissionDenied %s after the global write, want within 1 s", d)
	}
	m = client.mark()
	if out, code := c.global.ctl("", "delete", "meshtrafficpermission", "deny-client", "--mesh", "default"); code != 0 {
		t.Fatalf("delete: %s", out)
	}
	client.waitCall(m, "ok zone-1", 10*time.Second)

	// A global system Deny override beats a zone's allow.
	apply(t, c.global, `type: MeshTrafficPermission
mesh: default
name: global-deny-client
spec:
  targetRef: {kind: Mesh}
  from:
    - targetRef: {kind: MeshService, name: client}
      override: {action: Deny}
`)
	apply(t, c.zone1, `type: MeshTrafficPermission
mesh: default
name: zone-allow-client
spec:
  targetRef: {kind: MeshService, name: greeter}
  from:
    - targetRef: {kind: MeshService, name: client}
      default: {action: Allow}
`)
	m = client.mark()
	client.waitCall(m, "error PermissionDenied", 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	if ok, _ := client.callResults(client.mark() - 5); len(ok) > 0 {
		t.Errorf("a zone allow re-allowed a global deny override: %v", ok)
	}

	// A client without a mesh certificate: the server requires one.
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", p2), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = greeterv1.NewGreeterServiceClient(conn).SayHello(ctx, &greeterv1.SayHelloRequest{Name: "intruder"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a plaintext client reached the server: %v", err)
	}
}

// freePort is a port nobody listens on (for a workload's inbound).
func freePort(t *testing.T) int {
	t.Helper()
	addr := freeAddress(t)
	var port int
	if _, err := fmt.Sscanf(addr[strings.LastIndex(addr, ":")+1:], "%d", &port); err != nil {
		t.Fatal(err)
	}
	return port
}

// TestCertificateRenewalDropsNoCall: workload certificates living 6 s are
// renewed at two thirds of their life while a client calls every 50 ms;
// not one call fails.
func TestCertificateRenewalDropsNoCall(t *testing.T) {
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal")
	mtlsMesh(t, z, "6s")
	apply(t, z, allowAll)
	port := freePort(t)
	server := startWorkload(t, z, "greeter-1", greeterDataplane("greeter-1", "greeter", port), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	client := startWorkload(t, z, "client-1", greeterDataplane("client-1", "client", freePort(t)),
		"call", "--service", "greeter", "--every", "50ms", "--timeout", "2s")
	client.waitCall(0, "ok zone-1", 30*time.Second)
	first := serial(t, server)
	m := client.mark()
	time.Sleep(14 * time.Second) // two renewals at least
	ok, failed := client.callResults(m)
	if len(failed) > 0 {
		t.Errorf("%d of %d calls failed during renewals: %v", len(failed), len(ok)+len(failed), failed[:min(5, len(failed))])
	}
	if len(ok) < 100 {
		t.Errorf("only %d calls in 14 s", len(ok))
	}
	if serial(t, server) == first {
		t.Error("the server's certificate was not renewed")
	}
}

// serial is the serial number of a workload's current certificate.
func serial(t *testing.T, w *workload) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(w.dir, "certs", "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	certs, err := parsePEMCerts(data)
	if err != nil || len(certs) == 0 {
		t.Fatalf("certificate: %v", err)
	}
	if len(certs[0].URIs) == 0 || !strings.HasPrefix(certs[0].URIs[0].String(), "spiffe://default/") {
		t.Fatalf("workload certificate SANs %v", certs[0].URIs)
	}
	return certs[0].SerialNumber.String()
}

func parsePEMCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return out, nil
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// TestZoneKill9KeepsTraffic: with the zone killed (-9), calls keep flowing
// on the last configuration; a policy written meanwhile on the global takes
// effect once the zone is back and the proxies reconnected.
func TestZoneKill9KeepsTraffic(t *testing.T) {
	c := startDPCluster(t)
	mtlsMesh(t, c.global, "24h")
	apply(t, c.global, allowAll)
	waitPresent(t, c.zone1, "/meshes/default/meshtrafficpermissions/"+hashed(t, c.zone1, "MeshTrafficPermission", "allow-all"))
	port := freePort(t)
	startWorkload(t, c.zone1, "greeter-1", greeterDataplane("greeter-1", "greeter", port), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	// The client declares no outbound: it may call every service, and
	// the policies of each reach it (implicit outbounds).
	client := startWorkload(t, c.zone1, "client-1", greeterDataplane("client-1", "client", freePort(t)),
		"call", "--service", "greeter", "--every", "50ms", "--timeout", "1s")
	client.waitCall(0, "ok zone-1", 30*time.Second)

	if err := c.zone1.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	m := client.mark()
	time.Sleep(2 * time.Second)
	ok, failed := client.callResults(m)
	if len(failed) > 0 || len(ok) < 10 {
		t.Errorf("with the zone down: %d calls ok, %d failed %v", len(ok), len(failed), failed[:min(3, len(failed))])
	}
	apply(t, c.global, `type: MeshTrafficPermission
mesh: default
name: deny-client
spec:
  targetRef: {kind: Mesh}
  from:
    - targetRef: {kind: MeshService, name: client}
      default: {action: Deny}
`)
	time.Sleep(500 * time.Millisecond)
	if _, failed := client.callResults(m); len(failed) > 0 {
		t.Errorf("the write reached the client with its zone down: %v", failed[:1])
	}
	c.zone1.start()
	client.waitCall(client.mark(), "error PermissionDenied", 30*time.Second)
}

// hashed is the name a zone gives a global policy's copy (read back from
// the zone by display name).
func hashed(t *testing.T, z *node, typ, display string) string {
	t.Helper()
	var name string
	eventually(t, 15*time.Second, func() error {
		status, body := z.request("GET", "/meshes/default/"+strings.ToLower(typ)+"s", "")
		if status != 200 {
			return fmt.Errorf("list: %d", status)
		}
		for _, part := range strings.Split(string(body), `"name":"`)[1:] {
			n := part[:strings.Index(part, `"`)]
			if strings.HasPrefix(n, display) {
				name = n
				return nil
			}
		}
		return fmt.Errorf("no %s %s in the zone yet", typ, display)
	})
	return name
}

// TestWorkloadIdentityIsEnforced: a token for one Dataplane registers no
// other; an xDS stream with one Dataplane's certificate cannot ask for
// another's resources; a revoked token's streams end; a certificate of
// another mesh's CA is refused by a server.
func TestWorkloadIdentityIsEnforced(t *testing.T) {
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal")
	mtlsMesh(t, z, "24h")
	apply(t, z, allowAll)
	port := freePort(t)
	server := startWorkload(t, z, "greeter-1", greeterDataplane("greeter-1", "greeter", port), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	eventually(t, 30*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(server.dir, "bootstrap.json")); err != nil {
			return err
		}
		return nil
	})

	// A token for web-1 registers nothing else: one line, non-zero exit.
	dir := t.TempDir()
	webToken := z.ctlToken("generate", "dataplane-token", "--mesh", "default", "--name", "web-1", "--valid-for", "1h")
	w := startWorkloadWith(t, z, "web-1-as-backend", greeterDataplane("backend-1", "backend", freePort(t)), webToken, dir, "call", "--service", "greeter")
	select {
	case <-w.proc.Exited():
	case <-time.After(15 * time.Second):
		t.Fatal("meridian-dp with a token for another Dataplane kept running")
	}
	if w.proc.ExitErr() == nil || !strings.Contains(w.log.String(), `the token is for Dataplane "web-1", not "backend-1"`) {
		t.Errorf("exit %v, output:\n%s", w.proc.ExitErr(), w.log.String())
	}
	if status, _ := z.request("GET", "/meshes/default/dataplanes/backend-1", ""); status != 404 {
		t.Errorf("backend-1 registered with web-1's token: %d", status)
	}

	// A token file other users can read is refused before anything is
	// registered, as a zone token file is.
	loose := t.TempDir()
	looseToken := z.ctlToken("generate", "dataplane-token", "--mesh", "default", "--name", "loose-1", "--valid-for", "1h")
	for file, data := range map[string]string{"dp.yaml": greeterDataplane("loose-1", "loose", freePort(t)), "token": looseToken} {
		if err := os.WriteFile(filepath.Join(loose, file), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(bins.MeridianDP, "run", "--cp-address", "https://"+z.xds, "--dataplane-file", filepath.Join(loose, "dp.yaml"),
		"--dataplane-token-file", filepath.Join(loose, "token"), "--ca-cert-file", filepath.Join(z.dataDir, "xds-server.crt"),
		"--", bins.Greeter, "serve").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--dataplane-token-file") || !strings.Contains(string(out), "want 0600") {
		t.Errorf("meridian-dp with a token file of mode 0644: %v, output:\n%s", err, out)
	}
	if status, _ := z.request("GET", "/meshes/default/dataplanes/loose-1", ""); status != 404 {
		t.Errorf("loose-1 registered with a token file others can read: %d", status)
	}

	// greeter-1's xDS certificate cannot ask for client-1's resources.
	xdsTLS := agentTLS(t, server.dir, "xds")
	conn, err := grpc.NewClient(z.xds, grpc.WithTransportCredentials(credentials.NewTLS(xdsTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "default.client-1"}, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("greeter-1's certificate asking for client-1's clusters: %v, want PermissionDenied", err)
	}

	// A rejection is shown with the client's message in _xds, meridianctl
	// and the console, and the rejected version is not sent again.
	nackRejection(t, z, conn)

	// A certificate of another mesh's CA is refused by greeter-1.
	apply(t, z, `type: Mesh
name: other
mtls:
  enabledBackend: ca-2
  backends:
    - name: ca-2
      type: builtin
`)
	otherToken := z.ctlToken("generate", "dataplane-token", "--mesh", "other", "--name", "stranger", "--valid-for", "1h")
	strangerDP := strings.Replace(greeterDataplane("stranger", "client", freePort(t)), "mesh: default", "mesh: other", 1)
	stranger := startWorkloadWith(t, z, "stranger", strangerDP, otherToken, t.TempDir(), "call", "--service", "nothing", "--every", "1s")
	eventually(t, 30*time.Second, func() error {
		certs, err := parsePEMCerts(readFile(filepath.Join(stranger.dir, "certs", "cert.pem")))
		if err != nil || len(certs) == 0 || len(certs[0].URIs) == 0 || !strings.HasPrefix(certs[0].URIs[0].String(), "spiffe://other/") {
			return fmt.Errorf("no workload certificate of mesh other yet")
		}
		return nil
	})
	strangerTLS := agentTLS(t, stranger.dir, "certs")
	strangerTLS.InsecureSkipVerify = true // the stranger does not check the server; the server checks it
	sconn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(credentials.NewTLS(strangerTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close()
	_, err = greeterv1.NewGreeterServiceClient(sconn).SayHello(ctx, &greeterv1.SayHelloRequest{Name: "stranger"})
	if err == nil {
		t.Error("a certificate of mesh other's CA was accepted by a server of mesh default")
	}

	// Revoking greeter-1's token ends its agent's session and its xDS streams.
	tokenID := agentToken(t, z, "greeter-1")
	if out, code := z.ctl("", "revoke", "dataplane-token", tokenID); code != 0 {
		t.Fatalf("revoke: %s", out)
	}
	eventually(t, 10*time.Second, func() error {
		v := xdsState(t, z, "greeter-1")
		if v.Agent.Connected || v.Connection.Connected {
			return fmt.Errorf("greeter-1 still connected: agent %v, xDS %v", v.Agent.Connected, v.Connection.Connected)
		}
		return nil
	})
}

// agentTLS is a TLS client configuration from an agent's certificate
// directory (xds or certs).
func agentTLS(t *testing.T, agentDir, sub string) *tls.Config {
	t.Helper()
	d := filepath.Join(agentDir, sub)
	pair, err := tls.LoadX509KeyPair(filepath.Join(d, "cert.pem"), filepath.Join(d, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(readFile(filepath.Join(d, "ca.pem")))
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12}
}

func readFile(path string) []byte {
	b, _ := os.ReadFile(path)
	return b
}

// xdsView is what the tests read of `_xds`.
type xdsView struct {
	Agent struct {
		Connected bool   `json:"connected"`
		Token     string `json:"token"`
	} `json:"agent"`
	Connection struct {
		Connected bool `json:"connected"`
		Types     map[string]struct {
			Sent  string `json:"sent"`
			Acked string `json:"acked"`
			Nack  *struct {
				Message  string   `json:"message"`
				Policies []string `json:"policies"`
			} `json:"nack"`
		} `json:"types"`
	} `json:"connection"`
	Dropped []string `json:"dropped"`
}

func xdsState(t *testing.T, z *node, dp string) xdsView {
	t.Helper()
	status, body := z.request("GET", "/meshes/default/dataplanes/"+dp+"/_xds", "")
	if status != 200 {
		t.Fatalf("_xds: %d %s", status, body)
	}
	var v xdsView
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("_xds: %v", err)
	}
	return v
}

// agentToken is the token id greeter's agent joined with (from _xds).
func agentToken(t *testing.T, z *node, dp string) string {
	t.Helper()
	v := xdsState(t, z, dp)
	if v.Agent.Token == "" {
		t.Fatalf("no token in _xds of %s", dp)
	}
	return v.Agent.Token
}

// nackRejection opens a second stream as greeter-1 (its own xDS
// certificate), rejects the listeners it gets and checks every view of
// the proxy shows the rejection.
func nackRejection(t *testing.T, z *node, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "default.greeter-1"}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	const msg = "integration: listener refused on purpose"
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		v := xdsState(t, z, "greeter-1")
		if l := v.Connection.Types["Listener"]; l.Nack == nil || l.Nack.Message != msg {
			return fmt.Errorf("_xds shows no rejection: %+v", v.Connection.Types)
		}
		return nil
	})
	out, code := z.ctl("", "inspect", "dataplane", "greeter-1")
	if code != 0 || !strings.Contains(out, "NACK of "+resp.GetVersionInfo()) || !strings.Contains(out, msg) || !strings.Contains(out, "xDS          connected") {
		t.Errorf("meridianctl inspect dataplane:\n%s", out)
	}
	status, page := z.request("GET", "/gui/meshes/default/dataplanes/greeter-1", "")
	if status != 200 || !strings.Contains(string(page), msg) || !strings.Contains(string(page), `data-xds="connected"`) {
		t.Errorf("console page: %d, rejection or connection missing", status)
	}
	got := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		got <- err
	}()
	select {
	case err := <-got:
		t.Errorf("after the rejection the server sent again (%v)", err)
	case <-time.After(time.Second):
	}
}
