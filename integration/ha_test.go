package integration

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/storage/etcdstore/etcdtest"
)

// haFleet is two global replicas on a 3-member etcd cluster and two zones
// that know both replicas. Replica b reaches etcd through link proxies, so
// it alone can be cut off from etcd.
type haFleet struct {
	etcd       *etcdtest.Cluster
	a, b       *node
	kdsA, kdsB string
	bLinks     []*linkProxy
	z1, z2     *node
	tokenIDs   map[string]string // zone -> its token's id
}

func startHAFleet(t *testing.T) *haFleet {
	t.Helper()
	// etcd with mutual TLS: every scenario also exercises the replicas'
	// --etcd-ca-file/--etcd-cert-file/--etcd-key-file.
	f := &haFleet{etcd: etcdtest.Start(t, 3, etcdtest.Options{TLS: true}), tokenIDs: map[string]string{}}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyFile := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	var viaProxies []string
	for _, ep := range f.etcd.Endpoints() {
		p := startProxy(t, strings.TrimPrefix(ep, "https://"))
		f.bLinks = append(f.bLinks, p)
		viaProxies = append(viaProxies, "https://"+p.addr())
	}
	replica := func(name, kds string, endpoints []string) *node {
		return startNode(t, name, bins.Global, t.TempDir(), append([]string{"--kds-address", kds, "--store", "etcd",
			"--etcd-endpoints", strings.Join(endpoints, ","), "--etcd-secrets-key-file", keyFile,
			"--etcd-ca-file", f.etcd.TLS.CAFile, "--etcd-cert-file", f.etcd.TLS.ClientCertFile, "--etcd-key-file", f.etcd.TLS.ClientKeyFile,
			"--replica-name", name}, fastHeartbeats...)...)
	}
	f.kdsA, f.kdsB = freeAddress(t), freeAddress(t)
	f.a = replica("global-a", f.kdsA, f.etcd.Endpoints())
	f.b = replica("global-b", f.kdsB, viaProxies)
	certA, _ := os.ReadFile(filepath.Join(f.a.dataDir, "kds-server.crt"))
	certB, _ := os.ReadFile(filepath.Join(f.b.dataDir, "kds-server.crt"))
	if len(certA) == 0 || string(certA) != string(certB) {
		t.Fatal("the replicas do not share the KDS certificate (etcd's shared secrets)")
	}
	zone := func(name string, kdsOrder string) *node {
		tokenFile := filepath.Join(t.TempDir(), name+".token")
		f.tokenIDs[name] = zoneTokenWithID(t, f.a, name, tokenFile) // signed by a, accepted by both: the key is shared
		z := startNode(t, name, bins.Zone, t.TempDir(), append([]string{"--zone", name, "--environment", "universal",
			"--global-address", kdsOrder, "--zone-token-file", tokenFile,
			"--kds-ca-file", filepath.Join(f.a.dataDir, "kds-server.crt")}, fastHeartbeats...)...)
		waitPresent(t, z, "/meshes/default")
		return z
	}
	f.z1 = zone("zone-1", f.kdsA+","+f.kdsB)
	f.z2 = zone("zone-2", f.kdsB+","+f.kdsA)
	return f
}

// servedBy is the replica a zone's stream is on now (every replica's
// /zones says so: the replicas share their zones' status through etcd).
func (f *haFleet) servedBy(t *testing.T, zone string) *node {
	t.Helper()
	var found *node
	waitFor(t, 20*time.Second, zone+" to be connected to a replica", func() bool {
		found = nil
		var st struct {
			Connected bool   `json:"connected"`
			ServedBy  string `json:"servedBy"`
		}
		if err := getJSON(f.a, "/zones/"+zone+"/_overview", &st); err != nil || !st.Connected {
			return false
		}
		for _, g := range []*node{f.a, f.b} {
			if g.proc.Name == st.ServedBy {
				found = g
			}
		}
		return found != nil
	})
	return found
}

// servedByName is the replica serving zone according to g ("" when
// offline or unknown).
func servedByName(g *node, zone string) string {
	var st struct {
		Connected bool   `json:"connected"`
		ServedBy  string `json:"servedBy"`
	}
	if getJSON(g, "/zones/"+zone+"/_overview", &st) != nil || !st.Connected {
		return ""
	}
	return st.ServedBy
}

