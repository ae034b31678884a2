package integration

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/auth"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// TestAccessWithdrawnDuringHandshake: a rogue zone opens its stream with a
// valid token and holds its handshake back; meanwhile its token is revoked
// (or its Zone disabled). Its handshake must then be refused: the stream
// was authenticated before the withdrawal but is registered after it.
func TestAccessWithdrawnDuringHandshake(t *testing.T) {
	kds := freeAddress(t)
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	for _, tc := range []struct {
		name, zone string
		withdraw   func(id string)
	}{
		{"token revoked", "rogue-a", func(id string) {
			if status, body := g.request("DELETE", "/tokens/zone/"+id, ""); status != 200 {
				t.Fatalf("revoke: %d %s", status, body)
			}
		}},
		{"zone disabled", "rogue-b", func(string) {
			if status, body := g.request("PUT", "/zones/rogue-b", `{"type":"Zone","name":"rogue-b","enabled":false}`); status/100 != 2 {
				t.Fatalf("disable: %d %s", status, body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "token")
			id := zoneTokenWithID(t, g, tc.zone, file)
			token := readTokenFile(t, file)
			stream, done := kdsDial(t, g, kds, tc.zone, token)
			defer done()
			// The global reads the stream's metadata when it opens; give it
			// time to authenticate before the access is withdrawn.
			time.Sleep(500 * time.Millisecond)
			tc.withdraw(id)
			time.Sleep(200 * time.Millisecond)
			_ = stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: &syncv1.Handshake{
				Zone: tc.zone, ZoneToken: token, Environment: syncv1.Environment_ENVIRONMENT_UNIVERSAL}}}})
			resp, err := stream.Recv()
			if err == nil && resp.GetMessage().GetHandshakeResponse().GetAccepted() {
				t.Fatalf("handshake accepted after the access was withdrawn")
			}
			if err == nil {
				if _, err = stream.Recv(); err == nil {
					t.Fatal("stream still open after a refused handshake")
				}
			}
			if !strings.Contains(err.Error(), "Unauthenticated") {
				t.Errorf("stream ended with %v, want Unauthenticated", err)
			}
			if zoneConnected(t, g, tc.zone) {
				t.Errorf("%s shows as connected", tc.zone)
			}
		})
	}
}

