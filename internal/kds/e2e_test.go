package kds

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

const wait = 10 * time.Second

func TestGlobalResourcesReachZone(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	pol := timeout("default-timeout-global", "", "")
	pol.Status = json.RawMessage(`{"conditions":[]}`)
	writeGlobal(t, c.global, pol)
	z := c.zone("zone-1", zoneOpts{}).start()

	eventually(t, wait, "mesh in zone", func() bool { return exists(z.store, "Mesh", "", "default") })
	m, _ := get(z.store, "Mesh", "", "default")
	if m.Labels.Get(resource.LabelOrigin) != resource.OriginGlobal {
		t.Errorf("mesh labels %v", m.Labels)
	}
	const synced = "default-timeout-global-54dbd4c66zwbcf9c"
	eventually(t, wait, "policy in zone", func() bool { return exists(z.store, "MeshTimeout", "default", synced) })
	got, _ := get(z.store, "MeshTimeout", "default", synced)
	if got.Labels.Get(resource.LabelOrigin) != "global" || got.Labels.Get(resource.LabelDisplayName) != "default-timeout-global" ||
		got.Status != nil || got.Namespace != "" {
		t.Errorf("zone copy: labels %v status %s namespace %q", got.Labels, got.Status, got.Namespace)
	}
	testRegistry.Normalize(pol, "")
	if string(got.Spec) != string(pol.Spec) {
		t.Errorf("spec %s, want %s", got.Spec, pol.Spec)
	}

	// A change and a delete on the global follow.
	writeGlobal(t, c.global, timeout("default-timeout-global", "", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"9s"}}]}`))
	eventually(t, wait, "update in zone", func() bool {
		r, err := get(z.store, "MeshTimeout", "default", synced)
		return err == nil && strings.Contains(string(r.Spec), "9s")
	})
	del(t, c.global, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "default-timeout-global"})
	eventually(t, wait, "delete in zone", func() bool { return !exists(z.store, "MeshTimeout", "default", synced) })

	st, ok := c.server.Status("zone-1")
	if !ok || !st.Connected || st.SoftwareVersion != "test-zone" || st.Environment != "kubernetes" || st.GlobalToZone.Types["MeshTimeout"] == nil {
		t.Errorf("status %+v", st)
	}
}

// TestZonePolicyReachesGlobalOnly: a Universal zone's policy is shown on the
// global (hashed, labelled) but never relayed to another zone (docs/kds.md#what-flows-where's
// "never" row is about zone -> other zones).
func TestZonePolicyReachesGlobalOnly(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z1 := c.zone("zone-1", zoneOpts{env: plane.EnvUniversal}).start()
	z2 := c.zone("zone-2", zoneOpts{}).start()
	eventually(t, wait, "mesh in zone-1", func() bool { return exists(z1.store, "Mesh", "", "default") })
	writeZone(t, z1.store, "zone-1", timeout("default-timeout-zone-1", "", ""))

	const onGlobal = "default-timeout-zone-1-c58w24w4vw27f454"
	eventually(t, wait, "zone policy on the global", func() bool { return exists(c.global, "MeshTimeout", "default", onGlobal) })
	got, _ := get(c.global, "MeshTimeout", "default", onGlobal)
	want := map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1",
		resource.LabelDisplayName: "default-timeout-zone-1", resource.LabelPolicyRole: "system"}
	for k, v := range want {
		if got.Labels.Get(k) != v {
			t.Errorf("label %s = %q, want %q (all: %v)", k, got.Labels.Get(k), v, got.Labels)
		}
	}
	z1.waitSettled()
	z2.waitSettled()
	if n := names(t, z2.store, "MeshTimeout"); len(n) != 0 {
		t.Errorf("zone-2 got zone-1's policy: %v", n)
	}
	// Zone-1 does not get its own policy back either.
	if n := names(t, z1.store, "MeshTimeout"); len(n) != 1 || n[0] != "default-timeout-zone-1" {
		t.Errorf("zone-1 policies %v", n)
	}
	// Deleting it in the zone deletes it on the global.
	del(t, z1.store, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "default-timeout-zone-1"})
	eventually(t, wait, "delete on the global", func() bool { return !exists(c.global, "MeshTimeout", "default", onGlobal) })
}

func TestKDSSyncDisabled(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	disabled := func(r *resource.Resource) *resource.Resource {
		r.Labels = resource.NewLabels(map[string]string{resource.LabelKDSSync: "disabled"})
		return r
	}
	writeGlobal(t, c.global, disabled(timeout("global-local", "", "")))
	writeGlobal(t, c.global, timeout("global-shared", "", ""))
	writeZone(t, z.store, "zone-1", disabled(timeout("zone-local", "", "")))
	writeZone(t, z.store, "zone-1", timeout("zone-shared", "", ""))
	shared := mapping.HashedName("default", "global-shared")
	eventually(t, wait, "shared policies", func() bool {
		return exists(z.store, "MeshTimeout", "default", shared) &&
			exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "zone-shared", "zone-1"))
	})
	z.waitSettled()
	if exists(z.store, "MeshTimeout", "default", mapping.HashedName("default", "global-local")) {
		t.Error("disabled global policy reached the zone")
	}
	if exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "zone-local", "zone-1")) {
		t.Error("disabled zone policy reached the global")
	}
	// Labelling a synced policy disabled afterwards removes the copies.
	writeGlobal(t, c.global, disabled(timeout("global-shared", "", "")))
	writeZone(t, z.store, "zone-1", disabled(timeout("zone-shared", "", "")))
	eventually(t, wait, "copies removed", func() bool {
		return !exists(z.store, "MeshTimeout", "default", shared) &&
			!exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "zone-shared", "zone-1"))
	})
}

func TestMeshServiceRelayedWithoutStatus(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z1 := c.zone("zone-1", zoneOpts{env: plane.EnvUniversal}).start()
	z2 := c.zone("zone-2", zoneOpts{env: plane.EnvUniversal}).start()
	svc := meshService("redis-zone-1", "")
	svc.Status = json.RawMessage(`{"addresses":[{"hostname":"redis.svc"}]}`)
	writeZone(t, z1.store, "zone-1", svc)

	const name = "redis-zone-1-2v6wfvvcvbc9f55d"
	eventually(t, wait, "MeshService in zone-2", func() bool { return exists(z2.store, "MeshService", "default", name) })
	got, _ := get(z2.store, "MeshService", "default", name)
	if got.Status != nil || got.Labels.Get(resource.LabelZone) != "zone-1" || got.Labels.Get(resource.LabelOrigin) != "zone" ||
		got.Labels.Get(resource.LabelDisplayName) != "redis-zone-1" {
		t.Errorf("zone-2 copy: status %s labels %v", got.Status, got.Labels)
	}
	onGlobal, err := get(c.global, "MeshService", "default", name)
	if err != nil || onGlobal.Status == nil {
		t.Errorf("global copy keeps the zone's status: %v %v", onGlobal, err)
	}
	z1.waitSettled()
	if exists(z1.store, "MeshService", "default", name) {
		t.Error("zone-1 received its own MeshService back")
	}
}

// TestProducerPolicyRelayed is the producer-policy scenario between two Kubernetes
// zones: the producer policy and the MeshService it references reach
// zone-2, with the reference naming zone-2's copy; the consumer policy
// stays in zone-1 (and on the global).
func TestProducerPolicyRelayed(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z1 := c.zone("zone-1", zoneOpts{}).start()
	z2 := c.zone("zone-2", zoneOpts{}).start()
	writeZone(t, z1.store, "zone-1", meshService("backend", "backend-ns"))
	writeZone(t, z1.store, "zone-1", timeout("producer-timeout", "backend-ns",
		`{"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"http":{"requestTimeout":"5s"}}}]}`))
	writeZone(t, z1.store, "zone-1", timeout("consumer-timeout", "frontend-ns",
		`{"to":[{"targetRef":{"kind":"MeshService","name":"backend","namespace":"backend-ns"},"default":{"http":{"requestTimeout":"3s"}}}]}`))

	svcName := mapping.HashedName("default", "backend", "zone-1", "backend-ns")
	prodName := mapping.HashedName("default", "producer-timeout", "zone-1", "backend-ns")
	consName := mapping.HashedName("default", "consumer-timeout", "zone-1", "frontend-ns")
	eventually(t, wait, "producer and service in zone-2", func() bool {
		return exists(z2.store, "MeshService", "default", svcName) && exists(z2.store, "MeshTimeout", "default", prodName)
	})
	eventually(t, wait, "consumer on the global", func() bool { return exists(c.global, "MeshTimeout", "default", consName) })
	z1.waitSettled()
	z2.waitSettled()
	if exists(z2.store, "MeshTimeout", "default", consName) {
		t.Error("consumer policy reached zone-2")
	}
	prod, _ := get(z2.store, "MeshTimeout", "default", prodName)
	var spec struct {
		To []struct {
			TargetRef map[string]string `json:"targetRef"`
		} `json:"to"`
	}
	if err := json.Unmarshal(prod.Spec, &spec); err != nil {
		t.Fatal(err)
	}
	ref := spec.To[0].TargetRef
	if ref["name"] != svcName || ref["namespace"] != plane.DefaultSystemNamespace {
		t.Errorf("reference in zone-2 = %v, want %s in %s", ref, svcName, plane.DefaultSystemNamespace)
	}
	if prod.Labels.Get(resource.LabelPolicyRole) != "producer" || prod.Labels.Get(resource.LabelNamespace) != "backend-ns" {
		t.Errorf("producer labels %v", prod.Labels)
	}
}

