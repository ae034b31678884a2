package dataplane

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/ca"
	"github.com/meridian-mesh/meridian/internal/meshca"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/xds"
	dataplanev1 "github.com/meridian-mesh/meridian/proto/meridian/dataplane/v1"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type revoked struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (r *revoked) Revoked(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[id]
}

// fixture is a zone's agent service on a loopback gRPC server, with a
// standalone mesh CA for mesh "m" (mTLS on) and mesh "plain" (off).
type fixture struct {
	srv     *Server
	store   *boltstore.Store
	tokens  *auth.DataplaneTokens
	revoked *revoked
	clock   *clock
	client  dataplanev1.AgentServiceClient

	mu    sync.Mutex
	ended []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	reg := resource.NewDefaultRegistry()
	p, err := plane.NewZone("zone-1", plane.EnvUniversal, "", false)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admission.New(admission.Config{Registry: reg, Plane: p})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{`{"type": "Mesh", "name": "m", "mtls": {"enabledBackend": "ca-1", "backends": [{"name": "ca-1", "type": "builtin"}]}}`,
		`{"type": "Mesh", "name": "plain"}`} {
		r, err := reg.Decode([]byte(m))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	mca, err := meshca.NewZone(meshca.ZoneConfig{Config: meshca.Config{Store: store, Rand: rand.Reader}, Zone: "zone-1", Standalone: true})
	if err != nil {
		t.Fatal(err)
	}
	go mca.Run(ctx)
	for deadline := time.Now().Add(10 * time.Second); !mca.MTLS("m").Ready; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("mesh CA not ready: %+v", mca.MTLS("m"))
		}
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	clk := &clock{now: time.Now()}
	tokens, err := auth.NewDataplaneTokens(key, clk)
	if err != nil {
		t.Fatal(err)
	}
	rootPEM, rootKey, err := ca.NewRoot(rand.Reader, time.Now(), "xds clients", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	xdsCA, err := ca.LoadAuthority(rootPEM, rootKey, rootPEM, rand.Reader, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{store: store, tokens: tokens, revoked: &revoked{ids: map[string]bool{}}, clock: clk}
	f.srv, err = NewServer(Config{Store: store, Registry: reg, Plane: p, Admission: adm, Tokens: tokens, Revoked: f.revoked,
		CA: mca, XDSCA: xdsCA, XDSBundle: rootPEM, Grace: time.Minute, Now: clk.Now,
		EndStreams: func(match func(xds.Identity) bool, reason string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.ended = append(f.ended, reason)
		}})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	f.srv.Register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f.client = dataplanev1.NewAgentServiceClient(conn)
	return f
}

func (f *fixture) token(t *testing.T, req auth.DataplaneTokenRequest) (context.Context, string) {
	t.Helper()
	if req.ValidFor == 0 {
		req.ValidFor = time.Hour
	}
	tok, claims, err := f.tokens.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok), claims.ID
}

func dataplaneDoc(mesh, name, service string) []byte {
	b, _ := json.Marshal(map[string]any{"type": "Dataplane", "mesh": mesh, "name": name,
		"networking": map[string]any{"address": "127.0.0.1", "inbound": []any{
			map[string]any{"port": 8080, "tags": map[string]string{"kuma.io/service": service, "version": "v1"}}}}})
	return b
}

// join opens a session and returns its Joined event and stream.
func (f *fixture) join(t *testing.T, ctx context.Context, doc []byte) (*dataplanev1.Joined, grpc.ServerStreamingClient[dataplanev1.JoinResponse], context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	stream, err := f.client.Join(ctx, &dataplanev1.JoinRequest{Dataplane: doc, Version: "test"})
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	msg, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return msg.GetJoined(), stream, cancel, nil
}

func (f *fixture) stored(t *testing.T, mesh, name string) *resource.Resource {
	t.Helper()
	r, err := f.store.Get(context.Background(), resource.Key{Type: "Dataplane", Mesh: mesh, Name: name})
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func csr(t *testing.T) []byte {
	t.Helper()
	key, err := ca.NewKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.NewCSR(rand.Reader, key, "agent")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestJoinRegistersAndSigns(t *testing.T) {
	f := newFixture(t)
	ctx, tokenID := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Name: "web-1"})
	joined, _, cancel, err := f.join(t, ctx, dataplaneDoc("m", "web-1", "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if joined.GetNodeId() != "m.web-1" || joined.GetZone() != "zone-1" || !joined.GetMtls() {
		t.Fatalf("joined = %v", joined)
	}
	r := f.stored(t, "m", "web-1")
	if r == nil || r.Labels.Get(LabelManagedBy) != ManagedByAgent || r.Labels.Get(resource.LabelZone) != "zone-1" {
		t.Fatalf("stored Dataplane = %+v", r)
	}
	if st := f.srv.Status("m.web-1"); !st.Connected || st.Token != tokenID || st.Version != "test" {
		t.Fatalf("status = %+v", st)
	}

	// The xDS client certificate names the Dataplane and its token.
	resp, err := f.client.Sign(ctx, &dataplanev1.SignRequest{NodeId: "m.web-1", Kind: dataplanev1.CertificateKind_CERTIFICATE_KIND_XDS, Csr: csr(t)})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.ParseCerts(resp.GetCertificateChain())
	if err != nil {
		t.Fatal(err)
	}
	id, err := IdentityOf(certs[0])
	if err != nil {
		t.Fatal(err)
	}
	if id != (xds.Identity{NodeID: "m.web-1", Mesh: "m", Name: "web-1", TokenID: tokenID}) {
		t.Fatalf("identity = %+v", id)
	}

	// The workload certificate carries the identities RBAC matches and
	// verifies to the mesh root.
	resp, err = f.client.Sign(ctx, &dataplanev1.SignRequest{NodeId: "m.web-1", Kind: dataplanev1.CertificateKind_CERTIFICATE_KIND_WORKLOAD, Csr: csr(t)})
	if err != nil {
		t.Fatal(err)
	}
	certs, err = ca.ParseCerts(resp.GetCertificateChain())
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, u := range certs[0].URIs {
		uris = append(uris, u.String())
	}
	if strings.Join(uris, " ") != "spiffe://m/web kuma://version/v1" {
		t.Fatalf("workload URIs = %v", uris)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(resp.GetTrustBundle())
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("workload certificate: %v", err)
	}
}

func TestJoinRefusals(t *testing.T) {
	f := newFixture(t)
	web, _ := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Name: "web-1"})
	other, _ := f.token(t, auth.DataplaneTokenRequest{Mesh: "plain", Name: "web-1"})
	tagged, _ := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Tags: map[string]string{"kuma.io/service": "web"}})
	for _, tc := range []struct {
		name string
		ctx  context.Context
		doc  []byte
		code codes.Code
		msg  string
	}{
		{"no token", context.Background(), dataplaneDoc("m", "web-1", "web"), codes.Unauthenticated, "no Dataplane token"},
		{"bad token", metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer nope"), dataplaneDoc("m", "web-1", "web"),
			codes.Unauthenticated, "malformed"},
		{"another Dataplane", web, dataplaneDoc("m", "backend-1", "backend"), codes.PermissionDenied, `for Dataplane "web-1"`},
		{"another mesh", other, dataplaneDoc("m", "web-1", "web"), codes.PermissionDenied, `for mesh "plain"`},
		{"tags not carried", tagged, dataplaneDoc("m", "backend-1", "backend"), codes.PermissionDenied, "kuma.io/service=web"},
		{"not a Dataplane", web, []byte(`{"type": "Mesh", "name": "x"}`), codes.InvalidArgument, "not a Dataplane"},
		{"invalid Dataplane", web, []byte(`{"type": "Dataplane", "mesh": "m", "name": "web-1", "networking": {"address": "127.0.0.1", "inbound": [{"port": 99999, "tags": {"kuma.io/service": "web"}}]}}`),
			codes.InvalidArgument, "port"},
		{"undecodable", web, []byte(`{`), codes.InvalidArgument, "dataplane file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, cancel, err := f.join(t, tc.ctx, tc.doc)
			if err == nil {
				cancel()
				t.Fatal("joined")
			}
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error = %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	if r := f.stored(t, "m", "backend-1"); r != nil {
		t.Fatal("a refused Dataplane was registered")
	}
	if r := f.stored(t, "m", "web-1"); r != nil {
		t.Fatal("a refused Dataplane was registered")
	}
	// A tag token admits a Dataplane carrying its tags.
	if _, _, cancel, err := f.join(t, tagged, dataplaneDoc("m", "web-7", "web")); err != nil {
		t.Fatal(err)
	} else {
		cancel()
	}
}

func TestSignNeedsTheSessionsToken(t *testing.T) {
	f := newFixture(t)
	web, _ := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Name: "web-1"})
	_, _, cancel, err := f.join(t, web, dataplaneDoc("m", "web-1", "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	backend, _ := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Name: "backend-1"})
	_, err = f.client.Sign(backend, &dataplanev1.SignRequest{NodeId: "m.web-1", Kind: dataplanev1.CertificateKind_CERTIFICATE_KIND_WORKLOAD, Csr: csr(t)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("backend's token signing for web-1: %v", err)
	}
	_, err = f.client.Sign(web, &dataplanev1.SignRequest{NodeId: "m.web-1", Kind: dataplanev1.CertificateKind_CERTIFICATE_KIND_WORKLOAD, Csr: []byte("junk")})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("junk CSR: %v", err)
	}
}

func TestTakeoverEndsTheOlderSession(t *testing.T) {
	f := newFixture(t)
	ctx, _ := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Name: "web-1"})
	_, first, cancel1, err := f.join(t, ctx, dataplaneDoc("m", "web-1", "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel1()
	_, _, cancel2, err := f.join(t, ctx, dataplaneDoc("m", "web-1", "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	_, err = first.Recv()
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "took Dataplane m.web-1 over") {
		t.Fatalf("older session: %v", err)
	}
	if !f.srv.Live("m.web-1") {
		t.Fatal("the newer session is not live")
	}
}

func TestGracePeriod(t *testing.T) {
	f := newFixture(t)
	ctx, _ := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Name: "web-1"})
	_, _, cancel, err := f.join(t, ctx, dataplaneDoc("m", "web-1", "web"))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	waitFor(t, func() bool { return !f.srv.Live("m.web-1") })
	if st := f.srv.Status("m.web-1"); st.Connected || st.LeftAt.IsZero() {
		t.Fatalf("after leaving: %+v", st)
	}
	f.clock.Add(30 * time.Second)
	f.srv.Sweep(context.Background())
	if f.stored(t, "m", "web-1") == nil {
		t.Fatal("removed within the grace period")
	}
	// Back within the grace period: kept, and the clock starts over.
	_, _, cancel, err = f.join(t, ctx, dataplaneDoc("m", "web-1", "web"))
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Add(2 * time.Minute)
	f.srv.Sweep(context.Background())
	if f.stored(t, "m", "web-1") == nil {
		t.Fatal("a live agent's Dataplane was removed")
	}
	cancel()
	waitFor(t, func() bool { return !f.srv.Live("m.web-1") })
	f.clock.Add(time.Minute)
	f.srv.Sweep(context.Background())
	if f.stored(t, "m", "web-1") != nil {
		t.Fatal("kept past the grace period")
	}
}

