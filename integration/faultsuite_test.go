package integration

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
)

// soak runs the kill -9 scenarios for 20 rounds each instead of 3:
// go test ./integration -run Kill9 -soak -timeout 60m
var soak = flag.Bool("soak", false, "run the kill -9 fault scenarios for 20 rounds each instead of 3")

// fastHeartbeats make a partition or a stall visible within two seconds.
var fastHeartbeats = []string{"--kds-heartbeat-interval", "500ms", "--kds-heartbeat-timeout", "2s"}

// startLinkedZone starts a zone whose KDS link goes through a linkProxy.
func startLinkedZone(t *testing.T, g *node, kds, zone, env string, args ...string) (*node, *linkProxy) {
	t.Helper()
	proxy := startProxy(t, kds)
	tokenFile := filepath.Join(t.TempDir(), zone+".token")
	zoneTokenWithID(t, g, zone, tokenFile)
	z := startNode(t, zone, bins.Zone, t.TempDir(), append([]string{"--zone", zone, "--environment", env,
		"--global-address", proxy.addr(), "--zone-token-file", tokenFile,
		"--kds-ca-file", filepath.Join(g.dataDir, "kds-server.crt")}, args...)...)
	waitPresent(t, z, "/meshes/default")
	return z, proxy
}

// startGlobal starts a global with the given extra flags; it returns the
// node and its KDS address.
func startGlobal(t *testing.T, args ...string) (*node, string) {
	t.Helper()
	kds := freeAddress(t)
	return startNode(t, "global", bins.Global, t.TempDir(), append([]string{"--kds-address", kds}, args...)...), kds
}

// timeoutBody is a MeshTimeout targeting the whole mesh with idle seconds.
func timeoutBody(name string, idle int) string {
	return fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":%q,"spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}}]}}`, name, idle)
}

var bulkClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 30 * time.Second}

// putTimeouts writes one MeshTimeout per name (idle seconds from idle) with
// 8 concurrent clients and fails the test on any refusal. labels, when
// given, sets the labels of each body.
func putTimeouts(t *testing.T, n *node, names []string, idle func(i int) int, labels ...func() string) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				url := n.api + "/meshes/default/meshtimeouts/" + names[i]
				body := timeoutBody(names[i], idle(i))
				if len(labels) > 0 {
					body = strings.Replace(body, `"spec":`, `"labels":`+labels[0]()+`,"spec":`, 1)
				}
				req, _ := http.NewRequest("PUT", url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := bulkClient.Do(req)
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode/100 == 2 {
						continue
					}
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				mu.Lock()
				failures = append(failures, fmt.Sprintf("PUT %s: %v", names[i], err))
				mu.Unlock()
			}
		}()
	}
	for i := range names {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d writes failed, first: %s", len(failures), failures[0])
	}
}

// randomLabels gives n labels of 63 random hex characters each, as JSON.
func randomLabels(n int) func() string {
	return func() string {
		parts := make([]string, n)
		for i := range parts {
			b := make([]byte, 32)
			for j := range b {
				b[j] = byte(rand.Uint32())
			}
			parts[i] = fmt.Sprintf(`"test.meridian.dev/r%d":%q`, i, hex.EncodeToString(b)[:63])
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
}

func seq(prefix string, from, to int) []string {
	out := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s-%05d", prefix, i))
	}
	return out
}

// byOrigin renders a node's MeshTimeouts of one origin as sorted
// "display-name spec" lines (own resources by name, copies by display
// name), the zone's origin further narrowed to zone when non-empty.
func byOrigin(n *node, origin, zone string) ([]string, error) {
	status, body := n.request("GET", "/meshes/default/meshtimeouts?size=10000", "")
	if status != 200 {
		return nil, fmt.Errorf("list on %s: %d %s", n.proc.Name, status, body)
	}
	var page struct {
		Total int           `json:"total"`
		Items []timeoutItem `json:"items"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, err
	}
	if page.Total > len(page.Items) {
		return nil, fmt.Errorf("%s holds %d MeshTimeouts, more than one page", n.proc.Name, page.Total)
	}
	out := []string{}
	for _, it := range page.Items {
		if it.Labels["kuma.io/origin"] != origin || (zone != "" && it.Labels["kuma.io/zone"] != zone) {
			continue
		}
		name := it.Labels["kuma.io/display-name"]
		if name == "" {
			name = it.Name
		}
		out = append(out, name+" "+string(it.Spec))
	}
	slices.Sort(out)
	return out, nil
}

