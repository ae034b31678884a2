package meshca

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/ca"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

func openStore(t *testing.T) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func putMesh(t *testing.T, s Store, name, spec string) {
	t.Helper()
	if _, _, err := s.Put(context.Background(), &resource.Resource{Type: "Mesh", Name: name, Spec: json.RawMessage(spec)}); err != nil {
		t.Fatal(err)
	}
}

const builtinMesh = `{"mtls": {"enabledBackend": "ca-1", "backends": [{"name": "ca-1", "type": "builtin",
	"dpCert": {"rotation": {"expiration": "2h"}}}]}}`

// clock is a settable clock.
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

// relay copies every resource of typ from one store to another, as KDS
// does (the zone label set to the sending zone on the way to the global).
func relay(t *testing.T, from, to Store, typ, zone string) int {
	t.Helper()
	ctx := context.Background()
	res, err := from.List(ctx, storage.ListOptions{Type: typ})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Items {
		c := &resource.Resource{Type: r.Type, Mesh: r.Mesh, Name: r.Name, Spec: r.Spec}
		for k, v := range r.Labels.All() {
			c.Labels.Set(k, v)
		}
		if zone != "" {
			c.Labels.Set(resource.LabelZone, zone)
		}
		if _, _, err := to.Put(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	return len(res.Items)
}

func issue(t *testing.T, z *Zone, mesh string) (*x509.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ca.NewKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM, err := ca.NewCSR(rand.Reader, key, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ca.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	uri, _ := url.Parse("spiffe://" + mesh + "/web")
	chain, bundle, _, err := z.Issue(mesh, csr, ca.Leaf{CommonName: mesh + ".web-1", URIs: []*url.URL{uri}})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.ParseCerts(chain)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle holds no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: certs[0].NotBefore.Add(time.Minute)}); err != nil {
		t.Fatalf("workload certificate does not verify to the mesh root: %v", err)
	}
	if len(certs[0].URIs) != 1 || certs[0].URIs[0].String() != "spiffe://"+mesh+"/web" {
		t.Fatalf("URIs = %v", certs[0].URIs)
	}
	return certs[0], roots
}

// TestZoneIntermediateSignedByGlobal follows the multizone flow: the zone
// makes its key and request, the global makes the root and signs, the zone
// issues workload certificates that verify to the root. No key crosses.
func TestZoneIntermediateSignedByGlobal(t *testing.T) {
	ctx := context.Background()
	gs, zs := openStore(t), openStore(t)
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	g, err := NewGlobal(Config{Store: gs, Rand: rand.Reader, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	z, err := NewZone(ZoneConfig{Config: Config{Store: zs, Rand: rand.Reader, Now: clk.Now}, Zone: "zone-1"})
	if err != nil {
		t.Fatal(err)
	}
	putMesh(t, gs, "m1", builtinMesh)
	putMesh(t, zs, "m1", builtinMesh)
	changed := z.Changed()
	if err := z.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	st := z.MTLS("m1")
	if !st.Enabled || st.Ready || !strings.Contains(st.Problem, "waiting for the global") {
		t.Fatalf("before the global signed: %+v", st)
	}
	if st.LeafValidity != 2*time.Hour {
		t.Fatalf("leaf validity = %v, want the backend's 2h", st.LeafValidity)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed not signalled when the mesh's mTLS appeared")
	}
	if _, _, _, err := z.Issue("m1", nil, ca.Leaf{}); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Issue before the intermediate: %v, want ErrNotReady", err)
	}
	if n := relay(t, zs, gs, "ZoneCertificateRequest", "zone-1"); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
	if err := g.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n := relay(t, gs, zs, "ZoneCertificate", ""); n != 1 {
		t.Fatalf("%d zone certificates, want 1", n)
	}
	if err := z.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if st := z.MTLS("m1"); !st.Ready || st.Problem != "" {
		t.Fatalf("after the global signed: %+v", st)
	}
	issue(t, z, "m1")

	// The root's key is only in the global's store; the zone's key only
	// in the zone's.
	rootRes, err := gs.Get(ctx, rootKey("m1", "ca-1"))
	if err != nil {
		t.Fatal(err)
	}
	zoneRes, err := zs.Get(ctx, resource.Key{Type: "ZoneCA", Mesh: "m1", Name: "ca-1"})
	if err != nil {
		t.Fatal(err)
	}
	rootKeyPEM, _ := specOf[struct{ Key string }](rootRes)
	zoneKeyPEM, _ := specOf[struct{ Key string }](zoneRes)
	if rootKeyPEM.Key == "" || zoneKeyPEM.Key == "" {
		t.Fatal("keys missing")
	}
	if holder(t, gs, rootKeyPEM.Key) == "" || holder(t, zs, zoneKeyPEM.Key) == "" {
		t.Fatal("the keys are not found where they were made")
	}
	if h := holder(t, zs, rootKeyPEM.Key); h != "" {
		t.Fatalf("the root's key is in the zone's store, in %s", h)
	}
	if h := holder(t, gs, zoneKeyPEM.Key); h != "" {
		t.Fatalf("the zone's key is in the global's store, in %s", h)
	}

	// Signing again is a no-op while the intermediate is current...
	before, _ := gs.Get(ctx, resource.Key{Type: "ZoneCertificate", Mesh: "m1", Name: "zone-1"})
	if err := g.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	after, _ := gs.Get(ctx, resource.Key{Type: "ZoneCertificate", Mesh: "m1", Name: "zone-1"})
	if before.Version != after.Version {
		t.Fatal("a current intermediate was signed again")
	}
	// ...and renews it past two thirds of its life.
	clk.Add(IntermediateValidity * 7 / 10)
	if err := g.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	renewed, _ := gs.Get(ctx, resource.Key{Type: "ZoneCertificate", Mesh: "m1", Name: "zone-1"})
	if renewed.Version == before.Version {
		t.Fatal("an intermediate past two thirds of its life was not renewed")
	}
	if renewed.Labels.Get(resource.LabelForZone) != "zone-1" {
		t.Fatalf("for-zone label = %q", renewed.Labels.Get(resource.LabelForZone))
	}
}

// holder names the resource of s whose spec holds the PEM text, or "".
func holder(t *testing.T, s Store, pem string) string {
	t.Helper()
	// Specs are JSON: look for the key as JSON encodes it.
	enc, _ := json.Marshal(strings.TrimSpace(pem))
	needle := strings.Trim(string(enc), `"`)
	for _, typ := range []string{"Mesh", "MeshCA", "ZoneCA", "ZoneCertificateRequest", "ZoneCertificate"} {
		res, err := s.List(context.Background(), storage.ListOptions{Type: typ})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Items {
			if strings.Contains(string(r.Spec), needle) {
				return r.Key().String()
			}
		}
	}
	return ""
}

func TestStandaloneZoneIsItsOwnRoot(t *testing.T) {
	ctx := context.Background()
	zs := openStore(t)
	z, err := NewZone(ZoneConfig{Config: Config{Store: zs, Rand: rand.Reader}, Zone: "solo", Standalone: true})
	if err != nil {
		t.Fatal(err)
	}
	putMesh(t, zs, "default", builtinMesh)
	if err := z.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if st := z.MTLS("default"); !st.Ready {
		t.Fatalf("standalone zone not ready: %+v", st)
	}
	cert, _ := issue(t, z, "default")
	if got := cert.NotAfter.Sub(cert.NotBefore); got < 2*time.Hour || got > 2*time.Hour+10*time.Minute {
		t.Fatalf("leaf lives %v, want the backend's 2h", got)
	}
}

func TestMeshWithoutBuiltinBackend(t *testing.T) {
	ctx := context.Background()
	zs := openStore(t)
	z, err := NewZone(ZoneConfig{Config: Config{Store: zs, Rand: rand.Reader}, Zone: "solo", Standalone: true})
	if err != nil {
		t.Fatal(err)
	}
	putMesh(t, zs, "plain", `{}`)
	putMesh(t, zs, "vault", `{"mtls": {"enabledBackend": "v", "backends": [{"name": "v", "type": "vault"}]}}`)
	if err := z.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if st := z.MTLS("plain"); st.Enabled {
		t.Fatalf("mesh without mtls: %+v", st)
	}
	st := z.MTLS("vault")
	if !st.Enabled || st.Ready || !strings.Contains(st.Problem, "not builtin") {
		t.Fatalf("vault backend: %+v", st)
	}
}

// TestGlobalReplicasAgreeOnOneRoot: HA replicas creating a root at once
// end up with the one stored first.
func TestGlobalReplicasAgreeOnOneRoot(t *testing.T) {
	ctx := context.Background()
	gs := openStore(t)
	cfg := Config{Store: gs, Rand: rand.Reader, Now: time.Now}
	if err := cfg.check(); err != nil {
		t.Fatal(err)
	}
	const n = 8
	roots := make([]*ca.Authority, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := ensureRoot(ctx, cfg, "m1", "ca-1")
			if err != nil {
				t.Error(err)
				return
			}
			roots[i] = a
		}()
	}
	wg.Wait()
	for i := 1; i < n; i++ {
		if roots[i] == nil || !roots[i].Root.Equal(roots[0].Root) {
			t.Fatal("replicas hold different roots")
		}
	}
}

func TestEnabledBackend(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Backend
		ok   bool
	}{
		{`{}`, Backend{}, false},
		{`{"mtls": {"backends": [{"name": "a"}]}}`, Backend{}, false},
		{`{"mtls": {"enabledBackend": "missing", "backends": [{"name": "a"}]}}`, Backend{}, false},
		{`{"mtls": {"enabledBackend": "a", "backends": [{"name": "a"}]}}`, Backend{Name: "a", Builtin: true, LeafValidity: DefaultLeafValidity}, true},
		{`{"mtls": {"enabledBackend": "a", "backends": [{"name": "a", "type": "provided"}]}}`, Backend{Name: "a", LeafValidity: DefaultLeafValidity}, true},
		{`{"mtls": {"enabledBackend": "a", "backends": [{"name": "a", "dpCert": {"rotation": {"expiration": "1h"}}}]}}`,
			Backend{Name: "a", Builtin: true, LeafValidity: time.Hour}, true},
	} {
		got, ok := EnabledBackend(&resource.Resource{Type: "Mesh", Name: "m", Spec: json.RawMessage(tc.spec)})
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: got %+v %v, want %+v %v", tc.spec, got, ok, tc.want, tc.ok)
		}
	}
}