// TestAdoptAfterRestart: agent Dataplanes found in the store without an
// agent get the grace period; Dataplanes written through the API stay.
func TestAdoptAfterRestart(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for name, managed := range map[string]bool{"agent-1": true, "api-1": false} {
		r := &resource.Resource{Type: "Dataplane", Mesh: "m", Name: name, Spec: json.RawMessage(`{"networking": {"address": "127.0.0.1",
			"inbound": [{"port": 1, "tags": {"kuma.io/service": "s"}}]}}`)}
		if managed {
			r.Labels.Set(LabelManagedBy, ManagedByAgent)
		}
		if _, _, err := f.store.Put(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.srv.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(time.Minute)
	f.srv.Sweep(ctx)
	if f.stored(t, "m", "agent-1") != nil {
		t.Error("an orphaned agent Dataplane was kept")
	}
	if f.stored(t, "m", "api-1") == nil {
		t.Error("a Dataplane written through the API was removed")
	}
}

func TestRevokeEndsSessions(t *testing.T) {
	f := newFixture(t)
	ctx, id := f.token(t, auth.DataplaneTokenRequest{Mesh: "m", Name: "web-1"})
	_, stream, cancel, err := f.join(t, ctx, dataplaneDoc("m", "web-1", "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	f.revoked.mu.Lock()
	f.revoked.ids[id] = true
	f.revoked.mu.Unlock()
	f.srv.Revoke(id)
	if _, err := stream.Recv(); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("session of a revoked token: %v", err)
	}
	f.mu.Lock()
	ended := strings.Join(f.ended, ";")
	f.mu.Unlock()
	if !strings.Contains(ended, id) {
		t.Fatalf("xDS streams of the token not ended: %q", ended)
	}
	if _, _, _, err := f.join(t, ctx, dataplaneDoc("m", "web-1", "web")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("joining with a revoked token: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
	}
}
