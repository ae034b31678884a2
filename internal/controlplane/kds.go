package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/policyview"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/kds"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// maxKDSMessageBytes leaves headroom over the sync's 1 MiB batch limit and
// the API's 4 MiB resource limit (a resource larger than a chunk travels
// alone). Zones authenticate before any message is read (sync.Server).
const maxKDSMessageBytes = 6 << 20

// newMetrics returns a process-local Prometheus registry (never the default
// global one) and its HTTP handler.
func newMetrics() (*prometheus.Registry, http.Handler) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// globalKDS is the global's sync endpoint: tokens, TLS, the gRPC server.
type globalKDS struct {
	server *kds.Server
	grpc   *grpc.Server
	ln     net.Listener
	tokens *auth.ZoneKeyRing
	access *zoneAccess
}

// startGlobalKDS starts the sync endpoint; ready, when set and failing,
// refuses new streams (a replica without its store). grpcStats observes the
// streams.
func startGlobalKDS(cfg Config, reg *resource.Registry, store storage.Store, metrics prometheus.Registerer, ready func() error,
	grpcStats stats.Handler) (*globalKDS, error) {
	tokens, err := auth.LoadZoneKeyRing(cfg.DataDir, nil)
	if err != nil {
		return nil, fmt.Errorf("zone token signing key: %w", err)
	}
	tlsMat, err := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile, DataDir: cfg.DataDir})
	if err != nil {
		return nil, fmt.Errorf("kds tls: %w", err)
	}
	access, err := newZoneAccess(context.Background(), tokens, store, cfg.Logger.Named("kds"))
	if err != nil {
		return nil, err
	}
	adm, err := admission.New(admission.Config{Registry: reg, Mode: admission.Global, SystemNamespace: cfg.SystemNamespace})
	if err != nil {
		return nil, err
	}
	srv, err := kds.NewServer(kds.ServerConfig{
		Store: store, Registry: reg, Authenticator: access, Admission: adm, Logger: cfg.Logger.Named("kds"),
		SoftwareVersion: cfg.Version, SystemNamespace: cfg.SystemNamespace, Metrics: metrics, Stream: cfg.SyncStream,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.KDSAddress)
	if err != nil {
		return nil, fmt.Errorf("kds address %s: %w", cfg.KDSAddress, err)
	}
	g := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsMat.Config)),
		grpc.StatsHandler(grpcStats),
		grpc.MaxRecvMsgSize(maxKDSMessageBytes),
		// Metadata (zone name and token) is all an unauthenticated peer
		// gets read.
		grpc.MaxHeaderListSize(64<<10),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if ready != nil {
				if err := ready(); err != nil {
					return status.Error(codes.Unavailable, err.Error())
				}
			}
			return handler(srv, ss)
		}),
	)
	syncv1.RegisterSyncServiceServer(g, srv)
	cfg.Logger.Info("kds listening", "address", ln.Addr().String(), "cert", tlsMat.CertFile, "generated_cert", tlsMat.Generated)
	access.attach(srv)
	return &globalKDS{server: srv, grpc: g, ln: ln, tokens: tokens, access: access}, nil
}

// serve blocks until the gRPC server stops.
func (k *globalKDS) serve() error {
	if err := k.grpc.Serve(k.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("kds server: %w", err)
	}
	return nil
}

// stop ends every stream, then the server, within timeout.
func (k *globalKDS) stop(timeout time.Duration) {
	k.server.Shutdown()
	done := make(chan struct{})
	go func() {
		k.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		k.grpc.Stop()
	}
}

