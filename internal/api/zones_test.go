package api_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

// fakeIssuer records what it was asked to issue.
type fakeIssuer struct{ zone, validFor string }

func (f *fakeIssuer) IssueToken(zone string, validFor time.Duration) (string, auth.Claims, error) {
	f.zone, f.validFor = zone, validFor.String()
	return "token-for-" + zone, auth.Claims{Zone: zone, ID: "id-1", ExpiresAt: time.Now().Add(validFor).Unix()}, nil
}

type fakeZones struct{ statuses []kds.ZoneStatus }

func (f fakeZones) Statuses() []kds.ZoneStatus { return f.statuses }
func (f fakeZones) PolicyStatuses(string, string, string) []kds.ZonePolicyStatus {
	return nil
}
func (f fakeZones) RejectedBy(resource.Key) []kds.ZoneRejection { return nil }

func (f fakeZones) RejectedIn(string) []kds.RejectedResource { return nil }
func (f fakeZones) Status(zone string) (kds.ZoneStatus, bool) {
	for _, s := range f.statuses {
		if s.Zone == zone {
			return s, true
		}
	}
	return kds.ZoneStatus{}, false
}

func newGlobal(t *testing.T, issuer *fakeIssuer, zones fakeZones) *fixture {
	t.Helper()
	store, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	h, err := api.New(api.Config{Registry: resource.NewDefaultRegistry(), Store: store, Plane: testGlobal, Tokens: issuer, Zones: zones, LocalhostIsAdmin: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{t: t, srv: srv, store: store}
}

func TestZoneTokenEndpoint(t *testing.T) {
	issuer := &fakeIssuer{}
	f := newGlobal(t, issuer, fakeZones{})
	tests := []struct {
		body   string
		status int
		field  string
	}{
		{`{"zone":"zone-1","validFor":"1h"}`, 200, ""},
		{`{"zone":"zone-1"}`, 200, ""},
		{`{"zone":"Zone_1","validFor":"1h"}`, 400, "zone"},
		{`{"zone":"zone-1","validFor":"forever"}`, 400, "validFor"},
		{`{"zone":"zone-1","validFor":"-1h"}`, 400, "validFor"},
		{`{"zone":"zone-1","valid":"1h"}`, 400, ""},
		{`not json`, 400, ""},
	}
	for _, tc := range tests {
		r := f.do("POST", "/tokens/zone", tc.body)
		if r.status != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.body, r.status, tc.status, r.body)
			continue
		}
		if tc.status == 200 && !strings.Contains(string(r.body), `"token":"token-for-zone-1"`) {
			t.Errorf("%s: body %s", tc.body, r.body)
		}
		if tc.field != "" && !strings.Contains(string(r.body), fmt.Sprintf(`"field":%q`, tc.field)) {
			t.Errorf("%s: error does not name %s: %s", tc.body, tc.field, r.body)
		}
	}
	if issuer.validFor != "24h0m0s" {
		t.Errorf("default validity = %s, want 24h", issuer.validFor)
	}
}

func TestZonesEndpoints(t *testing.T) {
	now := time.Now()
	f := newGlobal(t, &fakeIssuer{}, fakeZones{statuses: []kds.ZoneStatus{{Zone: "zone-1", Connected: true, ConnectTime: &now}}})
	r := f.mustDo("GET", "/zones", "", http.StatusOK)
	if !strings.Contains(string(r.body), `"total":1`) || !strings.Contains(string(r.body), `"name":"zone-1"`) || !strings.Contains(string(r.body), `"connected":true`) {
		t.Errorf("GET /zones: %s", r.body)
	}
	f.mustDo("GET", "/zones/zone-1/_overview", "", http.StatusOK)
	f.mustDo("GET", "/zones/zone-9/_overview", "", http.StatusNotFound)
}
