package kds

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding/gzip"

	"github.com/meridian-mesh/meridian/internal/auth"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// TestOverTLSWithGzip wires the packages the way the binaries should: the
// global's generated self-signed certificate, the zone trusting it as its CA
// file, gzip on the stream, metrics on a private registry.
func TestOverTLSWithGzip(t *testing.T) {
	dir := t.TempDir()
	global := openStore(t, filepath.Join(dir, "global.db"), storeOpts{})
	defer global.Close()
	writeGlobal(t, global, mesh("default"))
	writeGlobal(t, global, timeout("default-timeout-global", "", ""))

	tokens, err := loadZoneTokens(dir)
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	greg := prometheus.NewRegistry()
	srv, err := NewServer(ServerConfig{Plane: testGlobal, Store: global, Registry: testRegistry, Authenticator: tokenAuth{tokens},
		Logger: testLogger(t, "global"), Metrics: greg, SoftwareVersion: "g"})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS.Config)))
	syncv1.RegisterSyncServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	defer func() { srv.Shutdown(); gs.GracefulStop() }()

	clientTLS, err := auth.ClientTLS(auth.ClientTLSConfig{CAFile: serverTLS.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	token, _ := tokens.Issue("zone-1", time.Hour)
	zstore := openStore(t, filepath.Join(dir, "zone.db"), storeOpts{})
	defer zstore.Close()
	zreg := prometheus.NewRegistry()
	client, err := NewClient(ClientConfig{Store: zstore, Registry: testRegistry, Plane: zonePlane("zone-1", plane.EnvKubernetes),
		Admission: testZoneAdmission(t, "zone-1", plane.EnvKubernetes),
		Token:     func() (string, error) { return token, nil }, Target: ln.Addr().String(), Logger: testLogger(t, "zone-1"),
		DialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)),
			grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name)),
		}, Metrics: zreg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	eventually(t, wait, "policy over TLS", func() bool {
		return exists(zstore, "MeshTimeout", "default", "default-timeout-global-54dbd4c66zwbcf9c")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		reg    *prometheus.Registry
		metric string
	}{
		{greg, "meridian_sync_batches_sent_total"},
		{greg, "meridian_sync_resources_synced_total"},
		{greg, "meridian_sync_lag_seconds"},
		{zreg, "meridian_sync_batches_acked_total"},
		{zreg, "meridian_sync_zone_connected"},
		{zreg, "meridian_sync_full_snapshot_seconds"}, // the zone's first sync is a full snapshot
	} {
		if !gathered(t, tc.reg, tc.metric) {
			t.Errorf("metric %s not recorded", tc.metric)
		}
	}
	if phases := snapshotPhases(t, zreg); phases["receive"] != 1 || phases["apply"] != 1 {
		t.Errorf("full snapshot observations by phase %v, want one receive and one apply", phases)
	}
	if gathered(t, prometheus.DefaultRegisterer.(*prometheus.Registry), "meridian_sync_batches_sent_total") {
		t.Error("metrics leaked into the default registry")
	}
}

// snapshotPhases counts the full snapshot observations in reg by phase.
func snapshotPhases(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "meridian_sync_full_snapshot_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" {
					out[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return out
}

func gathered(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return true
		}
	}
	return false
}

