// Package controlplane wires one control plane process: it opens the store,
// starts the components a global or a zone runs, serves the API and shuts
// everything down in order. It holds no rules of its own: each component
// lives in the package named for its job (docs/architecture.md). cmd/global
// and cmd/zone turn flags into a Config.
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
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/console"
	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/replica"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/revocation"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
	"github.com/meridian-mesh/meridian/internal/storage/kv"
	"github.com/meridian-mesh/meridian/internal/tuning"
)

// StoreFileName is the bbolt file inside the data dir.
const StoreFileName = "meridian.db"

// Config describes one control plane process.
type Config struct {
	// Plane is the process's identity (global or zone, zone name,
	// environment, system namespace), built once by the command.
	Plane plane.Plane
	// GlobalAddress is the global's KDS address; empty = standalone zone.
	// Several comma-separated addresses name global replicas (failover).
	GlobalAddress string
	DataDir       string
	// Store is "bolt" (default: the embedded file in DataDir) or "etcd"
	// (global only: replicas sharing Etcd).
	Store      string
	Etcd       replica.EtcdConfig
	APIAddress string
	// DebugAddress, when set, serves net/http/pprof (loopback only).
	DebugAddress string
	Version      string
	Logger       hclog.Logger
	// TombstoneRetention bounds how long deletions are remembered for resume.
	TombstoneRetention time.Duration
	// ShutdownTimeout bounds graceful shutdown (within 5 s in all).
	ShutdownTimeout time.Duration
	// KDS (multizone sync). Global: KDSAddress, TLS files (self-signed into
	// the data dir when empty). Zone: GlobalAddress, token file, CA/skip.
	KDSAddress    string
	TLSCertFile   string
	TLSKeyFile    string
	ZoneTokenFile string
	KDSCAFile     string
	KDSSkipVerify bool
	// KDSConnLimits bound the global's KDS connections, in all and per
	// source IP; KDSConnectionTimeout bounds a connection's TLS and HTTP/2
	// setup (0: 10 s).
	KDSConnLimits        kds.ConnLimits
	KDSConnectionTimeout time.Duration
	// ZoneQuota bounds what each zone stores on the global.
	ZoneQuota kds.ZoneQuota
	// SyncStream tunes heartbeats and batching (zero = defaults).
	SyncStream kds.StreamConfig
	// LocalhostIsAdmin: loopback API callers without a token are admin.
	LocalhostIsAdmin bool
	// AllowedHosts: the API's host names beside loopback IPs and localhost
	// (DNS rebinding protection).
	AllowedHosts []string
	// APITLS serves the API over HTTPS with TLSCertFile/TLSKeyFile (or the
	// certificate generated into the data dir).
	APITLS bool
	// APIReadTimeout bounds how long a request (headers and body) may take
	// to arrive; 0 means 60 s.
	APIReadTimeout time.Duration
	// Listening, when set, receives the API's bound address once serving (for
	// tests that listen on port 0).
	Listening func(apiAddr string)
	// The zone's data plane (docs/dataplane.md): the xDS and agent
	// address, its TLS files (generated into the data dir when empty),
	// and how long an agent's Dataplane outlives the agent.
	XDSAddress     string
	XDSTLSCertFile string
	XDSTLSKeyFile  string
	DataplaneGrace time.Duration
}

func (c *Config) check() error {
	if c.Logger == nil {
		return errors.New("logger is required")
	}
	if err := c.Plane.Check(); err != nil {
		return err
	}
	if c.Plane.Federated != (c.Plane.IsZone() && c.GlobalAddress != "") {
		return errors.New("a plane is federated exactly when it is a zone with --global-address")
	}
	if c.DataDir == "" {
		return errors.New("--data-dir is required")
	}
	if c.APIAddress == "" {
		return errors.New("--api-address is required")
	}
	if c.Plane.IsGlobal() && c.KDSAddress == "" {
		return errors.New("--kds-address is required")
	}
	switch c.Store {
	case "", "bolt":
		c.Store = "bolt"
	case "etcd":
		if !c.Plane.IsGlobal() {
			return errors.New("--store etcd is for the global control plane (a zone keeps its own embedded store)")
		}
	default:
		return fmt.Errorf("--store must be bolt or etcd, got %q", c.Store)
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 4 * time.Second
	}
	if c.APIReadTimeout <= 0 {
		c.APIReadTimeout = 60 * time.Second
	}
	if c.KDSConnectionTimeout <= 0 {
		c.KDSConnectionTimeout = 10 * time.Second
	}
	if hb := c.SyncStream; hb.HeartbeatInterval != 0 && hb.HeartbeatTimeout != 0 && hb.HeartbeatTimeout <= hb.HeartbeatInterval {
		return fmt.Errorf("--kds-heartbeat-timeout (%s) must be more than --kds-heartbeat-interval (%s)", hb.HeartbeatTimeout, hb.HeartbeatInterval)
	}
	return nil
}

