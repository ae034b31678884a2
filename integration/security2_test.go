package integration

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// TestAccessWithdrawnDuringHandshake: a rogue zone opens its stream with a
// valid token and holds its handshake back; meanwhile its token is revoked
// (or its Zone disabled). Its handshake must then be refused: the stream
// was authenticated before the withdrawal but is registered after it.
func TestAccessWithdrawnDuringHandshake(t *testing.T) {
	kds := freeAddress(t)
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	for _, tc := range []struct {
		name, zone string
		withdraw   func(id string)
	}{
		{"token revoked", "rogue-a", func(id string) {
			if status, body := g.request("DELETE", "/tokens/zone/"+id, ""); status != 200 {
				t.Fatalf("revoke: %d %s", status, body)
			}
		}},
		{"zone disabled", "rogue-b", func(string) {
			if status, body := g.request("PUT", "/zones/rogue-b", `{"type":"Zone","name":"rogue-b","enabled":false}`); status/100 != 2 {
				t.Fatalf("disable: %d %s", status, body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "token")
			id := zoneTokenWithID(t, g, tc.zone, file)
			token := readTokenFile(t, file)
			stream, done := kdsDial(t, g, kds, tc.zone, token)
			defer done()
			// The global reads the stream's metadata when it opens; give it
			// time to authenticate before the access is withdrawn.
			time.Sleep(500 * time.Millisecond)
			tc.withdraw(id)
			time.Sleep(200 * time.Millisecond)
			_ = stream.Send(&syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: &syncv1.Handshake{
				Zone: tc.zone, ZoneToken: token, Environment: syncv1.Environment_ENVIRONMENT_UNIVERSAL}}}})
			resp, err := stream.Recv()
			if err == nil && resp.GetMessage().GetHandshakeResponse().GetAccepted() {
				t.Fatalf("handshake accepted after the access was withdrawn")
			}
			if err == nil {
				if _, err = stream.Recv(); err == nil {
					t.Fatal("stream still open after a refused handshake")
				}
			}
			if !strings.Contains(err.Error(), "Unauthenticated") {
				t.Errorf("stream ended with %v, want Unauthenticated", err)
			}
			if zoneConnected(t, g, tc.zone) {
				t.Errorf("%s shows as connected", tc.zone)
			}
		})
	}
}