func TestStatusJSON(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	writeZone(t, z.store, "zone-1", timeout("z", "", ""))
	z.waitSettled()
	st, ok := c.server.Status("zone-1")
	if !ok {
		t.Fatal("no status")
	}
	raw, err := json.Marshal(c.server.Statuses())
	if err != nil {
		t.Fatal(err)
	}
	var decoded []map[string]any
	if err := json.Unmarshal(raw, &decoded); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"zone", "connected", "connectTime", "softwareVersion", "environment", "lastHeartbeat",
		"connections", "globalToZone", "zoneToGlobal"} {
		if _, ok := decoded[0][key]; !ok {
			t.Errorf("status JSON lacks %q: %s", key, raw)
		}
	}
	z2g := decoded[0]["zoneToGlobal"].(map[string]any)
	for _, key := range []string{"revisionSent", "revisionAcked", "batchesSent", "batchesAcked", "batchesNacked", "types"} {
		if _, ok := z2g[key]; !ok {
			t.Errorf("flow JSON lacks %q: %s", key, raw)
		}
	}
	if st.ZoneToGlobal.Types["MeshTimeout"].BatchesAcked == 0 || st.ZoneToGlobal.RevisionAcked == 0 {
		t.Errorf("zone->global status %+v", st.ZoneToGlobal)
	}
	// Statuses are copies: changing one does not change the tracker.
	st.ZoneToGlobal.Types["MeshTimeout"].BatchesAcked = 999
	if again, _ := c.server.Status("zone-1"); again.ZoneToGlobal.Types["MeshTimeout"].BatchesAcked == 999 {
		t.Error("Status returned shared state")
	}
	z.stopClient()
	eventually(t, wait, "disconnect recorded", func() bool {
		st, _ := c.server.Status("zone-1")
		return !st.Connected && st.DisconnectTime != nil && st.LastError != ""
	})
	if cs := z.client.Status(); cs.Connected || cs.DisconnectTime == nil || cs.GlobalToZone.RevisionAcked == 0 {
		t.Errorf("client status %+v", cs)
	}
	if _, ok := c.server.Status("nowhere"); ok {
		t.Error("status of an unknown zone")
	}
}

// TestReplacedStream: a zone that reconnects while its old stream is still
// open takes over; the old one ends.
func TestReplacedStream(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	a := c.zone("zone-1", zoneOpts{}).start()
	eventually(t, wait, "first stream", a.connected)
	b := c.zone("zone-1", zoneOpts{file: "zone-1-second.db"}).start()
	eventually(t, wait, "second stream", func() bool { return b.client.Status().Connected })
	eventually(t, wait, "first stream replaced", func() bool {
		return strings.Contains(a.client.Status().LastError, "replaced")
	})
}

func TestConfigChecks(t *testing.T) {
	store := newTestStore(t)
	tokens, _ := loadZoneTokens(t.TempDir())
	if _, err := NewServer(ServerConfig{Plane: testGlobal, Store: store, Registry: testRegistry}); err == nil {
		t.Error("server without authenticator")
	}
	if _, err := NewServer(ServerConfig{Plane: testGlobal, Store: store, Registry: testRegistry, Authenticator: tokenAuth{tokens},
		Stream: StreamConfig{HeartbeatInterval: time.Minute, HeartbeatTimeout: time.Second}}); err == nil {
		t.Error("heartbeat timeout below interval")
	}
	if _, err := NewServer(ServerConfig{Plane: testGlobal, Store: store, Registry: testRegistry, Authenticator: tokenAuth{tokens},
		Stream: StreamConfig{MaxBatchBytes: 10}}); err == nil {
		t.Error("tiny MaxBatchBytes")
	}
	base := ClientConfig{Store: store, Registry: testRegistry, Plane: zonePlane("zone-1", "kubernetes"), Admission: testZoneAdmission(t, "zone-1", plane.EnvKubernetes),
		Token: func() (string, error) { return "", nil }, Target: "x:1", DialOptions: []grpc.DialOption{grpc.WithAuthority("x")}}
	if _, err := NewClient(base); err != nil {
		t.Errorf("valid client config refused: %v", err)
	}
	for name, mutate := range map[string]func(*ClientConfig){
		"bad zone":     func(c *ClientConfig) { c.Plane.Zone = "Zone_1" },
		"bad env":      func(c *ClientConfig) { c.Plane.Environment = "mars" },
		"no token":     func(c *ClientConfig) { c.Token = nil },
		"no target":    func(c *ClientConfig) { c.Target = "" },
		"no dial opt":  func(c *ClientConfig) { c.DialOptions = nil },
		"no admission": func(c *ClientConfig) { c.Admission = nil },
	} {
		cfg := base
		mutate(&cfg)
		if _, err := NewClient(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