// process is what every control plane runs: its store, registry, metrics,
// the API's configuration being assembled, and the background components
// that stop before the store closes.
type process struct {
	cfg     Config
	store   storage.Store
	rep     *replica.Replica // global replicas on etcd; nil otherwise
	reg     *resource.Registry
	metrics *prometheus.Registry
	trimmer *tuning.MemoryTrimmer
	feed    *console.Feed
	api     api.Config

	background sync.WaitGroup
	failed     chan error
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
	p := &process{cfg: cfg, reg: resource.NewDefaultRegistry(), feed: console.NewFeed(), failed: make(chan error, 1)}
	var metricsHandler http.Handler
	p.metrics, metricsHandler = newMetrics()
	err := p.openStore(ctx)
	defer p.closeStore()
	if err != nil {
		return err
	}
	if err := ensureDefaultMesh(ctx, cfg, p.store); err != nil {
		return err
	}
	// Background components stop before the store closes (deferred earlier).
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		p.background.Wait()
	}()
	users, err := p.userTokens(ctx)
	if err != nil {
		return err
	}
	p.api = api.Config{
		Registry: p.reg, Store: p.store, Logger: cfg.Logger.Named("api"), Plane: cfg.Plane, Version: cfg.Version,
		Metrics: metricsHandler, Users: users, LocalhostIsAdmin: cfg.LocalhostIsAdmin, AllowedHosts: cfg.AllowedHosts,
	}
	p.trimmer = tuning.NewMemoryTrimmer(tuning.MapReleaser(ctx, p.store, cfg.Logger))
	p.run(ctx, p.trimmer.Run)
	if cfg.Plane.IsGlobal() {
		stop, err := p.startGlobal(ctx)
		if err != nil {
			return err
		}
		defer stop()
	} else if err := p.startZone(ctx); err != nil {
		return err
	}

	p.api.Console = func(s *api.Server) (http.Handler, error) {
		return console.New(console.Config{API: s, Plane: cfg.Plane, Registry: p.reg, Changes: p.feed, Logger: cfg.Logger.Named("console")})
	}
	p.run(ctx, func(ctx context.Context) error { return p.feed.WatchStore(ctx, p.store, cfg.Logger) })
	handler, err := api.New(p.api)
	if err != nil {
		return err
	}
	ln, err := listenAPI(cfg)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, ln, p.trimmer.WakeOn(handler), p.failed)
}

// run runs fn in the background group; a failure ends the process.
func (p *process) run(ctx context.Context, fn func(context.Context) error) {
	p.background.Go(func() {
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			select {
			case p.failed <- err:
			default:
			}
		}
	})
}