// waitSame waits until the copies on to of from's resources of origin are
// exactly from's own, and returns how long that took.
func waitSame(t *testing.T, timeout time.Duration, from, to *node, origin, zone string) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, timeout, func() error {
		want, err := byOrigin(from, origin, "")
		if err != nil {
			return err
		}
		got, err := byOrigin(to, origin, zone)
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s holds %d %s MeshTimeouts, %s %d (first differences: %v)", to.proc.Name, len(got), origin,
				from.proc.Name, len(want), firstDiffs(got, want))
		}
		return nil
	})
	return time.Since(start)
}

type overview struct {
	Connected    bool `json:"connected"`
	GlobalToZone struct {
		ResourcesSent uint64 `json:"resourcesSent"`
		FullSnapshots uint64 `json:"fullSnapshots"`
	} `json:"globalToZone"`
	ZoneToGlobal struct {
		ResourcesSent uint64 `json:"resourcesSent"`
		FullSnapshots uint64 `json:"fullSnapshots"`
		BatchesNacked uint64 `json:"batchesNacked"`
		LastNackError string `json:"lastNackError"`
	} `json:"zoneToGlobal"`
}

func zoneOverview(t *testing.T, g *node, zone string) overview {
	t.Helper()
	var o overview
	if err := getJSON(g, "/zones/"+zone+"/_overview", &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestPartitionWhileBothSidesChange: the link goes down, both sides create,
// update and delete, the link heals: each side holds exactly the other's
// resources.
func TestPartitionWhileBothSidesChange(t *testing.T) {
	g, kds := startGlobal(t, fastHeartbeats...)
	z, proxy := startLinkedZone(t, g, kds, "zone-1", "universal", fastHeartbeats...)
	putTimeouts(t, g, seq("g", 0, 40), func(int) int { return 1 })
	putTimeouts(t, z, seq("z", 0, 20), func(int) int { return 1 })
	waitSame(t, 30*time.Second, g, z, "global", "")
	waitSame(t, 30*time.Second, z, g, "zone", "zone-1")

	proxy.setDown(true)
	waitFor(t, 10*time.Second, "the global to see the partition", func() bool { return !zoneConnected(t, g, "zone-1") })
	putTimeouts(t, g, seq("g", 30, 60), func(int) int { return 2 }) // 10 updates, 20 creates
	putTimeouts(t, z, seq("z", 15, 30), func(int) int { return 2 }) // 5 updates, 10 creates
	for _, name := range seq("g", 0, 8) {
		g.request("DELETE", "/meshes/default/meshtimeouts/"+name, "")
	}
	for _, name := range seq("z", 0, 4) {
		z.request("DELETE", "/meshes/default/meshtimeouts/"+name, "")
	}
	time.Sleep(time.Second) // both sides keep changing while apart
	proxy.setDown(false)
	toZone := waitSame(t, 30*time.Second, g, z, "global", "")
	toGlobal := waitSame(t, 30*time.Second, z, g, "zone", "zone-1")
	t.Logf("healed: zone exact after %s, global exact after %s", toZone.Round(10*time.Millisecond), toGlobal.Round(10*time.Millisecond))
}

// TestThrottledLinkSyncs10000: a zone joins over a 100 KiB/s link; the
// 10,000-policy sync completes and is exact. Each policy carries 252 random
// hex characters in labels, so that gzip cannot shrink the sync below
// ~1.3 MB (MeshTimeouts alone compress to ~30 bytes each).
func TestThrottledLinkSyncs10000(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10,000-policy sync over a 100 KiB/s link takes about half a minute")
	}
	g, kds := startGlobal(t)
	putTimeouts(t, g, seq("bulk", 0, 10000), func(i int) int { return i%600 + 1 }, randomLabels(4))
	proxy := startProxy(t, kds)
	proxy.setRate(100 << 10)
	tokenFile := filepath.Join(t.TempDir(), "zone-1.token")
	zoneTokenWithID(t, g, "zone-1", tokenFile)
	start := time.Now()
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal",
		"--global-address", proxy.addr(), "--zone-token-file", tokenFile,
		"--kds-ca-file", filepath.Join(g.dataDir, "kds-server.crt"))
	waitSame(t, 3*time.Minute, g, z, "global", "")
	o := zoneOverview(t, g, "zone-1")
	took := time.Since(start)
	t.Logf("10,000 policies over 100 KiB/s: exact on the zone %s after it started (%d resources sent, %d full snapshots)",
		took.Round(100*time.Millisecond), o.GlobalToZone.ResourcesSent, o.GlobalToZone.FullSnapshots)
	if took < 5*time.Second {
		t.Errorf("the sync took %s: the link was not the bottleneck, the scenario tests nothing", took)
	}
	if o.GlobalToZone.FullSnapshots != 1 {
		t.Errorf("%d full snapshots: the throttled stream broke and restarted", o.GlobalToZone.FullSnapshots)
	}
}