func TestDeleteWhileZoneDisconnected(t *testing.T) {
	for _, compacted := range []bool{false, true} {
		name := "within retention"
		if compacted {
			name = "past retention (full snapshot)"
		}
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, clusterOpts{retention: time.Hour})
			writeGlobal(t, c.global, timeout("keep", "", ""))
			writeGlobal(t, c.global, timeout("drop", "", ""))
			z := c.zone("zone-1", zoneOpts{}).start()
			writeZone(t, z.store, "zone-1", timeout("local", "", ""))
			keep, drop := mapping.HashedName("default", "keep"), mapping.HashedName("default", "drop")
			eventually(t, wait, "policies in zone", func() bool { return exists(z.store, "MeshTimeout", "default", drop) })
			z.waitSettled()
			z.stopClient()
			eventually(t, wait, "disconnected", func() bool { st, _ := c.server.Status("zone-1"); return !st.Connected })

			del(t, c.global, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "drop"})
			writeGlobal(t, c.global, timeout("added", "", ""))
			if compacted {
				c.gclock.Advance(2 * time.Hour)
				if n, err := c.global.ExpireTombstones(context.Background()); err != nil || n == 0 {
					t.Fatalf("expired %d tombstones: %v", n, err)
				}
			}
			before, _ := c.server.Status("zone-1")
			z.start()
			eventually(t, wait, "delete reaches the zone", func() bool { return !exists(z.store, "MeshTimeout", "default", drop) })
			eventually(t, wait, "add reaches the zone", func() bool {
				return exists(z.store, "MeshTimeout", "default", mapping.HashedName("default", "added"))
			})
			if !exists(z.store, "MeshTimeout", "default", keep) || !exists(z.store, "MeshTimeout", "default", "local") {
				t.Errorf("zone lost resources: %v", names(t, z.store, "MeshTimeout"))
			}
			after, _ := c.server.Status("zone-1")
			if snaps := after.GlobalToZone.FullSnapshots - before.GlobalToZone.FullSnapshots; (snaps == 1) != compacted {
				t.Errorf("full snapshots sent on reconnect: %d (compacted %v)", snaps, compacted)
			}
		})
	}
}

