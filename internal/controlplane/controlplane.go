// Package controlplane runs one control plane process: it opens the store,
// serves the API and shuts everything down in order. cmd/global and cmd/zone
// are thin wrappers that turn flags into a Config.
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/policyview"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/kds"
)

// StoreFileName is the bbolt file inside the data dir.
const StoreFileName = "meridian.db"

// Config describes one control plane process.
type Config struct {
	Mode            api.Mode
	Zone            string // zone mode
	Environment     string // zone mode: kubernetes | universal
	SystemNamespace string
	// GlobalAddress is the global's KDS address; empty = standalone zone.
	// Several comma-separated addresses name global replicas (failover).
	GlobalAddress string
	DataDir       string
	// Store is "bolt" (default: the embedded file in DataDir) or "etcd"
	// (global only: replicas sharing Etcd).
	Store      string
	Etcd       EtcdConfig
	APIAddress string
	// DebugAddress, when set, serves net/http/pprof (loopback only).
	DebugAddress string
	Version      string
	Logger       hclog.Logger
	// TombstoneRetention bounds how long deletions are remembered for resume.
	TombstoneRetention time.Duration
	// ShutdownTimeout bounds graceful shutdown (SPEC: within 5 s).
	ShutdownTimeout time.Duration
	// KDS (multizone sync). Global: KDSAddress, TLS files (self-signed into
	// the data dir when empty). Zone: GlobalAddress, token file, CA/skip.
	KDSAddress    string
	TLSCertFile   string
	TLSKeyFile    string
	ZoneTokenFile string
	KDSCAFile     string
	KDSSkipVerify bool
	// SyncStream tunes heartbeats and batching (zero = defaults).
	SyncStream kds.StreamConfig
	// LocalhostIsAdmin: loopback API callers without a token are admin.
	LocalhostIsAdmin bool
	// APITLS serves the API over HTTPS with TLSCertFile/TLSKeyFile (or the
	// certificate generated into the data dir).
	APITLS bool
	// APIReadTimeout bounds how long a request (headers and body) may take
	// to arrive; 0 means 60 s.
	APIReadTimeout time.Duration
	// Listening, when set, receives the API's bound address once serving (for
	// tests that listen on port 0).
	Listening func(apiAddr string)
}

func (c *Config) check() error {
	if c.Logger == nil {
		return errors.New("logger is required")
	}
	if c.DataDir == "" {
		return errors.New("--data-dir is required")
	}
	if c.APIAddress == "" {
		return errors.New("--api-address is required")
	}
	if c.Mode == api.ModeGlobal && c.KDSAddress == "" {
		return errors.New("--kds-address is required")
	}
	if c.Mode == api.ModeZone {
		if c.Zone == "" {
			return errors.New("--zone is required")
		}
		if c.Environment != "kubernetes" && c.Environment != "universal" {
			return fmt.Errorf("--environment must be kubernetes or universal, got %q", c.Environment)
		}
	}
	switch c.Store {
	case "", "bolt":
		c.Store = "bolt"
	case "etcd":
		if c.Mode != api.ModeGlobal {
			return errors.New("--store etcd is for the global control plane (a zone keeps its own embedded store)")
		}
	default:
		return fmt.Errorf("--store must be bolt or etcd, got %q", c.Store)
	}
	if c.SystemNamespace == "" {
		c.SystemNamespace = resource.DefaultSystemNamespace
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 4 * time.Second
	}
	if c.APIReadTimeout <= 0 {
		c.APIReadTimeout = 60 * time.Second
	}
	if hb := c.SyncStream; hb.HeartbeatInterval != 0 && hb.HeartbeatTimeout != 0 && hb.HeartbeatTimeout <= hb.HeartbeatInterval {
		return fmt.Errorf("--kds-heartbeat-timeout (%s) must be more than --kds-heartbeat-interval (%s)", hb.HeartbeatTimeout, hb.HeartbeatInterval)
	}
	return nil
}

