package kds

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// Defaults of the client's reconnect backoff.
const (
	DefaultReconnectBackoff    = 250 * time.Millisecond
	DefaultMaxReconnectBackoff = 5 * time.Second
)

// ClientConfig configures a zone's connection to the global.
type ClientConfig struct {
	// Store is the zone's store; Registry its types. Required.
	Store    Store
	Registry *resource.Registry
	// Plane is this zone (its name is an RFC 1123 label). Required.
	Plane plane.Plane
	// Token returns the zone token; it is called before every connection
	// attempt, so a rotated token file is picked up. Required.
	Token func() (string, error)
	// Target is the global's KDS address in gRPC syntax (host:port); a
	// DNS name with several records is spread by gRPC itself.
	Target string
	// Targets, when set instead, are the addresses of several global
	// replicas. The client stays with one while its stream works and moves
	// to the next after a failure (a replica that died, or one that lost
	// its store and ends streams), so a zone fails over within a reconnect;
	// the replicas share one store, so the zone resumes where it was.
	Targets []string
	// DialOptions carry the transport credentials (TLS) and anything else
	// the wiring needs (gzip, keepalive, a bufconn dialer in tests).
	// Required: at least the credentials.
	DialOptions []grpc.DialOption
	// StatusReports, when set, gives the report of the global's policies'
	// statuses this zone sends (if the global supports it).
	StatusReports StatusReporter
	// Admission checks every batch from the global inside its write
	// transaction (GlobalAdmission). Required: without it the global could
	// overwrite the zone's own resources.
	Admission GlobalAdmission
	// SoftwareVersion and Features are sent in the handshake.
	SoftwareVersion string
	Features        []string
	// Logger defaults to a null logger; Clock to the wall clock.
	Logger hclog.Logger
	Clock  Clock
	// Stream tunes heartbeats, batching and backoffs.
	Stream StreamConfig
	// ReconnectBackoff is the first delay before redialing after a failure;
	// it doubles per consecutive failure up to MaxReconnectBackoff, with
	// ±20% jitter. A stream that got through its handshake resets it.
	ReconnectBackoff    time.Duration
	MaxReconnectBackoff time.Duration
	// Metrics, when set, receives the sync metrics.
	Metrics prometheus.Registerer
}

// Client is a zone's sync client. Run it in one goroutine; Status may be
// called from any.
type Client struct {
	cfg     ClientConfig
	log     hclog.Logger
	metrics *Metrics

	// mu guards st (the flows of a session write into it too).
	mu sync.Mutex
	st ClientStatus

	// rejected: this zone's resources the global rejected, with why.
	rejected rejections
}

// NewClient checks cfg and returns the client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	stream, err := cfg.Stream.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	cfg.Stream = stream
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.ReconnectBackoff == 0 {
		cfg.ReconnectBackoff = DefaultReconnectBackoff
	}
	if cfg.MaxReconnectBackoff == 0 {
		cfg.MaxReconnectBackoff = DefaultMaxReconnectBackoff
	}
	var m *Metrics
	if cfg.Metrics != nil {
		if m, err = NewMetrics(cfg.Metrics); err != nil {
			return nil, err
		}
	}
	return &Client{cfg: cfg, log: cfg.Logger.With("zone", cfg.Plane.Zone), metrics: m,
		st: ClientStatus{Zone: cfg.Plane.Zone}}, nil
}

func (c *ClientConfig) check() error {
	switch {
	case c.Store == nil:
		return errors.New("Store is required")
	case c.Registry == nil:
		return errors.New("Registry is required")
	case c.Admission == nil:
		return errors.New("Admission is required (it keeps the global from overwriting the zone's own resources)")
	case c.Token == nil:
		return errors.New("Token is required")
	case c.Target == "" && len(c.Targets) == 0:
		return errors.New("Target is required")
	case c.Target != "" && len(c.Targets) > 0:
		return errors.New("set Target or Targets, not both")
	case len(c.DialOptions) == 0:
		return errors.New("DialOptions are required (at least transport credentials)")
	case !c.Plane.IsZone():
		return errors.New("Plane must be a zone")
	case c.ReconnectBackoff < 0 || c.MaxReconnectBackoff < 0:
		return errors.New("reconnect backoffs must not be negative")
	case c.MaxReconnectBackoff != 0 && c.MaxReconnectBackoff < c.ReconnectBackoff:
		return errors.New("MaxReconnectBackoff is below ReconnectBackoff")
	}
	if err := c.Plane.Check(); err != nil {
		return err
	}
	return checkZoneName(c.Plane.Zone)
}

// Status returns a copy of the connection state.
func (c *Client) Status() ClientStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.clone()
}

