package ca

import (
	"crypto/rand"
	"crypto/x509"
	"errors"
	"net/url"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func clock() time.Time { return t0 }

func mustAuthority(t *testing.T, chain, key, root []byte) *Authority {
	t.Helper()
	a, err := LoadAuthority(chain, key, root, rand.Reader, clock)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// mustRoot makes a root authority and its certificate, PEM.
func mustRoot(t *testing.T, name string, validity time.Duration) (*Authority, []byte) {
	t.Helper()
	certPEM, keyPEM, err := NewRoot(rand.Reader, t0, name, validity)
	if err != nil {
		t.Fatal(err)
	}
	return mustAuthority(t, certPEM, keyPEM, certPEM), certPEM
}

// TestRootIntermediateLeaf: a root signs a zone's intermediate over its
// CSR; the intermediate signs a workload leaf over the workload's CSR; the
// leaf verifies to the root, carries the identities as URI SANs, and
// never outlives its issuer.
func TestRootIntermediateLeaf(t *testing.T) {
	root, rootPEM := mustRoot(t, "mesh default root", 10*365*24*time.Hour)

	zoneKey, _ := NewKey(rand.Reader)
	zoneCSRPEM, _ := NewCSR(rand.Reader, zoneKey, "zone-1")
	zoneCSR, err := ParseCSR(zoneCSRPEM)
	if err != nil {
		t.Fatal(err)
	}
	inter, err := root.SignIntermediate(zoneCSR, "mesh default zone-1", 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	zoneKeyPEM, _ := EncodeKey(zoneKey)
	zone := mustAuthority(t, EncodeCerts(inter), zoneKeyPEM, rootPEM)
	if err := zone.Verify(); err != nil {
		t.Fatalf("intermediate does not verify: %v", err)
	}

	wlKey, _ := NewKey(rand.Reader)
	wlCSRPEM, _ := NewCSR(rand.Reader, wlKey, "ignored")
	wlCSR, _ := ParseCSR(wlCSRPEM)
	spiffe, _ := url.Parse("spiffe://default/backend")
	tag, _ := url.Parse("kuma://version/v1")
	chain, err := zone.IssueLeaf(wlCSR, Leaf{CommonName: "default.backend-1", URIs: []*url.URL{spiffe, tag}}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := chain[0]
	if len(chain) != 2 || !chain[1].Equal(inter) {
		t.Fatalf("chain: %d certificates", len(chain))
	}
	if leaf.Subject.CommonName != "default.backend-1" || len(leaf.URIs) != 2 || leaf.URIs[0].String() != "spiffe://default/backend" {
		t.Fatalf("leaf names: %s %v", leaf.Subject.CommonName, leaf.URIs)
	}
	if !SamePublicKey(leaf, wlKey.Public()) {
		t.Fatal("leaf not made for the CSR's key")
	}
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	inters := x509.NewCertPool()
	inters.AddCert(inter)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, CurrentTime: t0,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify to the root: %v", err)
	}
	if !leaf.NotAfter.Equal(t0.Add(24 * time.Hour)) {
		t.Errorf("leaf not after %v", leaf.NotAfter)
	}
	// A leaf asked for longer than its issuer lives stops with it.
	long, err := zone.IssueLeaf(wlCSR, Leaf{CommonName: "x"}, 20*365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !long[0].NotAfter.Equal(inter.NotAfter) {
		t.Errorf("leaf outlives its issuer: %v > %v", long[0].NotAfter, inter.NotAfter)
	}
	// A CA below the zone's intermediate (path length 0) does not verify.
	sub, err := zone.SignIntermediate(wlCSR, "sub", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	inters.AddCert(sub)
	subLeafKey, _ := NewKey(rand.Reader)
	subCSRPEM, _ := NewCSR(rand.Reader, subLeafKey, "y")
	subCSR, _ := ParseCSR(subCSRPEM)
	wlKeyPEM, _ := EncodeKey(wlKey)
	subCA := mustAuthority(t, EncodeCerts(sub, inter), wlKeyPEM, rootPEM)
	below, err := subCA.IssueLeaf(subCSR, Leaf{CommonName: "y"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := below[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, CurrentTime: t0,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
		t.Error("a leaf below a CA signed by a path-length-0 intermediate verifies")
	}
}

// TestRootLeafComesAlone: a leaf a root signs is presented alone (its
// peers hold the root), and verifies to that root.
func TestRootLeafComesAlone(t *testing.T) {
	root, _ := mustRoot(t, "zone-1 xDS clients", 365*24*time.Hour)
	key, _ := NewKey(rand.Reader)
	csrPEM, _ := NewCSR(rand.Reader, key, "ignored")
	csr, _ := ParseCSR(csrPEM)
	chain, err := root.IssueLeaf(csr, Leaf{CommonName: "default.web-1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 1 {
		t.Fatalf("chain: %d certificates, want the leaf alone", len(chain))
	}
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, CurrentTime: t0,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify to the root: %v", err)
	}
}

func TestLoadAuthorityRefusesMismatchedKey(t *testing.T) {
	certPEM, _, _ := NewRoot(rand.Reader, t0, "a", time.Hour)
	_, otherKey, _ := NewRoot(rand.Reader, t0, "b", time.Hour)
	if _, err := LoadAuthority(certPEM, otherKey, certPEM, rand.Reader, clock); !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("err %v, want ErrKeyMismatch", err)
	}
}

func TestParseCSRRefusesForgery(t *testing.T) {
	key, _ := NewKey(rand.Reader)
	csr, _ := NewCSR(rand.Reader, key, "x")
	bad := append([]byte(nil), csr...)
	bad[len(bad)/2] ^= 0x01
	if _, err := ParseCSR(bad); !errors.Is(err, ErrBadCSR) {
		t.Fatalf("a damaged CSR: %v", err)
	}
	if _, err := ParseCSR([]byte("junk")); !errors.Is(err, ErrBadCSR) {
		t.Fatalf("junk: %v", err)
	}
}

func FuzzParseCSR(f *testing.F) {
	key, _ := NewKey(rand.Reader)
	csr, _ := NewCSR(rand.Reader, key, "x")
	f.Add(csr)
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ParseCSR(data)
		_, _ = ParseCerts(data)
		_, _ = ParseKey(data)
	})
}
