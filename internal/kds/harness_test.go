package kds

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// ---- fake clock ----

// fakeClock is a manual clock: timers fire only when Advance passes their
// deadline.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{}
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), timers: map[*fakeTimer]struct{}{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1), when: c.now.Add(d)}
	c.timers[t] = struct{}{}
	return t
}

// Advance moves time forward and fires due timers.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for t := range c.timers {
		if !t.when.After(c.now) {
			delete(c.timers, t)
			select {
			case t.ch <- c.now:
			default:
			}
		}
	}
}

// pending counts armed timers.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

type fakeTimer struct {
	c    *fakeClock
	ch   chan time.Time
	when time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, active := t.c.timers[t]
	delete(t.c.timers, t)
	return active
}

func (t *fakeTimer) Reset(d time.Duration) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	select {
	case <-t.ch:
	default:
	}
	t.when = t.c.now.Add(d)
	t.c.timers[t] = struct{}{}
}

// storeClock is a manual clock for boltstore (tombstone ages).
type storeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *storeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *storeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// ---- stores ----

var testRegistry = resource.NewDefaultRegistry()

func testLogger(t testing.TB, name string) hclog.Logger {
	if testing.Verbose() {
		return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: testWriter{t}})
	}
	return hclog.NewNullLogger()
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

type storeOpts struct {
	clock      boltstore.Clock
	retention  time.Duration
	streamIdle time.Duration
}

func openStore(t testing.TB, path string, o storeOpts) *boltstore.Store {
	t.Helper()
	st, err := boltstore.Open(boltstore.Config{Path: path, Clock: o.clock, TombstoneRetention: o.retention,
		ExpiryInterval: time.Hour, StreamIdle: o.streamIdle})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// writeGlobal writes r to the global's store with the labels the global's
// API sets (origin global, policy role).
func writeGlobal(t testing.TB, st storage.Store, r *resource.Resource) {
	t.Helper()
	r = r.Clone()
	r.Labels.Set(resource.LabelOrigin, resource.OriginGlobal)
	setRole(t, r, "")
	put(t, st, r)
}

// writeZone writes r to a zone's store with the labels the zone's API sets.
func writeZone(t testing.TB, st storage.Store, zone string, r *resource.Resource) {
	t.Helper()
	r = r.Clone()
	r.Labels.Set(resource.LabelOrigin, resource.OriginZone)
	r.Labels.Set(resource.LabelZone, zone)
	if r.Namespace != "" {
		r.Labels.Set(resource.LabelNamespace, r.Namespace)
	}
	setRole(t, r, "")
	put(t, st, r)
}

func setRole(t testing.TB, r *resource.Resource, sysNS string) {
	d, ok := testRegistry.Lookup(r.Type)
	if !ok {
		t.Fatalf("unknown type %s", r.Type)
	}
	if d.Shape != resource.ShapeTargetRef {
		return
	}
	role, err := resource.PolicyRole(r, d, sysNS)
	if err != nil {
		t.Fatal(err)
	}
	r.Labels.Set(resource.LabelPolicyRole, role)
}

func put(t testing.TB, st storage.Store, r *resource.Resource) {
	t.Helper()
	testRegistry.Normalize(r, "")
	if _, _, err := st.Put(context.Background(), r); err != nil {
		t.Fatalf("put %s: %v", r.Key(), err)
	}
}

func del(t testing.TB, st storage.Store, key resource.Key) {
	t.Helper()
	if err := st.Delete(context.Background(), key, 0); err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
}

func mesh(name string) *resource.Resource {
	return &resource.Resource{Type: "Mesh", Name: name, Spec: json.RawMessage(`{}`)}
}

func timeout(name, ns, spec string) *resource.Resource {
	if spec == "" {
		spec = `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"2s"}}]}`
	}
	return &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name, Namespace: ns, Spec: json.RawMessage(spec)}
}

func meshService(name, ns string) *resource.Resource {
	return &resource.Resource{Type: "MeshService", Mesh: "default", Name: name, Namespace: ns,
		Spec: json.RawMessage(`{"ports":[{"port":80,"targetPort":8080}]}`)}
}

func get(st storage.Store, typ, mesh, name string) (*resource.Resource, error) {
	return st.Get(context.Background(), resource.Key{Type: typ, Mesh: mesh, Name: name})
}

func exists(st storage.Store, typ, mesh, name string) bool {
	_, err := get(st, typ, mesh, name)
	return err == nil
}