// newZoneClient builds the zone's connection to the global, observed by
// grpcStats.
func newZoneClient(cfg Config, reg *resource.Registry, store storage.Store, metrics prometheus.Registerer,
	reports kds.StatusReporter, grpcStats stats.Handler) (*kds.Client, error) {
	if cfg.ZoneTokenFile == "" {
		return nil, errors.New("--zone-token-file is required with --global-address (issue one with meridianctl generate zone-token)")
	}
	if _, err := readToken(cfg.ZoneTokenFile); err != nil {
		return nil, err
	}
	tlsCfg, err := auth.ClientTLS(auth.ClientTLSConfig{CAFile: cfg.KDSCAFile, SkipVerify: cfg.KDSSkipVerify})
	if err != nil {
		return nil, err
	}
	if cfg.KDSSkipVerify {
		cfg.Logger.Warn("not verifying the global's KDS certificate (--kds-skip-verify)")
	}
	adm, err := admission.New(admission.Config{Registry: reg, Mode: admission.Zone, Zone: cfg.Zone,
		Environment: cfg.Environment, SystemNamespace: cfg.SystemNamespace, Federated: true})
	if err != nil {
		return nil, err
	}
	target, targets := globalTargets(cfg.GlobalAddress)
	return kds.NewClient(kds.ClientConfig{
		Store: store, Registry: reg, Zone: cfg.Zone, Environment: cfg.Environment, SystemNamespace: cfg.SystemNamespace,
		Admission:     adm,
		Token:         func() (string, error) { return readToken(cfg.ZoneTokenFile) },
		Target:        target,
		Targets:       targets,
		StatusReports: reports,
		DialOptions: []grpc.DialOption{
			// gRPC's own transport reconnect backoff (up to 120 s by default)
			// would sit under the sync client's 5 s cap. It is kept at 1 s:
			// the sync client waits for the connection to come back (see
			// Client.pause), so the zone notices a returning global within
			// about a second; a dial a second to a down global is cheap.
			grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 5 * time.Second, Backoff: backoff.Config{
				BaseDelay: kds.DefaultReconnectBackoff, Multiplier: 1.6, Jitter: 0.2,
				MaxDelay: time.Second}}),
			grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
			grpc.WithStatsHandler(grpcStats),
			grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name), grpc.MaxCallRecvMsgSize(maxKDSMessageBytes)),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		},
		SoftwareVersion: cfg.Version, Logger: cfg.Logger.Named("kds"), Metrics: metrics, Stream: cfg.SyncStream,
	})
}

// readToken reads the zone token file, re-read before every connection so a
// rotated token is picked up.
func readToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("zone token file: %w", err)
	}
	if err := auth.CheckPrivateFile(path); err != nil {
		return "", fmt.Errorf("zone token file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("zone token file %s is empty", path)
	}
	return token, nil
}

// runBackground runs fn in the group, reporting a failure on failed.
func runBackground(ctx context.Context, wg interface{ Go(func()) }, failed chan<- error, fn func(context.Context) error) {
	wg.Go(func() {
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			select {
			case failed <- err:
			default:
			}
		}
	})
}

// viewReports adapts the zone's policy view to the sync client's status
// reporter: the statuses of the global's policies, as the global names them.
type viewReports struct{ v *policyview.View }

func (r viewReports) PolicyStatusReport() (*syncv1.PolicyStatusReport, <-chan struct{}) {
	list, changed := r.v.GlobalPolicyStatuses()
	if list == nil {
		return nil, changed
	}
	rep := &syncv1.PolicyStatusReport{Statuses: make([]*syncv1.PolicyStatus, 0, len(list))}
	for _, st := range list {
		ps := &syncv1.PolicyStatus{Key: &syncv1.ResourceKey{Type: st.Type, Mesh: st.Mesh, Name: st.Name}}
		for _, c := range st.Conditions {
			ps.Conditions = append(ps.Conditions, &syncv1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
		}
		rep.Statuses = append(rep.Statuses, ps)
	}
	return rep, changed
}

// globalTargets splits --global-address: one address (or a DNS name, whose
// records gRPC spreads over), or several comma-separated replicas.
func globalTargets(addr string) (string, []string) {
	var out []string
	for _, a := range strings.Split(addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) <= 1 {
		return strings.Join(out, ""), nil
	}
	return "", out
}
