package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/launcher"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// With real processes: authentication on both planes with
// localhost-is-admin off, zone token revocation and Zone enabled: false,
// the empty-snapshot attack, and slow uploads.

func (n *node) requestAs(token, method, path, body string) (int, http.Header, []byte) {
	n.t.Helper()
	req, err := http.NewRequest(method, n.api+path, strings.NewReader(body))
	if err != nil {
		n.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", contentType(body))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func readTokenFile(t *testing.T, path string) string {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %#o, want 0600", path, info.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestAPIAuthenticationWithRealProcesses(t *testing.T) {
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", freeAddress(t), "--api-localhost-is-admin=false")
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal", "--api-localhost-is-admin=false")
	other := startNode(t, "other-global", bins.Global, t.TempDir(), "--kds-address", freeAddress(t))
	admin := readTokenFile(t, filepath.Join(g.dataDir, auth.AdminTokenFileName))
	zoneAdmin := readTokenFile(t, filepath.Join(z.dataDir, auth.AdminTokenFileName))
	foreign := readTokenFile(t, filepath.Join(other.dataDir, auth.AdminTokenFileName))

	for _, n := range []*node{g, z} {
		for _, p := range []string{"/", "/healthz", "/readyz"} {
			if code, _, body := n.requestAs("", "GET", p, ""); code != 200 {
				t.Errorf("%s GET %s anonymous: %d %s", n.proc.Name, p, code, body)
			}
		}
		code, hdr, body := n.requestAs("", "GET", "/meshes", "")
		if code != 401 || !strings.Contains(hdr.Get("WWW-Authenticate"), "Bearer") || !strings.Contains(string(body), "admin-token") {
			t.Errorf("%s anonymous GET /meshes: %d %v %s", n.proc.Name, code, hdr, body)
		}
		if code, _, body := n.requestAs(foreign, "GET", "/meshes", ""); code != 401 || !strings.Contains(string(body), "signature") {
			t.Errorf("%s token of another control plane: %d %s", n.proc.Name, code, body)
		}
	}
	if code, _, body := z.requestAs(admin, "GET", "/meshes", ""); code != 401 {
		t.Errorf("the global's admin token on the zone: %d %s", code, body)
	}
	if code, _, body := z.requestAs(zoneAdmin, "GET", "/meshes", ""); code != 200 {
		t.Errorf("the zone's admin token: %d %s", code, body)
	}

	// meridianctl with --token-file and MERIDIAN_API_TOKEN.
	tokenFile := filepath.Join(g.dataDir, auth.AdminTokenFileName)
	if out, code := g.ctl(globalTimeout, "--token-file", tokenFile, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply with the admin token file: %s", out)
	}
	if out, code := g.ctl("", "get", "meshtimeouts"); code == 0 || !strings.Contains(out, "Bearer") {
		t.Errorf("get without a token: exit %d: %s", code, out)
	}
	viewer := g.ctlToken("--token", admin, "generate", "user-token", "--name", "ro", "--group", "mesh-system:viewer", "--valid-for", "1h")
	if code, _, body := g.requestAs(viewer, "GET", "/meshes/default/meshtimeouts", ""); code != 200 {
		t.Errorf("viewer reads: %d %s", code, body)
	}
	code, _, body := g.requestAs(viewer, "DELETE", "/meshes/default/meshtimeouts/default-timeout-global", "")
	if code != 403 || !strings.Contains(string(body), "mesh-system:admin") {
		t.Errorf("viewer deletes: %d %s", code, body)
	}
	if code, _, body := g.requestAs(viewer, "POST", "/tokens/zone", `{"zone":"zone-1","validFor":"1h"}`); code != 403 {
		t.Errorf("viewer mints a zone token: %d %s", code, body)
	}
	scoped := g.ctlToken("--token", admin, "generate", "user-token", "--name", "team", "--group", "mesh-system:admin", "--mesh", "default", "--valid-for", "1h")
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/meshes/default/meshtimeouts", "", 200},
		{"PUT", "/meshes/other", `{"type":"Mesh","name":"other"}`, 403},
		{"GET", "/zones", "", 403},
		{"POST", "/tokens/zone", `{"zone":"zone-1","validFor":"1h"}`, 403},
		{"POST", "/tokens/user", `{"name":"x","groups":["mesh-system:admin"],"validFor":"1h"}`, 403},
	} {
		if code, _, body := g.requestAs(scoped, c.method, c.path, c.body); code != c.want {
			t.Errorf("mesh-scoped %s %s: %d, want %d: %s", c.method, c.path, code, c.want, body)
		}
	}
	var meshes struct {
		Total int `json:"total"`
	}
	_, _, body = g.requestAs(scoped, "GET", "/meshes", "")
	if err := json.Unmarshal(body, &meshes); err != nil || meshes.Total != 1 {
		t.Errorf("mesh-scoped GET /meshes: %s", body)
	}
}

// zoneTokenWithID issues a zone token through the API and writes it 0600.
func zoneTokenWithID(t *testing.T, g *node, zone, path string) string {
	t.Helper()
	status, body := g.request("POST", "/tokens/zone", fmt.Sprintf(`{"zone":%q,"validFor":"1h"}`, zone))
	var resp struct{ Token, ID string }
	if status != 200 || json.Unmarshal(body, &resp) != nil || resp.ID == "" {
		t.Fatalf("POST /tokens/zone: %d %s", status, body)
	}
	if err := os.WriteFile(path, []byte(resp.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return resp.ID
}

func zoneConnected(t *testing.T, g *node, zone string) bool {
	t.Helper()
	status, body := g.request("GET", "/zones/"+zone+"/_overview", "")
	var st struct {
		Connected bool `json:"connected"`
	}
	return status == 200 && json.Unmarshal(body, &st) == nil && st.Connected
}

func TestZoneTokenRevocationAndDisable(t *testing.T) {
	kds := freeAddress(t)
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	tokenFile := filepath.Join(t.TempDir(), "zone-1.token")
	id := zoneTokenWithID(t, g, "zone-1", tokenFile)
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal",
		"--global-address", kds, "--zone-token-file", tokenFile, "--kds-ca-file", filepath.Join(g.dataDir, "kds-server.crt"))
	eventually(t, 15*time.Second, func() error {
		if !zoneConnected(t, g, "zone-1") {
			return fmt.Errorf("zone-1 not connected")
		}
		return nil
	})

	waitPresent(t, z, "/meshes/default") // the first snapshot is applied

	// Revocation ends the live stream within a second and keeps it out.
	start := time.Now()
	if status, body := g.request("DELETE", "/tokens/zone/"+id, ""); status != 200 {
		t.Fatalf("revoke: %d %s", status, body)
	}
	eventually(t, 2*time.Second, func() error {
		if zoneConnected(t, g, "zone-1") {
			return fmt.Errorf("zone-1 still connected after revoking its token")
		}
		return nil
	})
	t.Logf("revoked token's stream ended %s after the DELETE", time.Since(start).Round(time.Millisecond))
	eventually(t, 5*time.Second, func() error {
		_, body := z.request("GET", "/", "")
		if !strings.Contains(string(body), "revoked") {
			return fmt.Errorf("zone does not say why: %s", body)
		}
		return nil
	})
	if status, _ := z.request("GET", "/meshes/default", ""); status != 200 {
		t.Errorf("the zone stopped serving from its store: %d", status)
	}
	time.Sleep(1500 * time.Millisecond) // reconnect attempts with the revoked token
	if zoneConnected(t, g, "zone-1") {
		t.Fatal("a revoked token reconnected")
	}
	// The revocation survives a restart of the global.
	if err := g.proc.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	g.start()
	time.Sleep(1500 * time.Millisecond)
	if zoneConnected(t, g, "zone-1") {
		t.Fatal("a revoked token reconnected after the global restarted")
	}

	// A new token: the zone re-reads its file before every attempt.
	zoneTokenWithID(t, g, "zone-1", tokenFile)
	eventually(t, 40*time.Second, func() error {
		if !zoneConnected(t, g, "zone-1") {
			return fmt.Errorf("zone-1 not back with a new token")
		}
		return nil
	})

	// enabled: false disconnects and refuses; enabled: true lets it back.
	if status, body := g.request("PUT", "/zones/zone-1", `{"type":"Zone","name":"zone-1","enabled":false}`); status/100 != 2 {
		t.Fatalf("disable: %d %s", status, body)
	}
	eventually(t, 2*time.Second, func() error {
		if zoneConnected(t, g, "zone-1") {
			return fmt.Errorf("disabled zone still connected")
		}
		return nil
	})
	time.Sleep(1500 * time.Millisecond)
	if zoneConnected(t, g, "zone-1") {
		t.Fatal("a disabled zone reconnected")
	}
	if status, body := g.request("PUT", "/zones/zone-1", `{"type":"Zone","name":"zone-1","enabled":true}`); status/100 != 2 {
		t.Fatalf("enable: %d %s", status, body)
	}
	eventually(t, 40*time.Second, func() error {
		if !zoneConnected(t, g, "zone-1") {
			return fmt.Errorf("re-enabled zone not back")
		}
		return nil
	})
}

// kdsDial opens a raw KDS stream to g as zone with token.
func kdsDial(t *testing.T, g *node, addr, zone, token string) (syncv1.SyncService_StreamClient, func()) {
	t.Helper()
	tlsCfg, err := auth.ClientTLS(auth.ClientTLSConfig{CAFile: filepath.Join(g.dataDir, "kds-server.crt")})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ctx = metadata.AppendToOutgoingContext(ctx, kds.MetadataZone, zone, kds.MetadataAuthorization, "Bearer "+token)
	stream, err := syncv1.NewSyncServiceClient(conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream, func() { cancel(); _ = conn.Close() }
}

// TestEmptySnapshotAttack: the worst chain, replayed with a revoked
// token of zone-1 and with a valid token of zone-2: zone-1's resources on
// the global and its status stay as they were.
func TestEmptySnapshotAttack(t *testing.T) {
	c := startCluster(t)
	apply(t, c.zone1, strings.ReplaceAll(globalTimeout, "default-timeout-global", "zone-1-policy"))
	hashed := "/meshes/default/meshtimeouts/" + "zone-1-policy-" + hashSuffix(t, c.global, "zone-1-policy")
	waitPresent(t, c.global, hashed)
	status, body := c.global.request("GET", "/zones/zone-1/_overview", "")
	if status != 200 {
		t.Fatalf("overview: %d %s", status, body)
	}
	var before struct {
		ZoneToGlobal struct {
			Revision uint64 `json:"revision"`
		} `json:"zoneToGlobal"`
	}
	_ = json.Unmarshal(body, &before)

	revokedFile := filepath.Join(t.TempDir(), "revoked.token")
	revokedID := zoneTokenWithID(t, c.global, "zone-1", revokedFile)
	revoked := readTokenFile(t, revokedFile)
	if status, body := c.global.request("DELETE", "/tokens/zone/"+revokedID, ""); status != 200 {
		t.Fatalf("revoke: %d %s", status, body)
	}
	zone2File := filepath.Join(t.TempDir(), "zone-2.token")
	zoneTokenWithID(t, c.global, "zone-2", zone2File)
	zone2 := readTokenFile(t, zone2File)

	attacks := []struct{ name, zone, token string }{
		{"revoked zone-1 token", "zone-1", revoked},
		{"zone-2's token claiming zone-1", "zone-1", zone2},
	}
	for _, a := range attacks {
		stream, done := kdsDial(t, c.global, c.kdsAddress, a.zone, a.token)
		_ = stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: &syncv1.Handshake{
			Zone: "zone-1", ZoneToken: a.token, Environment: syncv1.Environment_ENVIRONMENT_UNIVERSAL, ResumeRevision: before.ZoneToGlobal.Revision}}}})
		_ = stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_DeltaBatch{DeltaBatch: &syncv1.DeltaBatch{
			Nonce: "x", Revision: before.ZoneToGlobal.Revision + 1, FullSnapshot: true, LastChunk: true}}}})
		_, err := stream.Recv()
		done()
		if err == nil || !strings.Contains(err.Error(), "Unauthenticated") {
			t.Errorf("%s: stream answered %v, want Unauthenticated", a.name, err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	waitPresent(t, c.global, hashed)
	if !zoneConnected(t, c.global, "zone-1") {
		t.Error("the real zone-1 lost its stream")
	}
	_, body = c.global.request("GET", "/zones/zone-1/_overview", "")
	if strings.Contains(string(body), "revoked") || strings.Contains(string(body), "another zone") {
		t.Errorf("attacks show in zone-1's status: %s", body)
	}
}

// TestSlowUploadIsCut: a client that trickles its body is cut after
// --api-read-timeout, and the control plane logs no error for it.
func TestSlowUploadIsCut(t *testing.T) {
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", freeAddress(t), "--api-read-timeout", "1s")
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.api, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /meshes/default/meshtimeouts/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n{")
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	for {
		_, _ = conn.Write([]byte(" "))
		if _, err := conn.Read(buf); err != nil {
			break
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a trickling upload was held for %s", d)
	}
	if strings.Contains(g.log.String(), "[ERROR]") {
		t.Errorf("an aborted upload logged an error:\n%s", g.log.String())
	}
}

func TestZoneTokenKeyRotation(t *testing.T) {
	kds := freeAddress(t)
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	tokenFile := filepath.Join(t.TempDir(), "zone-1.token")
	zoneTokenWithID(t, g, "zone-1", tokenFile)
	startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal",
		"--global-address", kds, "--zone-token-file", tokenFile, "--kds-ca-file", filepath.Join(g.dataDir, "kds-server.crt"))
	connected := func(want bool) func() error {
		return func() error {
			if zoneConnected(t, g, "zone-1") != want {
				return fmt.Errorf("zone-1 connected is not %v", want)
			}
			return nil
		}
	}
	eventually(t, 15*time.Second, connected(true))

	out, code := g.ctl("", "rotate", "zone-token-key", "--overlap", "3s")
	if code != 0 || !strings.Contains(out, "verifies until") {
		t.Fatalf("rotate: %s", out)
	}
	if out, code := g.ctl("", "inspect", "zone-token-keys"); code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(out, "current") {
		t.Errorf("inspect zone-token-keys:\n%s", out)
	}
	// During the overlap the old token keeps the zone connected.
	time.Sleep(time.Second)
	if !zoneConnected(t, g, "zone-1") {
		t.Fatal("the zone dropped during the overlap")
	}
	// When the old key retires, its stream ends and the old token is refused.
	eventually(t, 6*time.Second, connected(false))
	time.Sleep(time.Second)
	if zoneConnected(t, g, "zone-1") {
		t.Fatal("a token of a retired key reconnected")
	}
	// A token of the new key brings it back.
	zoneTokenWithID(t, g, "zone-1", tokenFile)
	eventually(t, 40*time.Second, connected(true))

	// Retiring a key explicitly ends its streams at once.
	out, code = g.ctl("", "rotate", "zone-token-key", "--overlap", "1h")
	if code != 0 {
		t.Fatalf("rotate: %s", out)
	}
	var keys struct {
		Items []struct {
			KID     string `json:"kid"`
			Current bool   `json:"current"`
		} `json:"items"`
	}
	_, body := g.request("GET", "/tokens/zone/signing-keys", "")
	if err := json.Unmarshal(body, &keys); err != nil || len(keys.Items) != 2 {
		t.Fatalf("keys: %s", body)
	}
	old := keys.Items[1].KID
	if out, code := g.ctl("", "retire", "zone-token-key", old); code != 0 {
		t.Fatalf("retire: %s", out)
	}
	eventually(t, 2*time.Second, connected(false))
	if out, code := g.ctl("", "retire", "zone-token-key", keys.Items[0].KID); code == 0 || !strings.Contains(out, "current key") {
		t.Errorf("retiring the current key: exit %d %s", code, out)
	}
}

// TestAPIOverHTTPS: --api-tls serves the API with the control plane's
// certificate; meridianctl verifies it with --ca-file.
func TestAPIOverHTTPS(t *testing.T) {
	dir := t.TempDir()
	addr, err := launcher.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	log := &logBuffer{}
	proc := &launcher.Process{Name: "global", Path: bins.Global, Log: log, Args: []string{"--data-dir", dir, "--api-address", addr,
		"--kds-address", freeAddress(t), "--api-tls", "--api-localhost-is-admin=false"}}
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proc.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("global log:\n%s", log.String())
		}
	})
	ctl := func(args ...string) (string, error) {
		out, err := exec.Command(bins.Meridianctl, append([]string{"--api-address", "https://" + addr}, args...)...).CombinedOutput()
		return string(out), err
	}
	ca := filepath.Join(dir, "kds-server.crt")
	eventually(t, 15*time.Second, func() error {
		out, err := ctl("--ca-file", ca, "--token-file", filepath.Join(dir, auth.AdminTokenFileName), "get", "meshes")
		if err != nil || !strings.Contains(out, "default") {
			return fmt.Errorf("get meshes over https: %v %s", err, out)
		}
		return nil
	})
	if out, err := ctl("--token-file", filepath.Join(dir, auth.AdminTokenFileName), "get", "meshes"); err == nil || !strings.Contains(out, "certificate") {
		t.Errorf("https without the CA: %v %s", err, out)
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain http is served on the https port")
		}
	}
}