func TestZoneOfflineKeepsStateAndCatchesUp(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	writeGlobal(t, c.global, timeout("one", "", ""))
	z := c.zone("zone-1", zoneOpts{}).start()
	one := mapping.HashedName("default", "one")
	eventually(t, wait, "policy in zone", func() bool { return exists(z.store, "MeshTimeout", "default", one) })
	z.waitSettled()
	z.close()

	writeGlobal(t, c.global, timeout("two", "", ""))
	writeGlobal(t, c.global, timeout("one", "", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"7s"}}]}`))
	// Down and restarted without the global: the zone still has its state.
	z.store = openStore(t, z.path, storeOpts{})
	if !exists(z.store, "MeshTimeout", "default", one) || !exists(z.store, "Mesh", "", "default") {
		t.Fatal("zone lost its synced state while offline")
	}
	z.start()
	eventually(t, wait, "catch up", func() bool {
		r, err := get(z.store, "MeshTimeout", "default", one)
		return err == nil && strings.Contains(string(r.Spec), "7s") && exists(z.store, "MeshTimeout", "default", mapping.HashedName("default", "two"))
	})
	if st, _ := c.server.Status("zone-1"); st.GlobalToZone.FullSnapshots != 1 {
		t.Errorf("full snapshots %d, want only the first connection's", st.GlobalToZone.FullSnapshots)
	}
}

// TestResumeWithoutChangesSendsNothing: docs/kds.md#resume and the quality bar
// "reconnect with no changes: resources resent 0", after a client
// reconnect and after a full zone restart.
func TestResumeWithoutChangesSendsNothing(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	for i := range 50 {
		writeGlobal(t, c.global, timeout("g-"+itoa(i), "", ""))
	}
	z := c.zone("zone-1", zoneOpts{}).start()
	for i := range 20 {
		writeZone(t, z.store, "zone-1", timeout("z-"+itoa(i), "", ""))
	}
	eventually(t, wait, "initial sync", func() bool { return count(t, z.store, "MeshTimeout") == 70 && count(t, c.global, "MeshTimeout") == 70 })
	z.waitSettled()
	g0, z0 := z.sent()
	if g0 != 51 || z0 != 20 {
		t.Errorf("initial transfer: %d global->zone (want 51: mesh + 50), %d zone->global (want 20)", g0, z0)
	}
	for _, restart := range []func(){z.stopClient, z.close} {
		restart()
		z.start()
		eventually(t, wait, "reconnected", z.connected)
		z.waitSettled()
		time.Sleep(50 * time.Millisecond)
		if g, zz := z.sent(); g != g0 || zz != z0 {
			t.Errorf("reconnect resent %d global->zone and %d zone->global resources", g-g0, zz-z0)
		}
	}
	if st, _ := c.server.Status("zone-1"); st.Connections != 3 {
		t.Errorf("connections %d, want 3", st.Connections)
	}
}

// TestSnapshotNackNamesTheGlobalKey: a resource refused while a zone applies
// its first full snapshot (the staged set's path, not a delta's) is recorded
// on the global's resource, as for a delta, and the rest of the snapshot is
// applied.
func TestSnapshotNackNamesTheGlobalKey(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{})
	clash := mapping.HashedName("default", "clash")
	local := timeout(clash, "", "")
	local.Labels = resource.NewLabels(map[string]string{resource.LabelKDSSync: "disabled"})
	writeZone(t, z.store, "zone-1", local)
	writeGlobal(t, c.global, timeout("clash", "", ""))
	writeGlobal(t, c.global, timeout("fine", "", ""))
	z.start()
	globalKey := resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "clash"}
	eventually(t, wait, "rejection recorded", func() bool { return len(c.server.RejectedBy(globalKey)) == 1 })
	if rej := c.server.RejectedBy(globalKey); rej[0].Zone != "zone-1" || !strings.Contains(rej[0].Message, clash) {
		t.Errorf("RejectedBy: %+v", rej)
	}
	eventually(t, wait, "the other resource applied", func() bool {
		_, err := get(z.store, "MeshTimeout", "default", mapping.HashedName("default", "fine"))
		return err == nil
	})
}

func TestNackShowsInStatusAndRetries(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	eventually(t, wait, "connected", z.connected)
	// A local zone policy occupies the name the global's copy will have:
	// the zone refuses to let the global overwrite it.
	clash := mapping.HashedName("default", "clash")
	local := timeout(clash, "", "")
	local.Labels = resource.NewLabels(map[string]string{resource.LabelKDSSync: "disabled"})
	writeZone(t, z.store, "zone-1", local)
	writeGlobal(t, c.global, timeout("clash", "", ""))
	eventually(t, wait, "NACK in status", func() bool {
		st, _ := c.server.Status("zone-1")
		return st.GlobalToZone.BatchesNacked > 0
	})
	st, _ := c.server.Status("zone-1")
	if !strings.Contains(st.GlobalToZone.LastNackError, clash) || st.GlobalToZone.LastNackTime == nil ||
		st.GlobalToZone.Types["MeshTimeout"].BatchesNacked == 0 {
		t.Errorf("status after NACK: %+v", st.GlobalToZone)
	}
	r, _ := get(z.store, "MeshTimeout", "default", clash)
	if r.Labels.Get(resource.LabelOrigin) != "zone" {
		t.Fatalf("the global overwrote the zone's resource: %v", r.Labels)
	}
	// The rejection is recorded on the global's resource, per zone.
	globalKey := resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "clash"}
	if rej := c.server.RejectedBy(globalKey); len(rej) != 1 || rej[0].Zone != "zone-1" || !strings.Contains(rej[0].Message, clash) {
		t.Errorf("RejectedBy: %+v", rej)
	}
	// Once the clash is gone, the retry (after the NACK backoff) succeeds
	// and the rejection is forgotten.
	del(t, z.store, resource.Key{Type: "MeshTimeout", Mesh: "default", Name: clash})
	eventually(t, wait, "retried copy", func() bool {
		r, err := get(z.store, "MeshTimeout", "default", clash)
		return err == nil && r.Labels.Get(resource.LabelOrigin) == "global"
	})
	eventually(t, wait, "rejection cleared", func() bool { return len(c.server.RejectedBy(globalKey)) == 0 })
}

// TestZoneSeesWhatTheGlobalRejected: a zone resource the global refuses (a
// mesh the global does not have) is recorded on the zone's side.
func TestZoneSeesWhatTheGlobalRejected(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	eventually(t, wait, "connected", z.connected)
	r := timeout("orphan", "", "")
	r.Mesh = "zone-only"
	writeZone(t, z.store, "zone-1", r)
	writeZone(t, z.store, "zone-1", timeout("fine", "", ""))
	eventually(t, wait, "rejection recorded in the zone", func() bool {
		msg, ok := z.client.Rejected(resource.Key{Type: "MeshTimeout", Mesh: "zone-only", Name: "orphan"})
		return ok && strings.Contains(msg, "does not exist")
	})
	if _, ok := z.client.Rejected(resource.Key{Type: "MeshTimeout", Mesh: "default", Name: "fine"}); ok {
		t.Error("an accepted resource is marked rejected")
	}
}

func TestWrongTokenRefused(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	key, err := auth.LoadOrCreateSigningKey(filepath.Join(c.dir, auth.SigningKeyFileName))
	if err != nil {
		t.Fatal(err)
	}
	past, err := auth.NewZoneTokens(auth.ZoneTokensConfig{Key: key, Clock: &storeClock{now: time.Now().Add(-2 * time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := past.Issue("zone-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, token, want string }{
		{"other zone's token", c.token("zone-2"), "another zone"},
		{"expired", expired, "expired"},
		{"garbage", "not-a-token", "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			z := c.zone("zone-1", zoneOpts{token: tc.token}).start()
			defer z.close()
			eventually(t, wait, "refusal", func() bool { return strings.Contains(z.client.Status().LastError, tc.want) })
			if cs := z.client.Status(); cs.Connected || !strings.Contains(cs.LastError, "refused") {
				t.Errorf("client status %+v", cs)
			}
			if exists(z.store, "Mesh", "", "default") {
				t.Error("a refused zone received resources")
			}
			// The raw stream is refused with Unauthenticated before its
			// handshake is read, saying why.
			code, msg := rawHandshake(t, c, "zone-1", tc.token)
			if code != codes.Unauthenticated || !strings.Contains(msg, tc.want) {
				t.Errorf("raw handshake: code %v, %q", code, msg)
			}
		})
	}
}

// rawHandshake opens a stream as zone with token, handshakes and returns
// the final status code and why the stream ended (the refusal).
func rawHandshake(t *testing.T, c *cluster, zone, token string) (codes.Code, string) {
	t.Helper()
	stream, cancel := rawStream(t, c, zone, token)
	defer cancel()
	_ = stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: &syncv1.Handshake{
		Zone: zone, ZoneToken: token, Environment: syncv1.Environment_ENVIRONMENT_KUBERNETES}}}})
	for {
		resp, err := stream.Recv()
		if err != nil {
			return status.Code(err), status.Convert(err).Message()
		}
		if hr := resp.GetMessage().GetHandshakeResponse(); hr != nil && !hr.GetAccepted() {
			_, err = stream.Recv()
			return status.Code(err), hr.GetError()
		}
	}
}

// rawStream opens a stream authenticated (in metadata) as zone with token.
func rawStream(t *testing.T, c *cluster, zone, token string) (syncv1.SyncService_StreamClient, context.CancelFunc) {
	t.Helper()
	conn, err := grpcClient(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	ctx = metadata.AppendToOutgoingContext(ctx, MetadataZone, zone, MetadataAuthorization, "Bearer "+token)
	stream, err := syncv1.NewSyncServiceClient(conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream, func() { cancel(); _ = conn.Close() }
}

func sendRaw(t *testing.T, s syncv1.SyncService_StreamClient, m *syncv1.Message) {
	t.Helper()
	if err := s.Send(&syncv1.StreamRequest{Message: m}); err != nil {
		t.Fatal(err)
	}
}

// TestZoneCannotOverwriteOthers: a zone's stream may only write its own
// resources: claims of global origin or of another zone, and names that
// would land on the global's or another zone's resources, are NACKed while
// the valid resources of the same batch are applied.
func TestZoneCannotOverwriteOthers(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z2 := c.zone("zone-2", zoneOpts{}).start()
	writeZone(t, z2.store, "zone-2", timeout("zone-2-policy", "", ""))
	z2name := mapping.HashedName("default", "zone-2-policy", "zone-2")
	eventually(t, wait, "zone-2 policy on the global", func() bool { return exists(c.global, "MeshTimeout", "default", z2name) })
	// A global resource whose name is what zone-1's "squat" maps to.
	squat := mapping.HashedName("default", "squat", "zone-1")
	writeGlobal(t, c.global, timeout(squat, "", ""))

	stream, cancel := rawStream(t, c, "zone-1", c.token("zone-1"))
	defer cancel()
	sendRaw(t, stream, &syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: &syncv1.Handshake{
		Zone: "zone-1", ZoneToken: c.token("zone-1"), Environment: syncv1.Environment_ENVIRONMENT_UNIVERSAL}}})
	if resp := recvRaw(t, stream).GetHandshakeResponse(); !resp.GetAccepted() {
		t.Fatalf("handshake refused: %v", resp)
	}
	claim := func(name string, labels map[string]string) *syncv1.Resource {
		r := timeout(name, "", "")
		r.Labels = resource.NewLabels(labels)
		return toWire(r)
	}
	// A mesh the global does not have: only the in-transaction admission
	// check (not the sink) refuses it.
	noMesh := timeout("in-missing-mesh", "", "")
	noMesh.Mesh = "nope"
	batch := &syncv1.DeltaBatch{Nonce: "n1", Revision: 5, LastChunk: true,
		Upserts: []*syncv1.Resource{
			claim("ok", nil),
			claim("as-global", map[string]string{resource.LabelOrigin: "global"}),
			claim("as-zone-2", map[string]string{resource.LabelZone: "zone-2"}),
			claim("squat", nil),
			{Type: "Mesh", Name: "default", Spec: []byte(`{}`)},
			toWire(noMesh),
		},
		Removals: []*syncv1.ResourceKey{
			// zone-1 cannot address zone-2's resource: its key maps into
			// zone-1's names; and the global's squatted name is refused.
			{Type: "MeshTimeout", Mesh: "default", Name: "zone-2-policy"},
			{Type: "MeshTimeout", Mesh: "default", Name: "squat"},
		}}
	sendRaw(t, stream, msgBatch(batch))
	var nack *syncv1.Nack
	for nack == nil {
		m := recvRaw(t, stream)
		if b := m.GetDeltaBatch(); b != nil {
			sendRaw(t, stream, msgAck(&syncv1.Ack{Nonce: b.GetNonce(), Revision: b.GetRevision()}))
		}
		nack = m.GetNack()
		if m.GetAck() != nil {
			t.Fatal("batch with foreign resources was acknowledged")
		}
	}
	rejected := map[string]bool{}
	for _, e := range nack.GetErrors() {
		rejected[e.GetKey().GetName()] = true
	}
	for _, n := range []string{"as-global", "as-zone-2", "squat", "default", "in-missing-mesh"} {
		if !rejected[n] {
			t.Errorf("%s not rejected; errors: %s", n, nackSummary(nack))
		}
	}
	if rejected["ok"] || !exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "ok", "zone-1")) {
		t.Error("the valid resource of the batch was not applied")
	}
	if r, err := get(c.global, "MeshTimeout", "default", squat); err != nil || r.Labels.Get(resource.LabelOrigin) != "global" {
		t.Errorf("global resource overwritten or removed: %v %v", r, err)
	}
	if !exists(c.global, "MeshTimeout", "default", z2name) {
		t.Error("zone-2's resource removed by zone-1")
	}
	rev, err := readRevision(context.Background(), c.global, MetaKeyZoneRevision("zone-1"))
	if err != nil || rev != 5 {
		t.Errorf("zone-1 resume revision %d (%v), want 5", rev, err)
	}
}

func recvRaw(t *testing.T, s syncv1.SyncService_StreamClient) *syncv1.Message {
	t.Helper()
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return m.GetMessage()
}

// TestTinyBatchesConverge: with the smallest batch size and a window of
// two, a snapshot and a burst of changes in both directions still arrive.
func TestTinyBatchesConverge(t *testing.T) {
	s := fastStream()
	s.MaxBatchBytes, s.MaxInFlight = MinMaxBatchBytes, 2
	c := newCluster(t, clusterOpts{stream: s})
	for i := range 150 {
		writeGlobal(t, c.global, timeout("before-"+itoa(i), "", ""))
	}
	z := c.zone("zone-1", zoneOpts{}).start()
	for i := range 100 {
		writeGlobal(t, c.global, timeout("after-"+itoa(i), "", ""))
		writeZone(t, z.store, "zone-1", timeout("zone-"+itoa(i), "", ""))
	}
	// One store batch bigger than a sync batch: one revision in many chunks.
	var b storage.Batch
	for i := range 60 {
		r := timeout("bulk-"+itoa(i), "", "")
		r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: "global", resource.LabelPolicyRole: "system"})
		b.Puts = append(b.Puts, r)
	}
	if _, err := c.global.Apply(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "convergence", func() bool {
		return count(t, z.store, "MeshTimeout") == 410 && count(t, c.global, "MeshTimeout") == 410
	})
	z.waitSettled()
	st, _ := c.server.Status("zone-1")
	if st.GlobalToZone.BatchesSent < 50 {
		t.Errorf("only %d batches: chunking not exercised", st.GlobalToZone.BatchesSent)
	}
}

// TestSnapshotStreamedIntoTheZoneStore: a zone writes the global's full
// snapshot, received in many chunks, into its store as it arrives, and
// commits it as one revision. A store that ends every stream at once (as
// it would for a global that stalls) gets the snapshot applied whole at
// its last chunk instead, with the same result.
func TestSnapshotStreamedIntoTheZoneStore(t *testing.T) {
	for _, tt := range []struct {
		name     string
		idle     time.Duration
		streamed bool
	}{{"streamed", 0, true}, {"abandoned", time.Nanosecond, false}} {
		t.Run(tt.name, func(t *testing.T) {
			s := fastStream()
			s.MaxBatchBytes = MinMaxBatchBytes
			c := newCluster(t, clusterOpts{stream: s})
			for i := range 150 {
				writeGlobal(t, c.global, timeout("t-"+itoa(i), "", ""))
			}
			counted := &streamCounter{}
			z := c.zone("zone-1", zoneOpts{store: storeOpts{streamIdle: tt.idle}, wrap: func(st *boltstore.Store) Store {
				counted.Store = st
				return counted
			}})
			before, err := z.store.Revision(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			z.start()
			eventually(t, wait, "snapshot applied", func() bool { return count(t, z.store, "MeshTimeout") == 150 })
			if after, _ := z.store.Revision(context.Background()); after != before+1 {
				t.Errorf("the snapshot took revisions %d to %d, want one", before+1, after)
			}
			if begun := counted.begun.Load(); begun == 0 {
				t.Error("no stream was opened")
			}
			if tt.streamed {
				// Readers see the commit a moment before Commit returns.
				eventually(t, wait, "stream committed", func() bool { return counted.committed.Load() == 1 })
			} else if got := counted.committed.Load(); got != 0 {
				t.Errorf("%d streams committed, want none", got)
			}
		})
	}
}

// streamCounter counts the streams a zone's client opens and commits.
type streamCounter struct {
	*boltstore.Store
	begun, committed atomic.Int32
}

func (c *streamCounter) BeginApply(ctx context.Context) (storage.ApplyStream, error) {
	st, err := c.Store.BeginApply(ctx)
	if err != nil {
		return nil, err
	}
	c.begun.Add(1)
	return countedStream{ApplyStream: st, c: c}, nil
}

type countedStream struct {
	storage.ApplyStream
	c *streamCounter
}

func (s countedStream) Commit(rest storage.Batch) (*storage.BatchResult, error) {
	res, err := s.ApplyStream.Commit(rest)
	if err == nil {
		s.c.committed.Add(1)
	}
	return res, err
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// TestClientReconnectsAfterGlobalRestart: the zone keeps redialing (with
// backoff) while the global is down and catches up when it is back.
func TestClientReconnectsAfterGlobalRestart(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	eventually(t, wait, "connected", z.connected)
	c.server.Shutdown()
	c.grpcSrv.Stop()
	eventually(t, wait, "zone notices", func() bool { return !z.client.Status().Connected })
	writeGlobal(t, c.global, timeout("while-down", "", ""))
	time.Sleep(100 * time.Millisecond) // a few failed attempts

	c.serveAgain("global-2")

	eventually(t, wait, "caught up", func() bool {
		return exists(z.store, "MeshTimeout", "default", mapping.HashedName("default", "while-down"))
	})
	cs := z.client.Status()
	if cs.Reconnects < 2 || cs.LastError == "" || !cs.Connected {
		t.Errorf("client status after the outage: %+v", cs)
	}
}

// TestLongNamesSync: names a DNS-1123 subdomain allows sync both ways under
// their hashed names (47-63 characters never synced).
func TestLongNamesSync(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	defer z.close()
	for _, n := range []int{47, 63, 200} {
		up := strings.Repeat("z", n)
		down := strings.Repeat("g", n)
		writeZone(t, z.store, "zone-1", timeout(up, "", ""))
		writeGlobal(t, c.global, timeout(down, "", ""))
		upName := mapping.HashedName("default", up, "zone-1")
		downName := mapping.HashedName("default", down)
		eventually(t, wait, fmt.Sprintf("%d-char names synced", n), func() bool {
			return exists(c.global, "MeshTimeout", "default", upName) && exists(z.store, "MeshTimeout", "default", downName)
		})
	}
	if cs := z.client.Status(); cs.LastError != "" {
		t.Errorf("zone status: %+v", cs)
	}
}

// TestQuickRestartResendsNothing: 50 policies written,
// the stream restarted right after they were applied, used to resend them
// all (the resume point waited for a quiet period). With revisions marked
// complete by the store's watch, nothing is resent, whatever the timing (the
// quiet period here is an hour, so only exact stamping can pass).
func TestQuickRestartResendsNothing(t *testing.T) {
	s := fastStream()
	s.ResumeConfirmDelay = time.Hour
	c := newCluster(t, clusterOpts{stream: s})
	z := c.zone("zone-1", zoneOpts{}).start()
	eventually(t, wait, "connected", z.connected)
	for i := range 50 {
		writeGlobal(t, c.global, timeout("g-"+itoa(i), "", ""))
		writeZone(t, z.store, "zone-1", timeout("z-"+itoa(i), "", ""))
	}
	eventually(t, wait, "applied both ways", func() bool {
		return count(t, z.store, "MeshTimeout") == 100 && count(t, c.global, "MeshTimeout") == 100
	})
	// The receivers record the resume points as they apply the stamped
	// batches; give the last answers a moment to be processed.
	time.Sleep(20 * time.Millisecond)
	g0, z0 := z.sent()
	z.stopClient()
	z.start()
	eventually(t, wait, "reconnected", z.connected)
	time.Sleep(100 * time.Millisecond)
	if g, zz := z.sent(); g != g0 || zz != z0 {
		t.Errorf("a restart right after the writes resent %d global->zone and %d zone->global resources", g-g0, zz-z0)
	}
}

// TestWipedZoneStoreIsReplaced: a zone whose data dir
// was wiped and that wrote more revisions than the global's resume point
// before reconnecting used to resume from that point: the global kept the
// resources the zone no longer had and never received the first new ones.
// The store id tells the global the store was replaced: it asks for a full
// snapshot, which replaces the zone's resources.
func TestWipedZoneStoreIsReplaced(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	for i := range 10 {
		writeZone(t, z.store, "zone-1", timeout("old-"+itoa(i), "", ""))
	}
	eventually(t, wait, "old resources on the global", func() bool { return count(t, c.global, "MeshTimeout") == 10 })
	z.close()
	if err := os.Remove(z.path); err != nil {
		t.Fatal(err)
	}
	z.store = openStore(t, z.path, storeOpts{})
	for i := range 30 { // more revisions than the old store had: the old resume point looks valid
		writeZone(t, z.store, "zone-1", timeout("new-"+itoa(i), "", ""))
	}
	z.start()
	eventually(t, wait, "the global holds exactly the new resources", func() bool {
		return onlyNamed(c.global, 30, "new-")
	})
}

// TestWipedGlobalStoreIsReplaced: a global whose store was replaced (wiped,
// then written past the zone's resume revision) is recognized by its store
// id: the zone gets a full snapshot, which replaces its global copies.
func TestWipedGlobalStoreIsReplaced(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	for i := range 10 {
		writeGlobal(t, c.global, timeout("old-"+itoa(i), "", ""))
	}
	eventually(t, wait, "old copies in the zone", func() bool { return count(t, z.store, "MeshTimeout") == 10 })
	c.server.Shutdown()
	c.grpcSrv.Stop()
	eventually(t, wait, "zone notices", func() bool { return !z.client.Status().Connected })
	path := filepath.Join(c.dir, "global.db")
	if err := c.global.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	c.global = openStore(t, path, storeOpts{clock: c.gclock})
	writeGlobal(t, c.global, mesh("default"))
	for i := range 30 {
		writeGlobal(t, c.global, timeout("new-"+itoa(i), "", ""))
	}
	c.serveAgain("global-2")
	eventually(t, wait, "the zone holds exactly the new global policies", func() bool {
		return onlyNamed(z.store, 30, "new-")
	})
}

// TestNoRemovalsForWhatWasNeverSent: every write of a
// zone policy that is not relayed sent a removal to every other zone (2,000
// consumer policies: 2,001 removals). A removal now goes only to a zone that
// was sent the resource; a relayed policy that stops being relayable is
// still removed.
func TestNoRemovalsForWhatWasNeverSent(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z1 := c.zone("zone-1", zoneOpts{}).start()
	z2 := c.zone("zone-2", zoneOpts{}).start()
	eventually(t, wait, "connected", func() bool { return z1.connected() && z2.connected() })
	consumer := `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend","namespace":"backend-ns"},"default":{"idleTimeout":"1s"}}]}`
	producer := `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"idleTimeout":"2s"}}]}`
	for i := range 50 {
		writeZone(t, z1.store, "zone-1", timeout("consumer-"+itoa(i), "web-ns", consumer))
	}
	writeZone(t, z1.store, "zone-1", timeout("prod", "backend-ns", producer))
	relayed := mapping.HashedName("default", "prod", "zone-1", "backend-ns")
	eventually(t, wait, "the producer policy relayed to zone-2", func() bool {
		return count(t, c.global, "MeshTimeout") == 51 && exists(z2.store, "MeshTimeout", "default", relayed)
	})
	st, _ := c.server.Status("zone-2")
	if n := st.GlobalToZone.RemovalsSent; n != 0 {
		t.Errorf("zone-2 was sent %d removals for zone-1's consumer policies it never had", n)
	}
	// The producer policy becomes a consumer one (it now targets another
	// namespace's service): zone-2 must lose it.
	writeZone(t, z1.store, "zone-1", timeout("prod", "backend-ns",
		`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"db","namespace":"db-ns"},"default":{"idleTimeout":"2s"}}]}`))
	eventually(t, wait, "the no longer relayable copy removed from zone-2", func() bool {
		return !exists(z2.store, "MeshTimeout", "default", relayed)
	})
}