// openStore opens the embedded store, or with --store etcd the replica's
// link to etcd and its store (then the key material every replica shares).
func (p *process) openStore(ctx context.Context) error {
	cfg := p.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	if cfg.Store == "etcd" {
		rep, err := replica.Open(ctx, replica.Config{Etcd: cfg.Etcd, APIAddress: cfg.APIAddress,
			TombstoneRetention: cfg.TombstoneRetention, Logger: cfg.Logger, SecretTypes: p.reg.SecretTypes()})
		if err != nil {
			return err
		}
		p.rep, p.store = rep, rep.Store()
		return rep.ShareSecrets(ctx, cfg.DataDir, func() error { return createGlobalSecrets(cfg) })
	}
	commits, err := boltstore.NewCommitMetrics(p.metrics)
	if err != nil {
		return fmt.Errorf("store metrics: %w", err)
	}
	key, err := auth.LoadOrCreateSecretsKey(filepath.Join(cfg.DataDir, auth.SecretsKeyFileName))
	if err != nil {
		return fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	sealer, err := kv.NewSealer(key, p.reg.SecretTypes()...)
	if err != nil {
		return err
	}
	store, err := boltstore.Open(boltstore.Config{
		Path:               filepath.Join(cfg.DataDir, StoreFileName),
		Logger:             cfg.Logger.Named("store"),
		Commits:            commits,
		Sealer:             sealer,
		TombstoneRetention: cfg.TombstoneRetention,
		ExpiryInterval:     expiryInterval(cfg.TombstoneRetention),
	})
	if err != nil {
		return fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	p.store = store
	return nil
}

func (p *process) closeStore() {
	if p.rep != nil {
		p.rep.Close()
		return
	}
	if p.store == nil {
		return
	}
	if err := p.store.Close(); err != nil {
		p.cfg.Logger.Error("closing store", "error", err)
	}
}

// newMetrics returns a process-local Prometheus registry (never the default
// global one) and its HTTP handler.
func newMetrics() (*prometheus.Registry, http.Handler) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// userTokens loads the API's user token key and writes the admin token on
// first start; it warns when loopback callers are trusted on an API that is
// reachable from elsewhere.
func (p *process) userTokens(ctx context.Context) (*revocation.UserTokens, error) {
	cfg := p.cfg
	users, err := auth.LoadOrCreateUserTokens(cfg.DataDir, nil)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	path, written, err := users.EnsureAdminToken(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", cfg.DataDir, err)
	}
	if written != nil {
		cfg.Logger.Info("admin user token written", "file", path, "id", written.ID,
			"expires", time.Unix(written.ExpiresAt, 0).UTC())
	}
	revCfg := revocation.Config{Store: p.store, MetaKey: revocation.MetaUserTokens, Remember: auth.MaxValidity}
	if p.rep != nil {
		revCfg.Lock = func(ctx context.Context) (func(), error) { return p.rep.Lock(ctx, "revocations-lock/") }
	}
	revoked, err := revocation.Open(ctx, revCfg)
	if err != nil {
		return nil, err
	}
	if p.rep != nil {
		p.run(ctx, func(ctx context.Context) error { return revoked.Follow(ctx, revocationPoll) })
	}
	if cfg.LocalhostIsAdmin && !loopbackOnly(cfg.APIAddress) {
		cfg.Logger.Warn("--api-localhost-is-admin is on and the API listens beyond loopback: any process on this "+
			"machine (or a proxy forwarding to it) is admin without a token; turn it off in production",
			"api", cfg.APIAddress)
	}
	return revocation.NewUserTokens(users, revoked), nil
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
func ensureDefaultMesh(ctx context.Context, cfg Config, store storage.Store) error {
	if cfg.Plane.Federated {
		return nil
	}
	key := resource.Key{Type: "Mesh", Name: "default"}
	if _, err := store.Get(ctx, key); !errors.Is(err, storage.ErrNotFound) {
		return err
	}
	labels := resource.LabelsOf(resource.LabelOrigin, cfg.Plane.Origin())
	if cfg.Plane.IsZone() {
		labels.Set(resource.LabelZone, cfg.Plane.Zone)
	}
	_, err := store.Create(ctx, &resource.Resource{Type: "Mesh", Name: "default", Labels: labels, Spec: []byte("{}")})
	if err != nil && !errors.Is(err, storage.ErrAlreadyExists) {
		return fmt.Errorf("create default mesh: %w", err)
	}
	return nil
}

// listenAPI binds the API's address, with TLS when asked.
func listenAPI(cfg Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", cfg.APIAddress)
	if err != nil {
		return nil, fmt.Errorf("api address %s: %w", cfg.APIAddress, err)
	}
	if !cfg.APITLS {
		return ln, nil
	}
	mat, err := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{CertFile: cfg.TLSCertFile, KeyFile: cfg.TLSKeyFile, DataDir: cfg.DataDir})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("api tls: %w", err)
	}
	tlsCfg := mat.Config.Clone()
	tlsCfg.NextProtos = []string{"h2", "http/1.1"}
	cfg.Logger.Info("api serves https", "cert", mat.CertFile, "generated_cert", mat.Generated)
	return tls.NewListener(ln, tlsCfg), nil
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
	cfg.Logger.Info("control plane started", "mode", cfg.Plane.Mode, "zone", cfg.Plane.Zone, "api", ln.Addr().String(), "data_dir", cfg.DataDir)
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
