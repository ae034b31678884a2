package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// The workload's xDS relay (docs/dataplane.md#joining): the workload's
// xDS client (grpc-go's, or Envoy's) connects to the agent on a unix
// socket in its directory (0600, in a 0700 directory: only the
// workload's user can open it), and each of its ADS streams is relayed,
// message by message, as a stream of the agent's own connection to the
// zone. A proxy then holds one connection to its zone, not two: one TLS
// session, one HTTP/2 transport, and the zone identifies the relayed
// streams by the xDS client certificate that connection presents.

// RelaySocket is the relay's unix socket in the agent's directory.
const RelaySocket = "xds.sock"

func (a *Agent) relayPath() string { return filepath.Join(a.cfg.Dir, RelaySocket) }

// Relay serves the workload's xDS streams. Stop it with Close.
type Relay struct {
	srv *grpc.Server
}

// ServeRelay starts the relay on the unix socket in the agent's directory.
func (j *Joined) ServeRelay() (*Relay, error) {
	a := j.agent
	path := a.relayPath()
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, &Error{What: "cannot serve the xDS relay", Where: path, Err: err}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	r := &Relay{srv: grpc.NewServer()}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(r.srv, &adsRelay{a: a})
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Close stops the relay and its streams.
func (r *Relay) Close() { r.srv.Stop() }

// relayCallOptions: a relayed stream waits for the agent's connection
// (a zone restarting), and takes responses as large as the workload's own
// client would (a proxy with thousands of outbounds gets more than gRPC's
// default 4 MiB).
func relayCallOptions() []grpc.CallOption {
	return []grpc.CallOption{grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(maxRelayedResponse)}
}

// maxRelayedResponse bounds one relayed xDS response.
const maxRelayedResponse = 64 << 20

type adsRelay struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	a *Agent
}

func (r *adsRelay) upstream() discoveryv3.AggregatedDiscoveryServiceClient {
	conn, _ := r.a.current()
	return discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
}

func (r *adsRelay) StreamAggregatedResources(down discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	up, err := r.upstream().StreamAggregatedResources(ctx, relayCallOptions()...)
	if err != nil {
		return err
	}
	return pump(cancel, down, up)
}

func (r *adsRelay) DeltaAggregatedResources(down discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	up, err := r.upstream().DeltaAggregatedResources(ctx, relayCallOptions()...)
	if err != nil {
		return err
	}
	return pump(cancel, down, up)
}

// pump relays requests down → up and responses up → down until the
// zone's side ends. The zone's error (a refusal, a revoked token) reaches
// the workload as the zone gave it; the workload leaving cancels the
// upstream stream (its context is the workload stream's), and its closing
// its side closes the upstream side.
func pump[Req, Resp any](cancel context.CancelFunc,
	down interface {
		Recv() (*Req, error)
		Send(*Resp) error
	},
	up interface {
		Send(*Req) error
		Recv() (*Resp, error)
		CloseSend() error
	}) error {
	go func() {
		for {
			req, err := down.Recv()
			if errors.Is(err, io.EOF) {
				_ = up.CloseSend()
				return
			}
			if err != nil {
				cancel()
				return
			}
			if up.Send(req) != nil {
				return // the zone's side ended: its Recv says why
			}
		}
	}()
	for {
		resp, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := down.Send(resp); err != nil {
			return err
		}
	}
}
