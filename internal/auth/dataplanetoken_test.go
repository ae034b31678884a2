package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"
)

func newDataplaneTokens(t testing.TB, clock Clock) *DataplaneTokens {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := NewDataplaneTokens(key, clock)
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}

func TestDataplaneTokenRequestErrorsNameTheField(t *testing.T) {
	tokens := newDataplaneTokens(t, &fakeClock{now: time.Unix(1_700_000_000, 0)})
	many := map[string]string{}
	for i := range maxDataplaneTokenTags + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		req   DataplaneTokenRequest
		field string
	}{
		{DataplaneTokenRequest{Name: "web-1", ValidFor: time.Hour}, "mesh:"},
		{DataplaneTokenRequest{Mesh: "m", ValidFor: time.Hour}, "name:"},
		{DataplaneTokenRequest{Mesh: "m", Name: "web\n1", ValidFor: time.Hour}, "name:"},
		{DataplaneTokenRequest{Mesh: "m", Name: "web-1", Namespace: strings.Repeat("n", maxUserTokenField+1), ValidFor: time.Hour}, "namespace:"},
		{DataplaneTokenRequest{Mesh: "m", Name: "web-1"}, "validFor:"},
		{DataplaneTokenRequest{Mesh: "m", Name: "web-1", ValidFor: MaxValidity + time.Hour}, "validFor:"},
		{DataplaneTokenRequest{Mesh: "m", Tags: many, ValidFor: time.Hour}, "tags:"},
		{DataplaneTokenRequest{Mesh: "m", Tags: map[string]string{"app": ""}, ValidFor: time.Hour}, "tags:"},
	} {
		_, _, err := tokens.Issue(tc.req)
		if !errors.Is(err, ErrInvalidDataplaneTokenRequest) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want an invalid request naming %s", tc.req, err, tc.field)
		}
	}
}

func TestDataplaneTokenVerify(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	tokens := newDataplaneTokens(t, clock)
	token, claims, err := tokens.Issue(DataplaneTokenRequest{Mesh: "m", Name: "web-1", Namespace: "ns", ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tokens.Verify(token)
	if err != nil {
		t.Fatal(err)
	}
	if got.Mesh != "m" || got.Name != "web-1" || got.Namespace != "ns" || got.ID != claims.ID || got.ID == "" {
		t.Fatalf("claims = %+v", got)
	}
	if _, err := newDataplaneTokens(t, clock).Verify(token); !errors.Is(err, ErrDataplaneTokenBadSignature) {
		t.Errorf("another zone's token: %v", err)
	}
	tampered := []byte(token)
	tampered[len(tampered)/3] ^= 1
	if _, err := tokens.Verify(string(tampered)); err == nil {
		t.Error("a tampered token verified")
	}
	if _, err := tokens.Verify("not a token"); !errors.Is(err, ErrDataplaneTokenMalformed) {
		t.Errorf("garbage: %v", err)
	}
	// A user token of the same key is not a dataplane token.
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	same, _ := NewDataplaneTokens(key, clock)
	users, err := NewUserTokens(key, clock)
	if err != nil {
		t.Fatal(err)
	}
	userToken, _, err := users.Issue(UserTokenRequest{Name: "alice", Groups: []string{"mesh-system:admin"}, ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := same.Verify(userToken); err == nil {
		t.Error("a user token verified as a dataplane token")
	}
	clock.Add(time.Hour)
	if _, err := tokens.Verify(token); !errors.Is(err, ErrDataplaneTokenExpired) {
		t.Errorf("expired: %v", err)
	}
	if strings.Contains(func() string { _, err := tokens.Verify(token); return err.Error() }(), token) {
		t.Error("the error quotes the token")
	}
}

func TestDataplaneClaimsAdmits(t *testing.T) {
	byName := DataplaneClaims{Mesh: "m", Name: "web-1", Namespace: "ns"}
	byTags := DataplaneClaims{Mesh: "m", Tags: map[string]string{"kuma.io/service": "web"}}
	web := []map[string]string{{"kuma.io/service": "web", "version": "v1"}}
	for _, tc := range []struct {
		name   string
		claims DataplaneClaims
		mesh   string
		ns     string
		dp     string
		tags   []map[string]string
		reason string // substring; "" admits
	}{
		{"its Dataplane", byName, "m", "ns", "web-1", web, ""},
		{"another Dataplane", byName, "m", "ns", "backend-1", web, `Dataplane "web-1"`},
		{"another mesh", byName, "other", "ns", "web-1", web, `mesh "m"`},
		{"another namespace", byName, "m", "other", "web-1", web, `namespace "ns"`},
		{"tags on every inbound", byTags, "m", "", "web-7", web, ""},
		{"a tag missing", byTags, "m", "", "web-7", []map[string]string{{"kuma.io/service": "backend"}}, "kuma.io/service=web"},
		{"one inbound without the tag", byTags, "m", "", "web-7", append(web, map[string]string{"kuma.io/service": "admin"}), "every inbound"},
		{"no inbound", byTags, "m", "", "web-7", nil, "no inbound"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.claims.Admits(tc.mesh, tc.ns, tc.dp, tc.tags)
			if (tc.reason == "") != (got == "") || !strings.Contains(got, tc.reason) {
				t.Errorf("Admits = %q, want %q", got, tc.reason)
			}
		})
	}
}

// FuzzVerifyDataplaneToken: no input crashes Verify, and nothing but a
// token this key signed verifies.
func FuzzVerifyDataplaneToken(f *testing.F) {
	tokens := newDataplaneTokens(f, &fakeClock{now: time.Unix(1_700_000_000, 0)})
	token, _, err := tokens.Issue(DataplaneTokenRequest{Mesh: "m", Name: "web-1", ValidFor: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(token)
	f.Add("")
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := tokens.Verify(s)
		if err == nil && s != token && c.Name != "web-1" {
			t.Fatalf("a forged token verified: %+v", c)
		}
	})
}
