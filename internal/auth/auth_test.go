package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTokens(t *testing.T, clock Clock) *ZoneTokens {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	zt, err := NewZoneTokens(ZoneTokensConfig{Key: key, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return zt
}

func TestTokenVerify(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	zt := newTokens(t, clock)
	other := newTokens(t, clock)
	tok, err := zt.Issue("zone-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	payload, sig, _ := strings.Cut(tok, ".")
	tampered := base64.RawURLEncoding.EncodeToString([]byte(`{"v":1,"zone":"zone-2","iat":1700000000,"exp":1800000000,"jti":"x"}`)) + "." + sig
	otherTok, _ := other.Issue("zone-1", time.Hour)

	cases := []struct {
		name  string
		token string
		zone  string
		after time.Duration
		want  error
	}{
		{"valid", tok, "zone-1", 0, nil},
		{"valid with whitespace", " " + tok + "\n", "zone-1", 0, nil},
		{"wrong zone", tok, "zone-2", 0, ErrWrongZone},
		{"expired", tok, "zone-1", time.Hour, ErrExpired},
		{"other key", otherTok, "zone-1", 0, ErrBadSignature},
		{"tampered claims", tampered, "zone-2", 0, ErrBadSignature},
		{"empty", "", "zone-1", 0, ErrMalformed},
		{"one part", payload, "zone-1", 0, ErrMalformed},
		{"bad signature encoding", payload + ".!!", "zone-1", 0, ErrMalformed},
		{"short signature", payload + ".AAAA", "zone-1", 0, ErrMalformed},
		{"bad payload encoding", "***." + sig, "zone-1", 0, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeClock{now: clock.Now().Add(tc.after)}
			v, _ := NewZoneTokens(ZoneTokensConfig{Key: zt.key, Clock: c})
			claims, err := v.Verify(tc.token, tc.zone)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify error = %v, want %v", err, tc.want)
			}
			if err == nil && (claims.Zone != "zone-1" || claims.ExpiresAt-claims.IssuedAt != 3600) {
				t.Errorf("claims = %+v", claims)
			}
			if err != nil && strings.Contains(err.Error(), sig) {
				t.Errorf("error leaks the token: %v", err)
			}
			if tc.name == "empty" && !strings.Contains(err.Error(), "the token is empty") {
				t.Errorf("an empty token is reported as %q", err)
			}
		})
	}
}

func TestTokenSignedGarbage(t *testing.T) {
	// A correctly signed payload that is not a claims object is malformed.
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	zt := newTokens(t, clock)
	for _, body := range []string{`[]`, `{"v":2,"zone":"z","iat":1,"exp":2}`, `{"v":1,"zone":"","iat":1,"exp":2}`, `{"v":1,"zone":"z","iat":1,"exp":2,"x":1}`} {
		payload := base64.RawURLEncoding.EncodeToString([]byte(body))
		sig := ed25519.Sign(zt.key, []byte(signingContext+payload))
		tok := payload + "." + base64.RawURLEncoding.EncodeToString(sig)
		if _, err := zt.Verify(tok, "z"); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error = %v, want ErrMalformed", body, err)
		}
	}
	future, _ := NewZoneTokens(ZoneTokensConfig{Key: zt.key, Clock: &fakeClock{now: clock.Now().Add(time.Hour)}})
	tok, _ := future.Issue("z", time.Hour)
	if _, err := zt.Verify(tok, "z"); !errors.Is(err, ErrNotYetValid) {
		t.Errorf("future token: error = %v, want ErrNotYetValid", err)
	}
}

func TestIssueChecksArguments(t *testing.T) {
	zt := newTokens(t, nil)
	if _, err := zt.Issue("", time.Hour); err == nil {
		t.Error("empty zone accepted")
	}
	if _, err := zt.Issue("z", 0); err == nil {
		t.Error("zero validity accepted")
	}
	if _, err := zt.Issue("z", MaxValidity+time.Hour); err == nil {
		t.Error("excessive validity accepted")
	}
	if _, err := NewZoneTokens(ZoneTokensConfig{}); err == nil {
		t.Error("missing key accepted")
	}
}

