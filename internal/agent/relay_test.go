package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// fakeZone answers each ADS request with a response naming its type, and
// refuses the node "refused"; done is closed when a stream's context
// ends.
type fakeZone struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	ended chan struct{}
}

func (z *fakeZone) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	defer func() { z.ended <- struct{}{} }()
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if req.GetNode().GetId() == "refused" {
			return status.Error(codes.PermissionDenied, "not your node")
		}
		resp := &discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), VersionInfo: "v1"}
		if req.GetTypeUrl() == "type/big" {
			// More than gRPC's default 4 MiB for one message.
			resp.Nonce = strings.Repeat("x", 5<<20)
		}
		if err := s.Send(resp); err != nil {
			return nil
		}
	}
}

// TestRelayCarriesStreams: a workload's ADS stream through the agent's
// relay reaches the zone over the agent's connection and back (a response
// over 4 MiB too); the zone's
// refusal reaches the workload with its code; the workload leaving ends
// the zone's stream.
func TestRelayCarriesStreams(t *testing.T) {
	zoneLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	zone := &fakeZone{ended: make(chan struct{}, 4)}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, zone)
	go func() { _ = gs.Serve(zoneLn) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(zoneLn.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	dir := t.TempDir()
	a := &Agent{cfg: Config{Dir: dir}, conn: conn}
	relay, err := (&Joined{agent: a}).ServeRelay()
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	// The workload takes large responses, as Envoy does.
	wl, err := grpc.NewClient("unix://"+filepath.Join(dir, RelaySocket), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(wl)

	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"type/a", "type/big", "type/b"} {
		if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || resp.GetTypeUrl() != typ {
			t.Fatalf("response %v, %v; want one for %s", resp, err, typ)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the workload closed its side: %v, want EOF", err)
	}
	waitEnded(t, zone)

	refused, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = refused.Send(&discoveryv3.DiscoveryRequest{Node: nodeWithID("refused")})
	if _, err := refused.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the zone's refusal reached the workload as %v", err)
	}
	waitEnded(t, zone)

	leaving, cancelLeaving := context.WithCancel(ctx)
	s, err := ads.StreamAggregatedResources(leaving)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "type/a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	cancelLeaving()
	waitEnded(t, zone)
}

func waitEnded(t *testing.T, z *fakeZone) {
	t.Helper()
	select {
	case <-z.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the zone's stream did not end")
	}
}

func nodeWithID(id string) *corev3.Node { return &corev3.Node{Id: id} }