// Run starts the control plane and blocks until ctx ends (graceful shutdown)
// or a component fails. Startup errors are returned as one readable line.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if err := serveDebug(ctx, cfg); err != nil {
		return err
	}
	metrics, metricsHandler := newMetrics()
	store, rep, err := openStore(ctx, cfg, metrics)
	if err != nil {
		return err
	}
	defer func() {
		if rep != nil {
			rep.close()
		} else if err := store.Close(); err != nil {
			cfg.Logger.Error("closing store", "error", err)
		}
	}()
	if rep != nil {
		if err := rep.shareSecrets(ctx, cfg.DataDir, func() error { return createGlobalSecrets(cfg) }); err != nil {
			return err
		}
	}
	reg := resource.NewDefaultRegistry()
	if err := ensureDefaultMesh(ctx, cfg, reg, store); err != nil {
		return err
	}
	users, err := userTokens(cfg)
	if err != nil {
		return err
	}
	apiCfg := api.Config{
		Registry: reg, Store: store, Logger: cfg.Logger.Named("api"), Mode: cfg.Mode,
		Zone: cfg.Zone, Environment: cfg.Environment, SystemNamespace: cfg.SystemNamespace, Version: cfg.Version,
		Metrics: metricsHandler, Users: users, LocalhostIsAdmin: cfg.LocalhostIsAdmin,
		Federated: cfg.Mode == api.ModeZone && cfg.GlobalAddress != "",
	}
	// Background components stop before the store closes (deferred earlier).
	ctx, cancel := context.WithCancel(ctx)
	var background sync.WaitGroup
	defer func() {
		cancel()
		background.Wait()
	}()
	failed := make(chan error, 1)
	trimmer := newMemoryTrimmer(mapReleaser(ctx, store, cfg.Logger))
	runBackground(ctx, &background, failed, trimmer.run)
	feed := newChangeFeed() // the console's live updates
	if cfg.Mode == api.ModeGlobal {
		var ready func() error
		if rep != nil {
			ready = rep.ready
		}
		endpoint, err := startGlobalKDS(cfg, reg, store, metrics, ready, trimmer.grpcStats())
		if err != nil {
			return err
		}
		defer endpoint.stop(cfg.ShutdownTimeout / 2)
		if rep != nil {
			startReplica(ctx, cfg, rep, endpoint, &apiCfg, &background, failed)
			runBackground(ctx, &background, failed, func(ctx context.Context) error { return rep.watchZones(ctx, feed.notify) })
		}
		apiCfg.Zones, apiCfg.Tokens, apiCfg.ZoneTokenAdmin = endpoint.server, endpoint.tokens, endpoint.access
		if rep != nil {
			apiCfg.Zones = replicaZones{Server: endpoint.server, rep: rep}
		}
		runBackground(ctx, &background, failed, func(ctx context.Context) error { return feed.watchSignal(ctx, endpoint.server.StatusChanged) })
		runBackground(ctx, &background, failed, func(context.Context) error { return endpoint.serve() })
		runBackground(ctx, &background, failed, endpoint.access.watchZones)
	} else if err := startZone(ctx, cfg, reg, store, metrics, trimmer.grpcStats(), &apiCfg, &background, failed); err != nil {
		return err
	}
	apiCfg.Console = consoleFactory(cfg, reg, feed)
	runBackground(ctx, &background, failed, func(ctx context.Context) error { return feed.watchStore(ctx, store, cfg.Logger) })
	handler, err := api.New(apiCfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.APIAddress)
	if err != nil {
		return fmt.Errorf("api address %s: %w", cfg.APIAddress, err)
	}
	if cfg.APITLS {
		mat, err := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile, DataDir: cfg.DataDir})
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("api tls: %w", err)
		}
		tlsCfg := mat.Config.Clone()
		tlsCfg.NextProtos = []string{"h2", "http/1.1"}
		ln = tls.NewListener(ln, tlsCfg)
		cfg.Logger.Info("api serves https", "cert", mat.CertFile, "generated_cert", mat.Generated)
	}
	return serve(ctx, cfg, ln, trimmer.wakeOn(handler), failed)
}