// browserRequest sends what a web page in a browser on the control
// plane's machine can send: headers as given, no token.
func browserRequest(t *testing.T, n *node, method, path, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, n.api+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBrowserCannotActAsLocalhostAdmin: with --api-localhost-is-admin (the
// default) a page in a browser on the same machine must not act through
// the loopback principal: not by a cross-site "simple" POST (CSRF), not
// after rebinding its own name to 127.0.0.1 (DNS rebinding).
func TestBrowserCannotActAsLocalhostAdmin(t *testing.T) {
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", freeAddress(t),
		"--api-allowed-hosts", "meridian.internal")
	keys := func() string {
		status, body := g.request("GET", "/tokens/zone/signing-keys", "")
		if status != 200 {
			t.Fatalf("signing keys: %d %s", status, body)
		}
		return string(body)
	}
	before := keys()
	rotate := `{"overlap":"0s"}`
	userToken := `{"name":"mallory","groups":["mesh-system:admin"],"validFor":"87600h"}`
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
		want             int
	}{
		{"cross-site fetch metadata", "/tokens/zone/signing-keys", rotate,
			map[string]string{"Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}, 403},
		{"another origin, no fetch metadata", "/tokens/user", userToken,
			map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example:8080"}, 403},
		{"same site but another port", "/tokens/user", userToken,
			map[string]string{"Content-Type": "text/plain", "Sec-Fetch-Site": "same-site"}, 403},
		{"text/plain from an old browser", "/tokens/zone/signing-keys", rotate,
			map[string]string{"Content-Type": "text/plain"}, 415},
		{"form body", "/tokens/user", "name=mallory",
			map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"rebound name", "/tokens/user", userToken,
			map[string]string{"Content-Type": "application/json", "Host": "evil.example"}, 401},
		{"rebound name reading", "/meshes", "", map[string]string{"Host": "evil.example:80"}, 401},
		{"rebound name, the console", "/gui/tokens", "", map[string]string{"Host": "evil.example"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if tc.body == "" {
				method = "GET"
			}
			status, body := browserRequest(t, g, method, tc.path, tc.body, tc.hdr)
			if status != tc.want {
				t.Errorf("%s %s: %d %s, want %d", method, tc.path, status, body, tc.want)
			}
		})
	}
	if after := keys(); after != before {
		t.Errorf("signing keys changed by a refused request:\n%s\n%s", before, after)
	}
	// What the operator does still works: meridianctl (JSON, no browser
	// headers), a same-origin page, and a configured name.
	for _, hdr := range []map[string]string{
		{"Content-Type": "application/json"},
		{"Content-Type": "application/json", "Sec-Fetch-Site": "same-origin", "Origin": "http://" + strings.TrimPrefix(g.api, "http://")},
		{"Content-Type": "application/json", "Host": "meridian.internal"},
	} {
		if status, body := browserRequest(t, g, "POST", "/tokens/user", `{"name":"ops","groups":["mesh-system:viewer"],"validFor":"1h"}`, hdr); status != 200 {
			t.Errorf("POST /tokens/user with %v: %d %s", hdr, status, body)
		}
	}
	if status, _ := browserRequest(t, g, "GET", "/gui/zones", "", map[string]string{"Host": "meridian.internal"}); status != 200 {
		t.Errorf("console under a configured name: %d", status)
	}
}

// TestUserTokenRevocation: a user token is revoked by its id, through any
// client, and stays revoked across a restart; a request for a token
// confined to no mesh, or named with characters that rewrite logs, is
// refused.
func TestUserTokenRevocation(t *testing.T) {
	dir := t.TempDir()
	g := startNode(t, "global", bins.Global, dir, "--kds-address", freeAddress(t), "--api-localhost-is-admin=false")
	admin := readTokenFile(t, filepath.Join(g.dataDir, auth.AdminTokenFileName))
	cmd := exec.Command(bins.Meridianctl, "--api-address", g.api, "--token", admin, "generate", "user-token",
		"--name", "alice", "--group", "mesh-system:admin", "--valid-for", "1h")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("generate user-token: %v %s", err, stderr.String())
	}
	alice := strings.TrimSpace(string(out))
	id := regexp.MustCompile(`token id (\S+),`).FindStringSubmatch(stderr.String())
	if id == nil {
		t.Fatalf("no token id in %q", stderr.String())
	}
	if code, _, body := g.requestAs(alice, "GET", "/meshes", ""); code != 200 {
		t.Fatalf("alice before revocation: %d %s", code, body)
	}
	if out, code := g.ctl("", "--token", admin, "revoke", "user-token", id[1]); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("revoke user-token: %d %s", code, out)
	}
	if code, _, body := g.requestAs(alice, "GET", "/meshes", ""); code != 401 || !strings.Contains(string(body), "revoked") {
		t.Errorf("alice after revocation: %d %s", code, body)
	}
	if err := g.proc.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	g.start()
	if code, _, body := g.requestAs(alice, "GET", "/meshes", ""); code != 401 {
		t.Errorf("alice after a restart: %d %s", code, body)
	}
	if code, _, _ := g.requestAs(admin, "GET", "/meshes", ""); code != 200 {
		t.Errorf("the admin token stopped working: %d", code)
	}
	for name, body := range map[string]string{
		"confined to no mesh": `{"name":"bob","groups":["mesh-system:admin"],"meshes":[],"validFor":"1h"}`,
		"bidi override":       `{"name":"eve\u202egnp.exe","groups":["mesh-system:viewer"],"validFor":"1h"}`,
		"newline in the name": `{"name":"eve\nlevel=info msg=ok","groups":["mesh-system:viewer"],"validFor":"1h"}`,
		"revoke an empty id":  "",
		"revoke a 65-char id": "",
	} {
		path, method := "/tokens/user", "POST"
		switch name {
		case "revoke an empty id":
			path, method = "/tokens/user/%20", "DELETE"
		case "revoke a 65-char id":
			path, method = "/tokens/user/"+strings.Repeat("a", 65), "DELETE"
		}
		if code, _, resp := g.requestAs(admin, method, path, body); code != 400 {
			t.Errorf("%s: %d %s, want 400", name, code, resp)
		}
	}
}

// TestKDSKeepsNoIdleStrangers: sockets that never authenticate are bounded
// per source and closed when their setup does not finish in time, so a
// host holding idle KDS connections cannot exhaust the global's descriptors.
func TestKDSKeepsNoIdleStrangers(t *testing.T) {
	kds := freeAddress(t)
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds,
		"--kds-max-connections-per-source", "3", "--kds-connection-timeout", "2s")
	closedWithin := func(c net.Conn, d time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	var idle []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", kds)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	time.Sleep(200 * time.Millisecond) // accepted, counted
	extra, err := net.Dial("tcp", kds)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if !closedWithin(extra, time.Second) {
		t.Error("a fourth connection from the same source was kept")
	}
	start := time.Now()
	for i, c := range idle {
		if !closedWithin(c, 5*time.Second) {
			t.Errorf("idle connection %d still open after %s", i, time.Since(start).Round(time.Millisecond))
		}
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("idle connections closed after %s, want about the 2 s connection timeout", took)
	}
	// Their places are free again: a real zone connects.
	file := filepath.Join(t.TempDir(), "token")
	zoneTokenWithID(t, g, "zone-1", file)
	startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal",
		"--global-address", kds, "--zone-token-file", file, "--kds-ca-file", filepath.Join(g.dataDir, "kds-server.crt"))
	eventually(t, 10*time.Second, func() error {
		if !zoneConnected(t, g, "zone-1") {
			return errors.New("zone-1 not connected")
		}
		return nil
	})
}

