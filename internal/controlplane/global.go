package controlplane

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/meshca"
	"github.com/meridian-mesh/meridian/internal/replica"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/zoneaccess"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// maxKDSMessageBytes leaves headroom over the sync's 1 MiB batch limit and
// the API's 4 MiB resource limit (a resource larger than a chunk travels
// alone). Zones authenticate before any message is read (kds.Server).
const maxKDSMessageBytes = 6 << 20

// kdsIdleConnection: a KDS connection without a stream this long is closed
// (a zone's stream never leaves its connection idle).
const kdsIdleConnection = 30 * time.Second

// revocationPoll is how often a global replica rereads the revoked zone
// tokens other replicas may have written.
const revocationPoll = 2 * time.Second

// startGlobal starts the KDS endpoint, zone access and, on etcd, the
// replica's health, election and shared state; it points the API at them.
// The returned stop ends the KDS server (before the store closes).
func (p *process) startGlobal(ctx context.Context) (stop func(), err error) {
	cfg := p.cfg
	ring, err := auth.LoadZoneKeyRing(cfg.DataDir, nil)
	if err != nil {
		return nil, fmt.Errorf("zone token signing key: %w", err)
	}
	accessCfg := zoneaccess.Config{Ring: ring, Store: p.store, Logger: cfg.Logger.Named("kds")}
	if p.rep != nil {
		accessCfg.Lock = func(ctx context.Context) (func(), error) { return p.rep.Lock(ctx, "revocations-lock/") }
		accessCfg.KeysChanged = func() error { return p.rep.PublishSecrets(cfg.DataDir) }
		accessCfg.Poll = revocationPoll
	}
	access, err := zoneaccess.New(ctx, accessCfg)
	if err != nil {
		return nil, err
	}
	srv, gs, ln, err := p.newKDSServer(access)
	if err != nil {
		return nil, err
	}
	access.Attach(srv)
	p.api.Zones, p.api.Tokens, p.api.ZoneTokenAdmin = srv, ring, access
	p.run(ctx, func(ctx context.Context) error { return p.feed.WatchSignal(ctx, srv.StatusChanged) })
	p.run(ctx, func(context.Context) error { return serveKDS(gs, ln) })
	p.run(ctx, access.WatchZones)
	meshCA, err := meshca.NewGlobal(meshca.Config{Store: p.store, Logger: cfg.Logger.Named("meshca"), Rand: rand.Reader})
	if err != nil {
		return nil, err
	}
	if p.rep != nil {
		p.startReplica(ctx, srv, access)
		// One replica signs at a time: the leader.
		p.run(ctx, func(ctx context.Context) error { return p.rep.Lead(ctx, meshCA.Run) })
	} else {
		p.run(ctx, meshCA.Run)
	}
	return func() { stopKDS(srv, gs, cfg.ShutdownTimeout/2) }, nil
}

// newKDSServer builds the KDS server (TLS, limits, readiness) and binds
// its address.
func (p *process) newKDSServer(access *zoneaccess.Access) (*kds.Server, *grpc.Server, net.Listener, error) {
	cfg := p.cfg
	tlsMat, err := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile, DataDir: cfg.DataDir})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kds tls: %w", err)
	}
	adm, err := admission.New(admission.Config{Registry: p.reg, Plane: cfg.Plane})
	if err != nil {
		return nil, nil, nil, err
	}
	srv, err := kds.NewServer(kds.ServerConfig{
		Store: p.store, Registry: p.reg, Authenticator: access, Admission: adm, Logger: cfg.Logger.Named("kds"),
		SoftwareVersion: cfg.Version, Plane: cfg.Plane, Metrics: p.metrics, Stream: cfg.SyncStream, ZoneQuota: cfg.ZoneQuota,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	ln, err := net.Listen("tcp", cfg.KDSAddress)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kds address %s: %w", cfg.KDSAddress, err)
	}
	ln = cfg.KDSConnLimits.Listen(ln)
	var ready func() error
	if p.rep != nil {
		ready = p.rep.Ready
	}
	gs := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsMat.Config)),
		grpc.StatsHandler(p.trimmer.GRPCStats()),
		grpc.MaxRecvMsgSize(maxKDSMessageBytes),
		// Metadata (zone name and token) is all an unauthenticated peer
		// gets read.
		grpc.MaxHeaderListSize(64<<10),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// A connection that has not finished its TLS and HTTP/2 setup in
		// time, or that holds no stream, is closed: strangers do not keep
		// sockets (gRPC's own setup timeout is 120 s).
		grpc.ConnectionTimeout(cfg.KDSConnectionTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: kdsIdleConnection}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if ready != nil {
				if err := ready(); err != nil {
					return status.Error(codes.Unavailable, err.Error())
				}
			}
			return handler(srv, ss)
		}),
	)
	syncv1.RegisterSyncServiceServer(gs, srv)
	cfg.Logger.Info("kds listening", "address", ln.Addr().String(), "cert", tlsMat.CertFile, "generated_cert", tlsMat.Generated)
	return srv, gs, ln, nil
}

// startReplica wires a global replica's health into the API and KDS and
// runs its monitor, election and the state it shares with other replicas.
func (p *process) startReplica(ctx context.Context, srv *kds.Server, access *zoneaccess.Access) {
	cfg, rep := p.cfg, p.rep
	p.run(ctx, func(ctx context.Context) error { return rep.WatchSecrets(ctx, cfg.DataDir, access.KeysReloaded) })
	rep.WhenLost(func() {
		n := srv.EndStreams(func(kds.StreamInfo) bool { return true }, replica.ErrStoreLost)
		cfg.Logger.Warn("ended zone streams", "count", n)
	})
	p.api.Ready, p.api.StoreReady = rep.Ready, rep.Ready
	p.api.Zones = rep.Zones(srv)
	p.run(ctx, rep.Monitor)
	p.run(ctx, func(ctx context.Context) error { return rep.PublishZones(ctx, srv) })
	p.run(ctx, func(ctx context.Context) error { return rep.WatchZones(ctx, p.feed.Notify) })
	interval := expiryInterval(cfg.TombstoneRetention)
	if interval == 0 {
		interval = boltstore.DefaultExpiryInterval
	}
	p.run(ctx, func(ctx context.Context) error {
		return rep.Lead(ctx, func(ctx context.Context) error { return rep.Store().RunExpiry(ctx, interval) })
	})
}

// serveKDS blocks until the gRPC server stops.
func serveKDS(gs *grpc.Server, ln net.Listener) error {
	if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("kds server: %w", err)
	}
	return nil
}

// stopKDS ends every stream, then the server, within timeout.
func stopKDS(srv *kds.Server, gs *grpc.Server, timeout time.Duration) {
	srv.Shutdown()
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		gs.Stop()
	}
}