// TestZoneOfflinePastTombstoneRetention: deletions made while a zone is
// offline longer than the retention are no longer in the global's history;
// the zone gets a full snapshot, which deletes them.
func TestZoneOfflinePastTombstoneRetention(t *testing.T) {
	g, kds := startGlobal(t, "--tombstone-retention", "2s")
	z, _ := startLinkedZone(t, g, kds, "zone-1", "universal")
	putTimeouts(t, g, seq("g", 0, 30), func(int) int { return 1 })
	waitSame(t, 30*time.Second, g, z, "global", "")
	if err := z.proc.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, name := range seq("g", 0, 10) {
		g.request("DELETE", "/meshes/default/meshtimeouts/"+name, "")
	}
	putTimeouts(t, g, seq("g", 25, 35), func(int) int { return 3 })
	time.Sleep(5 * time.Second) // retention 2 s, expiry pass every second
	z.start()
	took := waitSame(t, 30*time.Second, g, z, "global", "")
	o := zoneOverview(t, g, "zone-1")
	t.Logf("zone back after 5 s offline (retention 2 s): exact after %s, %d full snapshots", took.Round(10*time.Millisecond), o.GlobalToZone.FullSnapshots)
	if o.GlobalToZone.FullSnapshots != 2 {
		t.Errorf("full snapshots %d, want 2 (the first connection and the resume past retention)", o.GlobalToZone.FullSnapshots)
	}
}