// rssMiB reads a process's resident set.
func rssMiB(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VmRSS")
	}
	kb, _ := strconv.Atoi(string(m[1]))
	return float64(kb) / 1024
}

// TestRogueZoneStatusReportsAreBounded: a zone token holder floods the
// global with policy status reports about policies that do not exist,
// with long messages. The global drops them and its memory stays put.
func TestRogueZoneStatusReportsAreBounded(t *testing.T) {
	kds := freeAddress(t)
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	file := filepath.Join(t.TempDir(), "token")
	zoneTokenWithID(t, g, "rogue", file)
	token := readTokenFile(t, file)
	stream, done := kdsDial(t, g, kds, "rogue", token)
	defer done()
	if err := stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: &syncv1.Handshake{
		Zone: "rogue", ZoneToken: token, Environment: syncv1.Environment_ENVIRONMENT_UNIVERSAL,
		Features: []string{"policy-status"}}}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || !resp.GetMessage().GetHandshakeResponse().GetAccepted() {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	go func() { // drain what the global sends
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	before := rssMiB(t, g.proc.PID())
	long := strings.Repeat("m", 4000)
	send := func(i int, more bool) error {
		rep := &syncv1.PolicyStatusReport{More: more}
		for j := range 50 {
			rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{
				Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("invented-%d-%d", i, j)},
				Conditions: []*syncv1.Condition{{Type: "Enforced", Status: "True", Reason: "Enforced",
					Message: fmt.Sprintf("%d-%d %s", i, j, long)}}})
		}
		return stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_PolicyStatusReport{PolicyStatusReport: rep}}})
	}
	start := time.Now()
	i := 0
	for ; time.Since(start) < 6*time.Second; i++ {
		if send(i, true) != nil {
			break // the global ended the stream (a report past its bounds): fine
		}
	}
	_ = send(i, false) // the report's last chunk: the global keeps it
	time.Sleep(500 * time.Millisecond)
	peak := rssMiB(t, g.proc.PID())
	// What the global keeps, once quiet (the collector's headroom and the
	// trimmer let a burst's garbage sit up to 64 MiB for a few seconds).
	var after float64
	for range 20 {
		time.Sleep(500 * time.Millisecond)
		if after = rssMiB(t, g.proc.PID()); after-before < 24 {
			break
		}
	}
	t.Logf("global RSS %.0f MiB before, %.0f during the flood, %.0f after", before, peak, after)
	if peak-before > 160 || after-before > 24 {
		t.Errorf("the global grew from %.0f to %.0f MiB under a report flood and kept %.0f", before, peak, after)
	}
}