// Run connects to the global and keeps syncing, reconnecting with
// exponential backoff and jitter after any failure, until ctx ends; it then
// returns nil. It returns an error only when the connection cannot be set up
// at all (a dial option the gRPC client refuses).
func (c *Client) Run(ctx context.Context) error {
	targets := c.cfg.Targets
	if len(targets) == 0 {
		targets = []string{c.cfg.Target}
	}
	conns := make([]*grpc.ClientConn, len(targets))
	for i, t := range targets {
		conn, err := grpc.NewClient(t, c.cfg.DialOptions...)
		if err != nil {
			return fmt.Errorf("sync client for %s: %w", t, err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	cur, failures := 0, 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			c.metrics.reconnected(c.cfg.Plane.Zone)
			c.update(func(st *ClientStatus) { st.Reconnects++ })
		}
		c.update(func(st *ClientStatus) { st.Global = targets[cur] })
		established, err := c.connectOnce(ctx, syncv1.NewSyncServiceClient(conns[cur]))
		if ctx.Err() != nil {
			c.disconnected(nil)
			return nil
		}
		c.disconnected(err)
		if established {
			failures = 0
		}
		failures++
		from := targets[cur]
		cur = (cur + 1) % len(targets)
		delay := reconnectDelay(c.cfg.ReconnectBackoff, c.cfg.MaxReconnectBackoff, failures)
		c.log.Warn("sync stream failed, reconnecting", "global", from, "error", err, "next", targets[cur], "in", delay)
		if !c.pause(ctx, conns[cur], delay) {
			return nil
		}
	}
}

// pause waits d before the next attempt, or less: when the connection to
// the global was down and comes back (READY) meanwhile, the zone retries at
// once instead of sleeping out its backoff — a zone whose global was away
// for a while is back within a dial of the global's return, not up to a
// whole backoff later. A failure on a working connection (a refused
// handshake) always waits the full d, so it cannot spin. It reports false
// when ctx ended.
func (c *Client) pause(ctx context.Context, conn *grpc.ClientConn, d time.Duration) bool {
	if conn.GetState() == connectivity.Ready {
		return c.sleep(ctx, d)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := c.cfg.Clock.NewTimer(d)
	defer t.Stop()
	go func() {
		select {
		case <-t.C():
			cancel()
		case <-waitCtx.Done():
		}
	}()
	conn.Connect()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			return ctx.Err() == nil
		}
		if !conn.WaitForStateChange(waitCtx, state) {
			return ctx.Err() == nil
		}
	}
}

// reconnectDelay: the first attempt after a stream that worked goes at once
// (a short jitter spreads a fleet of zones after a global restart); then
// base doubles per consecutive failure up to maxDelay, with jitter.
func reconnectDelay(base, maxDelay time.Duration, failures int) time.Duration {
	if failures <= 1 {
		return time.Duration(rand.Int64N(int64(100*time.Millisecond) + 1))
	}
	return backoff(base, maxDelay, failures-1)
}