// wipe removes a stopped node's store (keys and certificates stay).
func wipe(t *testing.T, n *node) {
	t.Helper()
	for _, f := range []string{"meridian.db", "meridian.db.epoch"} {
		if err := os.Remove(filepath.Join(n.dataDir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWipedZoneIsReplacedOnTheGlobal: a zone restarted on an empty store
// gets the global's resources again, and the global replaces its copies of
// the zone's resources by what the new store holds.
func TestWipedZoneIsReplacedOnTheGlobal(t *testing.T) {
	g, kds := startGlobal(t)
	z, _ := startLinkedZone(t, g, kds, "zone-1", "universal")
	putTimeouts(t, g, seq("g", 0, 10), func(int) int { return 1 })
	putTimeouts(t, z, seq("old", 0, 20), func(int) int { return 1 })
	waitSame(t, 30*time.Second, z, g, "zone", "zone-1")
	if err := z.proc.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	wipe(t, z)
	z.start()
	waitPresent(t, z, "/meshes/default")
	putTimeouts(t, z, seq("new", 0, 25), func(int) int { return 2 })
	toGlobal := waitSame(t, 30*time.Second, z, g, "zone", "zone-1")
	toZone := waitSame(t, 30*time.Second, g, z, "global", "")
	t.Logf("wiped zone: global holds exactly the new store's 25 after %s, zone has the global's 10 after %s",
		toGlobal.Round(10*time.Millisecond), toZone.Round(10*time.Millisecond))
}

// TestWipedGlobalIsReplacedOnTheZone: a global restarted on an empty store
// (keys kept) gets the zone's resources again, and the zone replaces its
// copies of the global's resources by what the new store holds.
func TestWipedGlobalIsReplacedOnTheZone(t *testing.T) {
	g, kds := startGlobal(t)
	z, _ := startLinkedZone(t, g, kds, "zone-1", "universal")
	putTimeouts(t, g, seq("old", 0, 20), func(int) int { return 1 })
	putTimeouts(t, z, seq("z", 0, 5), func(int) int { return 1 })
	waitSame(t, 30*time.Second, g, z, "global", "")
	if err := g.proc.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	wipe(t, g)
	g.start()
	putTimeouts(t, g, seq("new", 0, 3), func(int) int { return 2 })
	toZone := waitSame(t, 30*time.Second, g, z, "global", "")
	toGlobal := waitSame(t, 30*time.Second, z, g, "zone", "zone-1")
	t.Logf("wiped global: zone holds exactly the new store's 3 after %s, global has the zone's 5 after %s",
		toZone.Round(10*time.Millisecond), toGlobal.Round(10*time.Millisecond))
}

// TestGlobalRestoredFromBackup: a global stopped, backed up, run on (its
// writes reach the zone), then restored from the backup and written to
// again past the zone's resume revision: the zone drops what the restored
// store no longer has and receives all of the new writes (without store
// epochs it resumed at a revision number the restored store reused), and
// the zone's write the backup lacks reaches the global again.
func TestGlobalRestoredFromBackup(t *testing.T) {
	g, kds := startGlobal(t)
	z, _ := startLinkedZone(t, g, kds, "zone-1", "universal")
	putTimeouts(t, g, seq("before", 0, 5), func(int) int { return 1 })
	waitSame(t, 30*time.Second, g, z, "global", "")
	if err := g.proc.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(g.dataDir, "meridian.db")
	backup, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	g.start()
	putTimeouts(t, g, seq("lost", 0, 10), func(int) int { return 1 })
	putTimeouts(t, z, seq("zone-written", 0, 3), func(int) int { return 1 })
	waitSame(t, 30*time.Second, g, z, "global", "")
	waitSame(t, 30*time.Second, z, g, "zone", "zone-1")
	if err := g.proc.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	putTimeouts(t, g, seq("after", 0, 30), func(int) int { return 2 })
	toZone := waitSame(t, 30*time.Second, g, z, "global", "")
	toGlobal := waitSame(t, 30*time.Second, z, g, "zone", "zone-1")
	t.Logf("restored global: zone exact after %s, global has the zone's writes after %s", toZone.Round(10*time.Millisecond), toGlobal.Round(10*time.Millisecond))
	if !strings.Contains(g.log.String(), "restored from a backup") {
		t.Errorf("the restored global did not log that its store was restored")
	}
}

// TestLongNamesSync: names up to Kubernetes' 253 characters are accepted
// and sync both ways (the display part of the synced name is shortened,
// the hash keeps it unique).
func TestLongNamesSync(t *testing.T) {
	g, kds := startGlobal(t)
	z, _ := startLinkedZone(t, g, kds, "zone-2", "kubernetes")
	long := func(prefix string, n int) string { return prefix + strings.Repeat("x", n-len(prefix)) }
	globalNames := []string{long("g-", 63), long("g-", 64), long("g-", 200), long("g-", 253), long("g.dotted.", 253)}
	zoneNames := []string{long("z-", 64), long("z-", 253)}
	putTimeouts(t, g, globalNames, func(int) int { return 1 })
	for _, name := range zoneNames {
		path := "/meshes/default/meshtimeouts/" + name + "?namespace=kuma-system"
		body := strings.Replace(timeoutBody(name, 1), `"mesh":"default",`, `"mesh":"default","namespace":"kuma-system",`, 1)
		if status, resp := z.request("PUT", path, body); status/100 != 2 {
			t.Fatalf("PUT %s on the zone: %d %s", name, status, resp)
		}
	}
	waitSame(t, 30*time.Second, g, z, "global", "")
	waitSame(t, 30*time.Second, z, g, "zone", "zone-2")
	for _, n := range []*node{g, z} {
		if status, body := n.request("GET", "/meshes/default/meshtimeouts?size=100", ""); status != 200 {
			t.Fatalf("list: %d", status)
		} else {
			var page struct {
				Items []timeoutItem `json:"items"`
			}
			_ = json.Unmarshal(body, &page)
			for _, it := range page.Items {
				if len(it.Name) > 253 {
					t.Errorf("%s stores a name of %d characters", n.proc.Name, len(it.Name))
				}
			}
		}
	}
}

// TestSquattingRefused: a zone refuses a local resource under the name a
// global resource gets (or will get) there.
func TestSquattingRefused(t *testing.T) {
	g, kds := startGlobal(t)
	z, _ := startLinkedZone(t, g, kds, "zone-1", "universal")
	squat := mapping.HashedName("default", "squat")
	status, body := z.request("PUT", "/meshes/default/meshtimeouts/"+squat, timeoutBody(squat, 9))
	if status != http.StatusConflict {
		t.Fatalf("zone accepted a local resource under a global resource's synced name: %d %s", status, body)
	}
	t.Logf("refused: %s", strings.TrimSpace(string(body)))
	putTimeouts(t, g, []string{"squat"}, func(int) int { return 3 })
	waitSame(t, 30*time.Second, g, z, "global", "")
}

// TestKill9During10kSync: kill -9 of the zone, then of the
// global, at random moments while 10,000 policies sync; after each round
// the zone holds exactly the global's policies. 3 rounds each; 20 with
// -soak.
func TestKill9During10kSync(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 10,000 policies")
	}
	rounds := 3
	if *soak {
		rounds = 20
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d, %d rounds per victim", seed, rounds)
	rng := rand.New(rand.NewPCG(seed, 8))
	g, kds := startGlobal(t)
	names := seq("k", 0, 10000)
	putTimeouts(t, g, names, func(int) int { return 1 })
	z, _ := startLinkedZone(t, g, kds, "zone-1", "universal")
	for round := range 2 * rounds {
		victim := z
		if round >= rounds {
			victim = g
		}
		// Change a random third of the policies while the zone is away,
		// so the sync after the restart carries ~3,300 updates (and the
		// zone's first start a 10,000-policy snapshot).
		if err := z.proc.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			wipe(t, z) // the first round kills a zone taking the full snapshot
		} else {
			var changed []string
			for _, n := range names {
				if rng.IntN(3) == 0 {
					changed = append(changed, n)
				}
			}
			putTimeouts(t, g, changed, func(int) int { return round + 2 })
		}
		z.start()
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		if err := victim.proc.Kill(); err != nil {
			t.Fatal(err)
		}
		victim.start()
		took := waitSame(t, 60*time.Second, g, z, "global", "")
		t.Logf("round %d: %s killed, zone exact %s after the restart", round+1, victim.proc.Name, took.Round(10*time.Millisecond))
	}
}

// TestStalledSnapshotFreesTheZoneStore: a zone writes a full snapshot into
// its store while the chunks arrive, in one transaction that holds the
// store's other writers. When the link stalls mid-snapshot, the store rolls
// that transaction back after 1 s without a chunk, so the zone's own writes
// go through long before the heartbeat timeout (30 s) would end the stream;
// once the link moves again, the snapshot is applied from memory, exact,
// and the zone's write stays.
func TestStalledSnapshotFreesTheZoneStore(t *testing.T) {
	if testing.Short() {
		t.Skip("syncs 9,000 policies over a throttled link")
	}
	g, kds := startGlobal(t, "--tombstone-retention", "2s")
	z, proxy := startLinkedZone(t, g, kds, "zone-1", "universal")
	if err := z.proc.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// A deletion past the retention: the zone's resume point is gone, so
	// it gets a full snapshot of what follows.
	putTimeouts(t, g, seq("gone", 0, 1), func(int) int { return 1 })
	g.request("DELETE", "/meshes/default/meshtimeouts/gone-00000", "")
	putTimeouts(t, g, seq("bulk", 0, 9000), func(i int) int { return i%600 + 1 }, randomLabels(4))
	time.Sleep(4 * time.Second) // retention 2 s, expiry pass every second
	proxy.setRate(2 << 20)      // the snapshot takes a second or two: time to stall it
	streams := func() int { return strings.Count(z.log.String(), "streaming the snapshot into the store") }
	before := streams()
	z.start()
	waitFor(t, 30*time.Second, "the zone to stream the full snapshot", func() bool { return streams() > before })
	proxy.setStalled(true)
	start := time.Now()
	status, body := z.request("PUT", "/meshes/default/meshtimeouts/local-during-stall", timeoutBody("local-during-stall", 7))
	took := time.Since(start)
	if status/100 != 2 {
		t.Fatalf("the zone's write during the stall: %d %s", status, body)
	}
	t.Logf("a zone write during the stalled snapshot took %s", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the zone's write waited %s on the stalled snapshot", took)
	}
	waitFor(t, 10*time.Second, "the store to roll the stream back", func() bool {
		return strings.Contains(z.log.String(), "apply stream rolled back")
	})
	proxy.setStalled(false)
	proxy.setRate(0)
	waitSame(t, 2*time.Minute, g, z, "global", "")
	if status, body := z.request("GET", "/meshes/default/meshtimeouts/local-during-stall", ""); status != 200 {
		t.Errorf("the zone's write is gone after the snapshot: %d %s", status, body)
	}
}