// TestHashedNameCollisions: zone "zone-x" with namespace "b" and zone
// "zone-xb" without one get the same hashed names on the global (Kuma's
// hash joins them without a separator). The victim's resource is refused
// once, permanently, with a reason naming the collision, not resent
// forever; and a zone whose name is another zone's name plus one of its
// namespaces is refused when it connects.
func TestHashedNameCollisions(t *testing.T) {
	kds := freeAddress(t)
	c := &cluster{kdsAddress: kds}
	c.global = startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	xb := c.startZone(t, "zone-xb", "kubernetes", c.token(t, "zone-xb"))
	timeoutDoc := func(ns string) string {
		doc := "type: MeshTimeout\nmesh: default\nname: t\n"
		if ns != "" {
			doc += "namespace: " + ns + "\n"
		}
		return doc + "spec:\n  targetRef: {kind: Mesh}\n  to: [{targetRef: {kind: Mesh}, default: {idleTimeout: 5s}}]\n"
	}
	apply(t, xb, timeoutDoc(""))
	hashSuffix(t, c.global, "t") // zone-xb's copy is on the global
	x := c.startZone(t, "zone-x", "kubernetes", c.token(t, "zone-x"))
	apply(t, x, timeoutDoc("b"))
	var nacked uint64
	eventually(t, 15*time.Second, func() error {
		o := zoneOverview(t, c.global, "zone-x")
		if !strings.Contains(o.ZoneToGlobal.LastNackError, "hashed name collision") {
			return fmt.Errorf("zone-x's last NACK: %q", o.ZoneToGlobal.LastNackError)
		}
		nacked = o.ZoneToGlobal.BatchesNacked
		return nil
	})
	time.Sleep(3 * time.Second) // a retried NACK backs off from 100 ms
	if o := zoneOverview(t, c.global, "zone-x"); o.ZoneToGlobal.BatchesNacked != nacked {
		t.Errorf("the colliding resource was resent: %d NACKs, then %d", nacked, o.ZoneToGlobal.BatchesNacked)
	}
	status, body := x.request("GET", "/meshes/default/meshtimeouts/t?namespace=b", "")
	if status != 200 || !strings.Contains(string(body), "collision") {
		t.Errorf("zone-x's view of its refused policy: %d %s", status, body)
	}

	// A zone named zone-x plus one of zone-x's namespaces is refused.
	apply(t, x, timeoutDoc("c"))
	waitSynced := func() {
		eventually(t, 15*time.Second, func() error {
			status, body := c.global.request("GET", "/meshes/default/meshtimeouts?labels=kuma.io/zone=zone-x,k8s.kuma.io/namespace=c", "")
			if status != 200 || !strings.Contains(string(body), `"total":1`) {
				return fmt.Errorf("zone-x's namespace c on the global: %d %s", status, body)
			}
			return nil
		})
	}
	waitSynced()
	xc := c.startZone(t, "zone-xc", "universal", c.token(t, "zone-xc"))
	eventually(t, 15*time.Second, func() error {
		_, body := xc.request("GET", "/", "")
		if !strings.Contains(string(body), "zone-x") || !strings.Contains(string(body), "namespace") {
			return fmt.Errorf("zone-xc's sync state: %s", body)
		}
		return nil
	})
	if zoneConnected(t, c.global, "zone-xc") {
		t.Error("zone-xc, zone-x plus its namespace c, was admitted")
	}
}

// TestZoneQuota: a zone pushing more MeshServices than its quota stores
// only as many on the global, so only as many are relayed to the other
// zones; its status shows its use and the refusals.
func TestZoneQuota(t *testing.T) {
	kds := freeAddress(t)
	c := &cluster{kdsAddress: kds}
	c.global = startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds, "--kds-zone-max-resources", "20")
	z1 := c.startZone(t, "zone-1", "universal", c.token(t, "zone-1"))
	z2 := c.startZone(t, "zone-2", "universal", c.token(t, "zone-2"))
	var doc strings.Builder
	for i := range 30 {
		fmt.Fprintf(&doc, "---\ntype: MeshService\nmesh: default\nname: svc-%d\nspec:\n  ports: [{port: 80, targetPort: 8080, appProtocol: http}]\n", i)
	}
	apply(t, z1, doc.String())
	var st struct {
		Quota struct {
			Resources, MaxResources int
			Rejected                uint64
		} `json:"quota"`
	}
	eventually(t, 15*time.Second, func() error {
		if err := getJSON(c.global, "/zones/zone-1/_overview", &st); err != nil {
			return err
		}
		if st.Quota.Resources != 20 || st.Quota.MaxResources != 20 || st.Quota.Rejected == 0 {
			return fmt.Errorf("zone-1's quota: %+v", st.Quota)
		}
		return nil
	})
	count := func(n *node) int {
		var page struct{ Total int }
		if err := getJSON(n, "/meshes/default/meshservices", &page); err != nil {
			t.Fatal(err)
		}
		return page.Total
	}
	time.Sleep(time.Second)
	if got := count(c.global); got != 20 {
		t.Errorf("the global holds %d of zone-1's MeshServices, want 20", got)
	}
	if got := count(z2); got != 20 {
		t.Errorf("zone-2 received %d of zone-1's MeshServices, want 20", got)
	}
}