func (c *Client) sleep(ctx context.Context, d time.Duration) bool {
	t := c.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// connectOnce opens one stream, handshakes and runs the session until it
// fails. established reports that the global accepted the handshake.
func (c *Client) connectOnce(ctx context.Context, rpc syncv1.SyncServiceClient) (established bool, err error) {
	token, err := c.cfg.Token()
	if err != nil {
		return false, fmt.Errorf("read zone token: %w", err)
	}
	resume, err := readRevision(ctx, c.cfg.Store, MetaKeyGlobalRevision)
	if err != nil {
		return false, err
	}
	resumeStore, err := readStoreID(ctx, c.cfg.Store, MetaKeyGlobalStoreID)
	if err != nil {
		return false, err
	}
	// Cancelling sctx ends the stream, which unblocks its Recv and Send.
	// It outlives ctx by the session's drain: when ctx ends, the session
	// finishes what it sent (DrainTimeout at most) before the stream goes.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopEarly := context.AfterFunc(ctx, cancel) // until the session runs
	sctx = metadata.AppendToOutgoingContext(sctx, MetadataZone, c.cfg.Plane.Zone, MetadataAuthorization, "Bearer "+token)
	stream, err := rpc.Stream(sctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	ws := newWire(stream, func(m *syncv1.Message) *syncv1.StreamRequest { return &syncv1.StreamRequest{Message: m} })
	resp, err := c.handshake(sctx, ws, token, resume, resumeStore)
	if err != nil {
		return false, err
	}
	if gs := resp.GetStoreId(); gs != "" && resumeStore != "" && gs != resumeStore {
		// The global's store was replaced: our resume point counts another
		// store's revisions (the global sends a full snapshot).
		c.log.Warn("the global's store was replaced: receiving a full snapshot", "known_store", resumeStore,
			"global_store", gs, "dropped_resume_revision", resume)
		resume = 0
	}
	if !stopEarly() {
		return true, ctx.Err()
	}
	return true, c.runSession(sctx, ws, resp, resume, ctx.Done())
}

func (c *Client) handshake(ctx context.Context, ws wireStream, token string, resume uint64, resumeStore string) (*syncv1.HandshakeResponse, error) {
	hs := &syncv1.Handshake{Zone: c.cfg.Plane.Zone, ZoneToken: token, SoftwareVersion: c.cfg.SoftwareVersion,
		Features: c.features(), Environment: envToWire(c.cfg.Plane.Environment),
		SystemNamespace: c.cfg.Plane.SystemNamespace, ResumeRevision: resume,
		StoreId: c.cfg.Store.ID(), ResumeStoreId: resumeStore}
	if err := ws.Send(&syncv1.Message{Kind: &syncv1.Message_Handshake{Handshake: hs}}); err != nil {
		return nil, fmt.Errorf("send handshake: %w", err)
	}
	m, err := recvFirst(ctx, ws, c.cfg.Clock, c.cfg.Stream.HandshakeTimeout)
	if status.Code(err) == codes.Unauthenticated {
		return nil, fmt.Errorf("%w: the global refused zone %s: %s", ErrRefused, c.cfg.Plane.Zone, status.Convert(err).Message())
	}
	if err != nil {
		return nil, fmt.Errorf("receive handshake response: %w", err)
	}
	resp := m.GetHandshakeResponse()
	switch {
	case resp == nil:
		return nil, fmt.Errorf("%w: first message is %T, not a handshake response", errProtocol, m.GetKind())
	case !resp.GetAccepted():
		return nil, fmt.Errorf("%w: the global refused zone %s: %s", ErrRefused, c.cfg.Plane.Zone, resp.GetError())
	}
	return resp, nil
}

// ErrRefused is wrapped by the error a refused handshake ends with.
var ErrRefused = errors.New("handshake refused")

func (c *Client) runSession(ctx context.Context, ws wireStream, resp *syncv1.HandshakeResponse, resume uint64, drain <-chan struct{}) error {
	now := c.cfg.Clock.Now()
	c.update(func(st *ClientStatus) {
		st.Connected, st.ConnectTime, st.LastHeartbeat = true, timePtr(now), timePtr(now)
		st.GlobalSoftwareVersion = resp.GetSoftwareVersion()
		st.GlobalToZone.RevisionAcked = resume
		st.ZoneToGlobal.RevisionAcked = resp.GetResumeRevision()
	})
	c.metrics.connected(c.cfg.Plane.Zone, true)
	c.log.Info("connected to the global", "global_version", resp.GetSoftwareVersion(),
		"global_resume_revision", resume, "zone_resume_revision", resp.GetResumeRevision())
	z2g := &flow{mu: &c.mu, st: &c.st.ZoneToGlobal, clock: c.cfg.Clock, m: c.metrics.flow(DirectionZoneToGlobal, c.cfg.Plane.Zone)}
	g2z := &flow{mu: &c.mu, st: &c.st.GlobalToZone, clock: c.cfg.Clock, m: c.metrics.flow(DirectionGlobalToZone, c.cfg.Plane.Zone)}
	p := sessionParams{
		log: c.log, clock: c.cfg.Clock, stream: ws, cfg: c.cfg.Stream, store: c.cfg.Store,
		src: zoneSource{reg: c.cfg.Registry, zone: c.cfg.Plane.Zone}, sendLog: c.log.Named("to-global"), sent: z2g,
		rej:  &c.rejected,
		sink: zoneSink{reg: c.cfg.Registry, store: c.cfg.Store, zone: c.cfg.Plane}, recvLog: c.log.Named("from-global"),
		received: g2z, metaKey: MetaKeyGlobalRevision, storeKey: MetaKeyGlobalStoreID,
		peerStore: resp.GetStoreId(), applied: resume,
		onHeartbeat: func() {
			t := c.cfg.Clock.Now()
			c.update(func(st *ClientStatus) { st.LastHeartbeat = timePtr(t) })
		},
		drain: drain,
	}
	p.checkBatch = c.cfg.Admission.FromGlobal
	p.streamSnapshots = true
	if c.cfg.StatusReports != nil && slices.Contains(resp.GetFeatures(), FeaturePolicyStatus) {
		p.reporter = c.cfg.StatusReports
	}
	sess := newSession(p)
	return sess.run(ctx, resp.GetResumeRevision())
}

// features are the handshake's features: the configured ones, plus policy
// status reports when there is a reporter.
func (c *Client) features() []string {
	f := slices.Clone(c.cfg.Features)
	if c.cfg.StatusReports != nil && !slices.Contains(f, FeaturePolicyStatus) {
		f = append(f, FeaturePolicyStatus)
	}
	return f
}

func (c *Client) update(fn func(*ClientStatus)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(&c.st)
}

func (c *Client) disconnected(err error) {
	now := c.cfg.Clock.Now()
	c.update(func(st *ClientStatus) {
		if st.Connected {
			st.Connected, st.DisconnectTime = false, timePtr(now)
		}
		if err != nil {
			st.LastError, st.LastErrorTime = err.Error(), timePtr(now)
		}
	})
	c.metrics.connected(c.cfg.Plane.Zone, false)
}