func names(t testing.TB, st storage.Store, typ string) []string {
	t.Helper()
	list, err := st.List(context.Background(), storage.ListOptions{Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range list.Items {
		out = append(out, r.Name)
	}
	sort.Strings(out)
	return out
}

func count(t testing.TB, st storage.Store, typ string) int {
	t.Helper()
	list, err := st.List(context.Background(), storage.ListOptions{Type: typ, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	return list.Total
}

// eventually polls cond (real time) until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---- in-process cluster ----

// fastStream are stream settings for end-to-end tests on the real clock.
func fastStream() StreamConfig {
	return StreamConfig{HeartbeatInterval: time.Second, HeartbeatTimeout: 5 * time.Second,
		ResumeConfirmDelay: 20 * time.Millisecond, NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 100 * time.Millisecond}
}

type cluster struct {
	t       testing.TB
	dir     string
	global  *boltstore.Store
	gclock  *storeClock
	server  *Server
	tokens  *auth.ZoneTokens
	lisMu   sync.Mutex
	lis     *bufconn.Listener // guarded by lisMu: tests replace it
	grpcSrv *grpc.Server
	stream  StreamConfig
	quiet   bool
}

func (c *cluster) logger(name string) hclog.Logger {
	if c.quiet {
		return hclog.NewNullLogger()
	}
	return testLogger(c.t, name)
}

type clusterOpts struct {
	stream    StreamConfig
	retention time.Duration
	quiet     bool // no logs even with -v (measurements)
}

func newCluster(t testing.TB, o clusterOpts) *cluster {
	t.Helper()
	if o.stream == (StreamConfig{}) {
		o.stream = fastStream()
	}
	c := &cluster{t: t, dir: t.TempDir(), gclock: &storeClock{now: time.Now()}, stream: o.stream, quiet: o.quiet}
	c.global = openStore(t, filepath.Join(c.dir, "global.db"), storeOpts{clock: c.gclock, retention: o.retention})
	t.Cleanup(func() { _ = c.global.Close() })
	tokens, err := loadZoneTokens(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	c.tokens = tokens
	adm, err := admission.New(admission.Config{Registry: testRegistry, Plane: testGlobal})
	if err != nil {
		t.Fatal(err)
	}
	c.server, err = NewServer(ServerConfig{Plane: testGlobal, Store: c.global, Registry: testRegistry, Authenticator: tokenAuth{tokens}, Admission: adm,
		Logger: c.logger("global"), SoftwareVersion: "test-global", Stream: o.stream, Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	c.lis = bufconn.Listen(1 << 20)
	c.grpcSrv = grpc.NewServer()
	syncv1.RegisterSyncServiceServer(c.grpcSrv, c.server)
	go func() { _ = c.grpcSrv.Serve(c.lis) }()
	t.Cleanup(func() {
		c.server.Shutdown()
		c.grpcSrv.Stop()
	})
	writeGlobal(t, c.global, mesh("default"))
	return c
}

// serveAgain starts a new global server on c.global after the previous one
// was shut down (a restart of the global), on a fresh listener.
func (c *cluster) serveAgain(name string) {
	c.t.Helper()
	srv, err := NewServer(ServerConfig{Plane: testGlobal, Store: c.global, Registry: testRegistry, Authenticator: tokenAuth{c.tokens},
		Logger: c.logger(name), Stream: c.stream})
	if err != nil {
		c.t.Fatal(err)
	}
	c.server = srv
	lis := bufconn.Listen(1 << 20)
	c.lisMu.Lock()
	c.lis = lis
	c.lisMu.Unlock()
	c.grpcSrv = grpc.NewServer()
	syncv1.RegisterSyncServiceServer(c.grpcSrv, srv)
	go func() { _ = c.grpcSrv.Serve(lis) }()
	c.t.Cleanup(func() { srv.Shutdown(); c.grpcSrv.Stop() })
}

func (c *cluster) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			c.lisMu.Lock()
			lis := c.lis
			c.lisMu.Unlock()
			return lis.DialContext(ctx)
		}),
	}
}

func (c *cluster) token(zone string) string {
	tok, err := c.tokens.Issue(zone, time.Hour)
	if err != nil {
		c.t.Fatal(err)
	}
	return tok
}

type zoneCP struct {
	c        *cluster
	name     string
	env      string
	path     string
	store    *boltstore.Store
	client   *Client
	cancel   context.CancelFunc
	done     chan error
	token    string
	stream   StreamConfig
	reporter StatusReporter
	// storeOpts opens the zone's store; wrap, when set, is what the
	// client is given instead of the store itself.
	storeOpts storeOpts
	wrap      func(*boltstore.Store) Store
}

type zoneOpts struct {
	reporter StatusReporter
	env      string
	file     string // store file name (default NAME.db)
	token    string
	stream   *StreamConfig
	store    storeOpts
	wrap     func(*boltstore.Store) Store
}

func (c *cluster) zone(name string, o zoneOpts) *zoneCP {
	c.t.Helper()
	if o.env == "" {
		o.env = plane.EnvKubernetes
	}
	if o.token == "" {
		o.token = c.token(name)
	}
	s := c.stream
	if o.stream != nil {
		s = *o.stream
	}
	if o.file == "" {
		o.file = name + ".db"
	}
	z := &zoneCP{c: c, name: name, env: o.env, path: filepath.Join(c.dir, o.file), token: o.token, stream: s, reporter: o.reporter,
		storeOpts: o.store, wrap: o.wrap}
	z.store = openStore(c.t, z.path, o.store)
	c.t.Cleanup(z.close)
	return z
}

// start runs the zone's client.
func (z *zoneCP) start() *zoneCP {
	z.c.t.Helper()
	if z.store == nil {
		z.store = openStore(z.c.t, z.path, z.storeOpts)
	}
	var st Store = z.store
	if z.wrap != nil {
		st = z.wrap(z.store)
	}
	client, err := NewClient(ClientConfig{Store: st, Registry: testRegistry, Plane: zonePlane(z.name, z.env),
		Admission: testZoneAdmission(z.c.t, z.name, z.env),
		Token:     func() (string, error) { return z.token, nil }, Target: "passthrough:///bufnet", DialOptions: z.c.dialOptions(),
		SoftwareVersion: "test-zone", Logger: z.c.logger(z.name), Stream: z.stream, StatusReports: z.reporter,
		ReconnectBackoff: 10 * time.Millisecond, MaxReconnectBackoff: 50 * time.Millisecond, Metrics: prometheus.NewRegistry()})
	if err != nil {
		z.c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	z.client, z.cancel, z.done = client, cancel, make(chan error, 1)
	go func() { z.done <- client.Run(ctx) }()
	return z
}

// stopClient ends the client (the store stays open).
func (z *zoneCP) stopClient() {
	if z.cancel == nil {
		return
	}
	z.cancel()
	if err := <-z.done; err != nil {
		z.c.t.Errorf("zone %s: Run returned %v", z.name, err)
	}
	z.cancel = nil
}

// close stops the client and closes the store (the zone goes down).
func (z *zoneCP) close() {
	z.stopClient()
	if z.store != nil {
		_ = z.store.Close()
		z.store = nil
	}
}

// sent counts the resources and removals sent each way on the zone's
// streams so far (global → zone, zone → global), as the global sees them.
func (z *zoneCP) sent() (uint64, uint64) {
	st, _ := z.c.server.Status(z.name)
	return st.GlobalToZone.ResourcesSent + st.GlobalToZone.RemovalsSent, st.ZoneToGlobal.ResourcesSent + st.ZoneToGlobal.RemovalsSent
}

func (z *zoneCP) connected() bool {
	st, ok := z.c.server.Status(z.name)
	return ok && st.Connected && z.client.Status().Connected
}

// settled: both directions sent everything and the resume points are
// confirmed (nothing in flight, revisions acked as sent).
func (z *zoneCP) settled() bool {
	st, ok := z.c.server.Status(z.name)
	if !ok || !st.Connected {
		return false
	}
	grev, _ := z.c.global.Revision(context.Background())
	zrev, _ := z.store.Revision(context.Background())
	cs := z.client.Status()
	return st.GlobalToZone.RevisionAcked == grev && cs.ZoneToGlobal.RevisionAcked == zrev &&
		st.GlobalToZone.BatchesSent == st.GlobalToZone.BatchesAcked+st.GlobalToZone.BatchesNacked &&
		cs.ZoneToGlobal.BatchesSent == cs.ZoneToGlobal.BatchesAcked+cs.ZoneToGlobal.BatchesNacked
}

func (z *zoneCP) waitSettled() {
	z.c.t.Helper()
	eventually(z.c.t, 10*time.Second, z.name+" settled", z.settled)
}

func grpcClient(c *cluster) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///bufnet", c.dialOptions()...)
}

// testGlobal is the global control plane of the tests.
var testGlobal = plane.NewGlobal("")

// zonePlane is a federated zone of the tests.
func zonePlane(name, env string) plane.Plane {
	return plane.Plane{Mode: plane.Zone, Zone: name, Environment: env, SystemNamespace: plane.DefaultSystemNamespace, Federated: true}
}

// testZoneAdmission is the admission controller of a zone's client.
func testZoneAdmission(t testing.TB, zone, env string) *admission.Controller {
	t.Helper()
	adm, err := admission.New(admission.Config{Registry: testRegistry, Plane: zonePlane(zone, env)})
	if err != nil {
		t.Fatal(err)
	}
	return adm
}

// loadZoneTokens is the zone token issuer and verifier of a global's data
// dir (its key created on first use).
func loadZoneTokens(dir string) (*auth.ZoneTokens, error) {
	ring, err := auth.LoadZoneKeyRing(dir, nil)
	if err != nil {
		return nil, err
	}
	return ring.Tokens(), nil
}