// onlyNamed: st holds exactly n MeshTimeouts, all with display names
// starting with prefix.
func onlyNamed(st storage.Store, n int, prefix string) bool {
	list, err := st.List(context.Background(), storage.ListOptions{Type: "MeshTimeout"})
	if err != nil || list.Total != n {
		return false
	}
	for _, r := range list.Items {
		if !strings.HasPrefix(r.Labels.Get(resource.LabelDisplayName), prefix) {
			return false
		}
	}
	return true
}

// TestShutdownDrainStampsResumePoints: a graceful end stamps the last
// complete revision at once, on both sides, even when that revision had
// nothing for the peer and the quiet period (an hour here) has not passed:
// the zone's own policy written to the global is not sent back to it, and
// the global's write that the zone receives is stamped too. After the
// global's Shutdown, and after the zone's client stops, each side's resume
// point is the other's current revision.
func TestShutdownDrainStampsResumePoints(t *testing.T) {
	s := fastStream()
	s.ResumeConfirmDelay = time.Hour
	c := newCluster(t, clusterOpts{stream: s})
	z := c.zone("zone-1", zoneOpts{}).start()
	eventually(t, wait, "connected", z.connected)
	writeZone(t, z.store, "zone-1", timeout("zone-own", "", ""))
	eventually(t, wait, "zone policy on the global", func() bool { return count(t, c.global, "MeshTimeout") == 1 })
	// The global's revision of the zone's policy has nothing for the zone:
	// only the confirmation timer (an hour) or the drain stamps it.
	time.Sleep(50 * time.Millisecond)
	ctx := context.Background()
	grev, _ := c.global.Revision(ctx)
	if got, _ := readRevision(ctx, z.store, MetaKeyGlobalRevision); got == grev {
		t.Fatalf("the zone recorded global revision %d before any drain: the test proves nothing", got)
	}
	c.server.Shutdown()
	if got, _ := readRevision(ctx, z.store, MetaKeyGlobalRevision); got != grev {
		t.Errorf("after the global's graceful shutdown the zone resumes at %d, want %d", got, grev)
	}

	// The other way: the zone's revision that stores the global's policy
	// has nothing for the global (a global copy is not sent back).
	c.grpcSrv.Stop()
	c.serveAgain("global-2")
	eventually(t, wait, "reconnected", z.connected)
	writeGlobal(t, c.global, timeout("from-global", "", ""))
	eventually(t, wait, "global policy on the zone", func() bool { return count(t, z.store, "MeshTimeout") == 2 })
	time.Sleep(50 * time.Millisecond)
	zrev, _ := z.store.Revision(ctx)
	if got, _ := readRevision(ctx, c.global, MetaKeyZoneRevision("zone-1")); got == zrev {
		t.Fatalf("the global recorded zone revision %d before any drain: the test proves nothing", got)
	}
	z.stopClient()
	if got, _ := readRevision(ctx, c.global, MetaKeyZoneRevision("zone-1")); got != zrev {
		t.Errorf("after the zone's graceful stop the global resumes it at %d, want %d", got, zrev)
	}
}