// TestSecretsAreAdminOnlyAndSealed: Secrets and GlobalSecrets are read by
// admins only, stored sealed (the data file holds no plaintext) on the
// global and in zones, and reach zones under their names; a Mesh's inline
// CA key is redacted for viewers, shown to admins.
func TestSecretsAreAdminOnlyAndSealed(t *testing.T) {
	kds := freeAddress(t)
	c := &cluster{kdsAddress: kds}
	c.global = startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	z := c.startZone(t, "zone-1", "universal", c.token(t, "zone-1"))
	plain := "super-secret-key-material-0123456789"
	data := base64.StdEncoding.EncodeToString([]byte(plain))
	apply(t, c.global, fmt.Sprintf("type: Secret\nmesh: default\nname: ca-key\ndata: %s\n---\ntype: GlobalSecret\nname: shared\ndata: %s\n", data, data))
	inlineKey := "-----BEGIN PRIVATE KEY-----inline-private-key-----END PRIVATE KEY-----"
	apply(t, c.global, fmt.Sprintf(`type: Mesh
name: default
mtls:
  enabledBackend: ca-1
  backends:
  - name: ca-1
    type: provided
    conf:
      cert: {secret: ca-cert}
      key: {inlineString: %q}
`, inlineKey))
	admin := readTokenFile(t, filepath.Join(c.global.dataDir, auth.AdminTokenFileName))
	viewer := c.global.ctlToken("--token", admin, "generate", "user-token", "--name", "ro", "--group", "mesh-system:viewer", "--valid-for", "1h")
	for _, path := range []string{"/meshes/default/secrets/ca-key", "/meshes/default/secrets", "/globalsecrets/shared", "/globalsecrets"} {
		if code, _, body := c.global.requestAs(viewer, "GET", path, ""); code != 403 {
			t.Errorf("viewer GET %s: %d %s", path, code, body)
		}
		if code, _, body := c.global.requestAs(admin, "GET", path, ""); code != 200 || !strings.Contains(string(body), data) {
			t.Errorf("admin GET %s: %d %s", path, code, body)
		}
	}
	if code, _, body := c.global.requestAs(viewer, "GET", "/meshes/default", ""); code != 200 ||
		strings.Contains(string(body), "inline-private-key") || !strings.Contains(string(body), "REDACTED") {
		t.Errorf("viewer GET of the mesh: %d %s", code, body)
	}
	if _, _, body := c.global.requestAs(admin, "GET", "/meshes/default", ""); !strings.Contains(string(body), "inline-private-key") {
		t.Errorf("admin GET of the mesh lost the key: %s", body)
	}
	// The zone receives both under their names.
	waitPresent(t, z, "/meshes/default/secrets/ca-key")
	waitPresent(t, z, "/globalsecrets/shared")
	if code, body := z.request("PUT", "/meshes/default/secrets/local", fmt.Sprintf(`{"type":"Secret","mesh":"default","name":"local","data":%q}`, data)); code != 403 {
		t.Errorf("a federated zone creating a Secret: %d %s", code, body)
	}
	for _, n := range []*node{c.global, z} {
		b, err := os.ReadFile(filepath.Join(n.dataDir, "meridian.db"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(plain)) || bytes.Contains(b, []byte(data)) {
			t.Errorf("%s's data file holds the secret in the clear", n.proc.Name)
		}
	}
}