// tryPuts writes one MeshTimeout per name and returns the names answered
// 2xx and the first failure.
func tryPuts(n *node, names []string) (ok []string, firstErr string) {
	for _, name := range names {
		req, _ := http.NewRequest("PUT", n.api+"/meshes/default/meshtimeouts/"+name, strings.NewReader(timeoutBody(name, 1)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := bulkClient.Do(req)
		if err != nil {
			if firstErr == "" {
				firstErr = err.Error()
			}
			continue
		}
		var b [512]byte
		m, _ := resp.Body.Read(b[:])
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			ok = append(ok, name)
		} else if firstErr == "" {
			firstErr = fmt.Sprintf("%d %s", resp.StatusCode, b[:m])
		}
	}
	return ok, firstErr
}

// TestHAReplicas: two global replicas on a 3-member etcd cluster, two
// zones. Concurrent writes through both replicas converge everywhere; a
// zone whose replica is killed resumes on the other with nothing resent;
// one etcd member down changes nothing; without quorum writes fail with a
// clear 503 and nothing acknowledged is lost; a replica cut off from etcd
// stops serving and its zone moves.
func TestHAReplicas(t *testing.T) {
	f := startHAFleet(t)

	// Concurrent writes through both replicas and from both zones.
	var wg sync.WaitGroup
	for _, w := range []struct {
		n     *node
		names []string
	}{{f.a, seq("a", 0, 150)}, {f.b, seq("b", 0, 150)}, {f.z1, seq("z1", 0, 20)}, {f.z2, seq("z2", 0, 20)}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			putTimeouts(t, w.n, w.names, func(int) int { return 1 })
		}()
	}
	wg.Wait()
	for _, z := range []*node{f.z1, f.z2} {
		took := waitSame(t, 30*time.Second, f.a, z, "global", "")
		t.Logf("%s holds all 300 global policies %s after the writes", z.proc.Name, took.Round(time.Millisecond))
	}
	waitSame(t, 30*time.Second, f.z1, f.b, "zone", "zone-1")
	waitSame(t, 30*time.Second, f.z2, f.a, "zone", "zone-2")
	for _, g := range []*node{f.a, f.b} {
		for _, z := range []string{"zone-1", "zone-2"} {
			waitFor(t, 10*time.Second, g.proc.Name+" to show "+z+" connected (on whichever replica)", func() bool { return zoneConnected(t, g, z) })
		}
	}

	// kill -9 the replica zone-1 is on: it resumes on the other, nothing resent.
	t.Run("kill the zone's replica", func(t *testing.T) {
		dead := f.servedBy(t, "zone-1")
		other := f.b
		if dead == f.b {
			other = f.a
		}
		start := time.Now()
		if err := dead.proc.Kill(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "zone-1 to reconnect to the surviving replica", func() bool {
			return servedByName(other, "zone-1") == other.proc.Name
		})
		took := time.Since(start)
		o := zoneOverview(t, other, "zone-1")
		t.Logf("zone-1 reconnected to %s %s after the kill: resent %d global and %d zone resources, %d/%d full snapshots",
			other.proc.Name, took.Round(time.Millisecond), o.GlobalToZone.ResourcesSent, o.ZoneToGlobal.ResourcesSent,
			o.GlobalToZone.FullSnapshots, o.ZoneToGlobal.FullSnapshots)
		if o.GlobalToZone.ResourcesSent != 0 || o.ZoneToGlobal.ResourcesSent != 0 || o.GlobalToZone.FullSnapshots != 0 || o.ZoneToGlobal.FullSnapshots != 0 {
			t.Errorf("resume after failover resent resources: %+v", o)
		}
		putTimeouts(t, other, seq("after-kill", 0, 10), func(int) int { return 2 })
		waitSame(t, 30*time.Second, other, f.z1, "global", "")
		waitSame(t, 30*time.Second, other, f.z2, "global", "")
		dead.start() // back on its data dir; it takes the shared secrets from etcd again
	})

	t.Run("one etcd member down", func(t *testing.T) {
		// The leader, so that writes in flight meet an election.
		leader := f.etcd.Leader(t)
		leader.Kill()
		t.Logf("killed etcd leader %s", leader.Name)
		ok, errMsg := tryPuts(f.a, seq("one-down", 0, 20))
		if len(ok) != 20 {
			t.Fatalf("with 2 of 3 etcd members %d of 20 writes succeeded: %s", len(ok), errMsg)
		}
		waitSame(t, 30*time.Second, f.a, f.z2, "global", "")
	})

	t.Run("no quorum", func(t *testing.T) {
		var down []*etcdtest.Member
		for _, m := range f.etcd.Members {
			if m.Running() {
				down = append(down, m)
			}
		}
		down[0].Kill()
		var acked []string
		start := time.Now()
		waitFor(t, 20*time.Second, "writes to fail with 503 without quorum", func() bool {
			ok, errMsg := tryPuts(f.a, []string{fmt.Sprintf("no-quorum-%d", len(acked))})
			acked = append(acked, ok...)
			return len(ok) == 0 && strings.HasPrefix(errMsg, "503")
		})
		t.Logf("writes refused with 503 %s after quorum was lost", time.Since(start).Round(time.Millisecond))
		status, body := f.a.request("GET", "/readyz", "")
		if status != 503 {
			t.Errorf("/readyz without quorum: %d %s", status, body)
		}
		// Reads are refused too (they could be stale), at once.
		readStart := time.Now()
		status, body = f.a.request("GET", "/meshes/default/meshtimeouts", "")
		if status != 503 || !strings.Contains(string(body), "stale") || time.Since(readStart) > time.Second {
			t.Errorf("read without quorum: %d after %s: %s", status, time.Since(readStart), body)
		}
		_, errMsg := tryPuts(f.b, []string{"refused"})
		if !strings.Contains(errMsg, "quorum") {
			t.Errorf("the refusal does not say why: %s", errMsg)
		}
		for _, m := range f.etcd.Members {
			if !m.Running() {
				m.Restart(t)
			}
		}
		if err := f.etcd.WaitHealthy(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "replica a to accept writes again", func() bool {
			ok, _ := tryPuts(f.a, []string{"quorum-back"})
			return len(ok) == 1
		})
		for _, name := range acked {
			if _, found, err := f.a.get("/meshes/default/meshtimeouts/" + name); err != nil || !found {
				t.Errorf("write %s was acknowledged but is gone after quorum returned (%v)", name, err)
			}
		}
		for _, z := range []*node{f.z1, f.z2} {
			waitSame(t, 30*time.Second, f.a, z, "global", "")
		}
	})

	t.Run("replica cut off from etcd", func(t *testing.T) {
		// Put zone-2 on b first, by killing a's stream of it if needed.
		for _, p := range f.bLinks {
			p.setDown(true)
		}
		waitFor(t, 15*time.Second, "replica b to turn unready", func() bool {
			status, _ := f.b.request("GET", "/readyz", "")
			return status == 503
		})
		if ok, errMsg := tryPuts(f.b, []string{"through-b"}); len(ok) != 0 || !strings.HasPrefix(errMsg, "503") {
			t.Errorf("replica b without etcd accepted a write or failed unclearly: %v %s", ok, errMsg)
		}
		waitFor(t, 20*time.Second, "both zones to be served by replica a", func() bool {
			return servedByName(f.a, "zone-1") == "global-a" && servedByName(f.a, "zone-2") == "global-a"
		})
		putTimeouts(t, f.a, seq("while-b-cut", 0, 10), func(int) int { return 3 })
		waitSame(t, 30*time.Second, f.a, f.z2, "global", "")
		for _, p := range f.bLinks {
			p.setDown(false)
		}
		waitFor(t, 20*time.Second, "replica b to serve again", func() bool {
			status, _ := f.b.request("GET", "/readyz", "")
			return status == 200
		})
		waitSame(t, 30*time.Second, f.a, f.b, "global", "")
	})

	t.Run("key rotation and revocation reach every replica", func(t *testing.T) {
		status, body := f.a.request("POST", "/tokens/zone/signing-keys", `{"overlap":"1h"}`)
		if status != 200 {
			t.Fatalf("rotate on a: %d %s", status, body)
		}
		var rotated struct {
			New string `json:"kid"`
		}
		_ = json.Unmarshal(body, &rotated)
		took := waitFor(t, 15*time.Second, "replica b to use the key rotated on a", func() bool {
			var keys struct {
				Items []struct {
					Kid     string `json:"kid"`
					Current bool   `json:"current"`
				} `json:"items"`
			}
			if err := getJSON(f.b, "/tokens/zone/signing-keys", &keys); err != nil {
				return false
			}
			for _, k := range keys.Items {
				if k.Current && k.Kid == rotated.New && rotated.New != "" {
					return true
				}
			}
			return false
		})
		t.Logf("key %s rotated on a is current on b after %s", rotated.New, took.Round(time.Millisecond))

		if status, body := f.b.request("DELETE", "/tokens/zone/"+f.tokenIDs["zone-1"], ""); status/100 != 2 {
			t.Fatalf("revoke zone-1's token on b: %d %s", status, body)
		}
		took = waitFor(t, 15*time.Second, "zone-1 to be cut off by both replicas", func() bool {
			return !zoneConnected(t, f.a, "zone-1") && !zoneConnected(t, f.b, "zone-1")
		})
		time.Sleep(3 * time.Second) // the zone keeps retrying; both replicas must keep refusing
		if zoneConnected(t, f.a, "zone-1") || zoneConnected(t, f.b, "zone-1") {
			t.Error("a replica accepted zone-1 again with its revoked token")
		}
		t.Logf("zone-1's token revoked on b: its stream ended and every replica refuses it (%s)", took.Round(time.Millisecond))
	})
}