// userTokens loads the API's user token key and writes the admin token on
// first start; it warns when loopback callers are trusted on an API that is
// reachable from elsewhere.
func userTokens(cfg Config) (*auth.UserTokens, error) {
	users, err := auth.LoadOrCreateUserTokens(cfg.DataDir, nil)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	path, created, err := users.EnsureAdminToken(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	if created {
		cfg.Logger.Info("admin user token written", "file", path)
	}
	if cfg.LocalhostIsAdmin && !loopbackOnly(cfg.APIAddress) {
		cfg.Logger.Warn("--api-localhost-is-admin is on and the API listens beyond loopback: any process on this "+
			"machine (or a proxy forwarding to it) is admin without a token; turn it off in production",
			"api", cfg.APIAddress)
	}
	return users, nil
}

// loopbackOnly reports whether addr (HOST:PORT) binds only loopback.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// startZone starts the zone's policy view and, with a global address, its
// sync client (observed by grpcStats), and points the API at them.
func startZone(ctx context.Context, cfg Config, reg *resource.Registry, store storage.Store, metrics prometheus.Registerer,
	grpcStats stats.Handler, apiCfg *api.Config, background *sync.WaitGroup, failed chan<- error) error {
	view, err := policyview.New(policyview.Config{Registry: reg, Store: store, Zone: cfg.Zone,
		SystemNamespace: cfg.SystemNamespace, Logger: cfg.Logger.Named("policy")})
	if err != nil {
		return err
	}
	apiCfg.Snapshots = view
	runBackground(ctx, background, failed, view.Run)
	if cfg.GlobalAddress == "" {
		return nil
	}
	client, err := newZoneClient(cfg, reg, store, metrics, viewReports{view}, grpcStats)
	if err != nil {
		return err
	}
	runBackground(ctx, background, failed, view.RunStatusReports)
	apiCfg.SyncStatus = func() any { return client.Status() }
	apiCfg.Rejections = client
	runBackground(ctx, background, failed, client.Run)
	return nil
}

// openStore opens the embedded store, or with --store etcd the replica's
// link to etcd (rep) and its store.
func openStore(ctx context.Context, cfg Config, metrics prometheus.Registerer) (storage.Store, *replica, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	if cfg.Store == "etcd" {
		rep, err := openReplica(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return rep.store, rep, nil
	}
	commits, err := newStoreCommitMetrics(metrics)
	if err != nil {
		return nil, nil, fmt.Errorf("store metrics: %w", err)
	}
	store, err := boltstore.Open(boltstore.Config{
		Path:               filepath.Join(cfg.DataDir, StoreFileName),
		Logger:             cfg.Logger.Named("store"),
		Commits:            commits,
		TombstoneRetention: cfg.TombstoneRetention,
		ExpiryInterval:     expiryInterval(cfg.TombstoneRetention),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	return store, nil, nil
}

// createGlobalSecrets creates what a global keeps in its data dir (zone
// token keys, user token key and admin token, the generated KDS
// certificate), as a single global does at its first start; with etcd the
// first replica runs it and shares the result.
func createGlobalSecrets(cfg Config) error {
	if _, err := auth.LoadZoneKeyRing(cfg.DataDir, nil); err != nil {
		return fmt.Errorf("zone token signing key: %w", err)
	}
	users, err := auth.LoadOrCreateUserTokens(cfg.DataDir, nil)
	if err != nil {
		return err
	}
	if _, _, err := users.EnsureAdminToken(cfg.DataDir); err != nil {
		return err
	}
	if cfg.TLSCertFile == "" {
		if _, err := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{DataDir: cfg.DataDir}); err != nil {
			return fmt.Errorf("kds tls: %w", err)
		}
	}
	return nil
}

// startReplica wires a global replica's health into the API and KDS and
// runs its monitor and election.
func startReplica(ctx context.Context, cfg Config, rep *replica, endpoint *globalKDS, apiCfg *api.Config,
	background *sync.WaitGroup, failed chan<- error) {
	endpoint.access.lock = func(ctx context.Context) (func(), error) { return rep.lock(ctx, "revocations-lock/") }
	endpoint.access.keysChanged = func() error { return rep.publishSecrets(cfg.DataDir) }
	runBackground(ctx, background, failed, func(ctx context.Context) error {
		return rep.watchSecrets(ctx, cfg.DataDir, endpoint.access.keysReloaded)
	})
	rep.whenLost(func() {
		n := endpoint.server.EndStreams(func(kds.StreamInfo) bool { return true }, errStoreLost)
		cfg.Logger.Warn("ended zone streams", "count", n)
	})
	apiCfg.Ready, apiCfg.StoreReady = rep.ready, rep.ready
	runBackground(ctx, background, failed, rep.monitor)
	runBackground(ctx, background, failed, func(ctx context.Context) error { return rep.publishZones(ctx, endpoint.server) })
	interval := expiryInterval(cfg.TombstoneRetention)
	if interval == 0 {
		interval = boltstore.DefaultExpiryInterval
	}
	runBackground(ctx, background, failed, func(ctx context.Context) error {
		return rep.lead(ctx, func(ctx context.Context) error { return rep.store.RunExpiry(ctx, interval) })
	})
}

// expiryInterval runs the tombstone expiry pass often enough for a short
// retention (tests, small installs) to be honoured within a quarter of it,
// and at most once a second.
func expiryInterval(retention time.Duration) time.Duration {
	if retention <= 0 {
		return 0 // the store's default
	}
	return min(boltstore.DefaultExpiryInterval, max(retention/4, time.Second))
}

// ensureDefaultMesh creates mesh "default" on the global and on a standalone
// zone, as Kuma does, so that a fresh install accepts policies at once. A zone
// connected to a global gets its meshes from the global instead.
func ensureDefaultMesh(ctx context.Context, cfg Config, reg *resource.Registry, store storage.Store) error {
	if cfg.Mode == api.ModeZone && cfg.GlobalAddress != "" {
		return nil
	}
	key := resource.Key{Type: "Mesh", Name: "default"}
	if _, err := store.Get(ctx, key); !errors.Is(err, storage.ErrNotFound) {
		return err
	}
	labels := resource.LabelsOf(resource.LabelOrigin, resource.OriginGlobal)
	if cfg.Mode == api.ModeZone {
		labels = resource.LabelsOf(resource.LabelOrigin, resource.OriginZone, resource.LabelZone, cfg.Zone)
	}
	_, err := store.Create(ctx, &resource.Resource{Type: "Mesh", Name: "default", Labels: labels, Spec: []byte("{}")})
	if err != nil && !errors.Is(err, storage.ErrAlreadyExists) {
		return fmt.Errorf("create default mesh: %w", err)
	}
	return nil
}

// serve runs the API until ctx ends or a background component fails.
func serve(ctx context.Context, cfg Config, ln net.Listener, handler http.Handler, failed <-chan error) error {
	// A client that trickles its request is cut after APIReadTimeout; the
	// write timeout bounds a client that does not read its response, and
	// idle keep-alive connections are closed after two minutes.
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: min(10*time.Second, cfg.APIReadTimeout),
		ReadTimeout: cfg.APIReadTimeout, WriteTimeout: cfg.APIReadTimeout + 2*time.Minute, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: cfg.Logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	cfg.Logger.Info("control plane started", "mode", cfg.Mode, "zone", cfg.Zone, "api", ln.Addr().String(), "data_dir", cfg.DataDir)
	if cfg.Listening != nil {
		cfg.Listening(ln.Addr().String())
	}
	var runErr error
	select {
	case err := <-errc:
		return fmt.Errorf("api server: %w", err)
	case runErr = <-failed:
		cfg.Logger.Error("component failed", "error", runErr)
	case <-ctx.Done():
	}
	cfg.Logger.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		cfg.Logger.Warn("api server did not drain in time", "error", err)
		_ = srv.Close()
	}
	return runErr
}