func TestSigningKeyPersists(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreateZoneTokens(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(dir, SigningKeyFileName))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %#o, want 0600", info.Mode().Perm())
	}
	tok, _ := a.Issue("zone-1", time.Hour)
	b, err := LoadOrCreateZoneTokens(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Verify(tok, "zone-1"); err != nil {
		t.Errorf("token of the first start rejected after restart: %v", err)
	}
	if err := os.Chmod(filepath.Join(dir, SigningKeyFileName), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateZoneTokens(dir, nil); !errors.Is(err, ErrInsecureFile) {
		t.Errorf("world-readable key: error = %v, want ErrInsecureFile", err)
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.key")
	if err := os.WriteFile(bad, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateSigningKey(bad); err == nil || !strings.Contains(err.Error(), "PEM") {
		t.Errorf("garbage key file: error = %v", err)
	}
}

func TestGeneratedServerTLS(t *testing.T) {
	dir := t.TempDir()
	clock := &fakeClock{now: time.Now()}
	first, err := LoadOrCreateServerTLS(ServerTLSConfig{DataDir: dir, Clock: clock, Hostnames: []string{"kds.example", "10.1.2.3"}})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Generated {
		t.Error("first start did not generate")
	}
	leaf := first.Config.Certificates[0].Leaf
	if !contains(leaf.DNSNames, "localhost") || !contains(leaf.DNSNames, "kds.example") || len(leaf.IPAddresses) != 3 {
		t.Errorf("SANs: dns %v ip %v", leaf.DNSNames, leaf.IPAddresses)
	}
	second, err := LoadOrCreateServerTLS(ServerTLSConfig{DataDir: dir, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if second.Generated || !second.Config.Certificates[0].Leaf.Equal(leaf) {
		t.Error("second start did not reuse the generated certificate")
	}
	clock.Add(DefaultCertValidity - 10*24*time.Hour)
	third, err := LoadOrCreateServerTLS(ServerTLSConfig{DataDir: dir, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if !third.Generated {
		t.Error("certificate near expiry was not renewed")
	}

	// A zone trusting the generated file completes a handshake; one
	// trusting nothing fails; skip-verify succeeds.
	for _, tc := range []struct {
		name string
		cfg  ClientTLSConfig
		ok   bool
	}{
		{"ca file", ClientTLSConfig{CAFile: third.CertFile, ServerName: "localhost"}, true},
		{"ca file, ip", ClientTLSConfig{CAFile: third.CertFile, ServerName: "127.0.0.1"}, true},
		{"stale ca file", ClientTLSConfig{CAFile: writeTemp(t, first), ServerName: "localhost"}, false},
		{"skip verify", ClientTLSConfig{SkipVerify: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := ClientTLS(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			cc.Time = clock.Now // the renewed certificate is valid in fake time
			err = handshake(third.Config, cc)
			if (err == nil) != tc.ok {
				t.Errorf("handshake error = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestServerTLSGivenFiles(t *testing.T) {
	gen, err := LoadOrCreateServerTLS(ServerTLSConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(filepath.Dir(gen.CertFile), GeneratedKeyFileName)
	given, err := LoadOrCreateServerTLS(ServerTLSConfig{CertFile: gen.CertFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	if given.Generated || given.CertFile != gen.CertFile {
		t.Errorf("given files: %+v", given)
	}
	if _, err := LoadOrCreateServerTLS(ServerTLSConfig{CertFile: gen.CertFile}); err == nil {
		t.Error("certificate without key accepted")
	}
	if _, err := LoadOrCreateServerTLS(ServerTLSConfig{CertFile: gen.CertFile, KeyFile: "/nonexistent"}); err == nil {
		t.Error("missing key file accepted")
	}
	if _, err := ClientTLS(ClientTLSConfig{CAFile: "/nonexistent"}); err == nil {
		t.Error("missing CA file accepted")
	}
	if _, err := ClientTLS(ClientTLSConfig{CAFile: gen.CertFile, SkipVerify: true}); err == nil {
		t.Error("CA file with skip-verify accepted")
	}
}

func writeTemp(t *testing.T, s *ServerTLS) string {
	// s.CertFile was overwritten by the renewal; write the old one from memory.
	p := filepath.Join(t.TempDir(), "old.crt")
	if err := os.WriteFile(p, pemCert(s.Config.Certificates[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// handshake runs a TLS handshake over loopback TCP (kernel buffers, unlike
// net.Pipe, let a failing side write its alert without a reader).
func handshake(server, client *tls.Config) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		s := tls.Server(conn, server)
		errc <- s.Handshake()
		_ = s.Close()
	}()
	conn, err := net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	c := tls.Client(conn, client)
	err = c.Handshake()
	_ = c.Close()
	<-errc
	return err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func pemCert(c tls.Certificate) []byte {
	return pemEncode("CERTIFICATE", c.Certificate[0])
}
