package kds

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// TestUnauthenticatedStreamNeverTouchesStatus: a stream without valid
// metadata is refused before any message is read, whatever it then sends
// (here a 2 MiB "handshake"), and the zone it names keeps its status.
func TestUnauthenticatedStreamNeverTouchesStatus(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	z := c.zone("zone-1", zoneOpts{}).start()
	defer z.close()
	eventually(t, wait, "zone-1 connected", func() bool { return z.client.Status().Connected })
	for name, token := range map[string]string{"no token": "", "garbage": "forged.token", "other zone": c.token("zone-2")} {
		stream, cancel := rawStream(t, c, "zone-1", token)
		big := strings.Repeat("x", 2<<20)
		_ = stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: &syncv1.Handshake{
			Zone: "zone-1", ZoneToken: big, SoftwareVersion: "attacker text"}}}})
		_, err := stream.Recv()
		cancel()
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	st, ok := c.server.Status("zone-1")
	if !ok || !st.Connected || st.LastError != "" || strings.Contains(st.SoftwareVersion, "attacker") {
		t.Errorf("zone-1's status changed by unauthenticated streams: %+v", st)
	}
}

// TestStreamEndsAtTokenExpiry: expiry is enforced on a live stream, not
// only at the handshake; the zone says why.
func TestStreamEndsAtTokenExpiry(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	token, err := c.tokens.Issue("zone-1", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	z := c.zone("zone-1", zoneOpts{token: token}).start()
	defer z.close()
	eventually(t, wait, "zone-1 connected", func() bool { return z.client.Status().Connected })
	eventually(t, 5*time.Second, "stream ended at expiry", func() bool {
		cs := z.client.Status()
		return !cs.Connected && strings.Contains(cs.LastError, "expired")
	})
}

// TestEndStreamsByTokenID: revocation ends the live stream of that token
// only.
func TestEndStreamsByTokenID(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	tok1, claims1, err := c.tokens.IssueToken("zone-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	z1 := c.zone("zone-1", zoneOpts{token: tok1}).start()
	defer z1.close()
	z2 := c.zone("zone-2", zoneOpts{}).start()
	defer z2.close()
	eventually(t, wait, "both connected", func() bool { return z1.client.Status().Connected && z2.client.Status().Connected })
	n := c.server.EndStreams(func(s StreamInfo) bool { return s.TokenID == claims1.ID }, ErrStreamRevoked)
	if n != 1 {
		t.Fatalf("ended %d streams, want 1", n)
	}
	eventually(t, wait, "zone-1 told why", func() bool { return strings.Contains(z1.client.Status().LastError, "revoked") })
	if !z2.client.Status().Connected {
		t.Error("zone-2 was disconnected too")
	}
}
