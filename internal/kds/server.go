package kds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/plane"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// ZoneAuthenticator checks a zone's token: signature, validity window, zone
// binding, revocation, the zone's enabled flag. The error says why a token
// is refused; it is shown to the zone.
//
// Recheck says whether a credential Authenticate admitted still holds (not
// revoked since, the zone not disabled, its signing key not retired). The
// server calls it when it registers the stream, under the lock EndStreams
// takes, so a revocation made while the zone was still in its handshake
// either sees the registered stream or is seen by Recheck; and again on
// every heartbeat. It must be cheap and must not call back into the server.
type ZoneAuthenticator interface {
	Authenticate(zone, token string) (ZoneCredential, error)
	Recheck(zone string, cred ZoneCredential) error
}

// ZoneAdmission gives the in-transaction precondition of a batch a zone's
// stream applies on the global (internal/admission.Controller.FromZone): it
// may reject resources (admission.Rejected), which are then NACKed.
type ZoneAdmission interface {
	FromZone(zone string, quota *admission.Quota, puts []*resource.Resource, deletes []resource.Key) func(storage.TxReader) ([]resource.Key, error)
}

// GlobalAdmission gives the in-transaction precondition of a batch the
// global's stream applies on a zone (internal/admission.Controller.
// FromGlobal): it may reject resources (admission.Rejected), which are then
// NACKed. Being in the transaction, it cannot race the zone's own API
// writes (zoneSink still reads before the transaction for removals only,
// to skip those of keys the zone does not hold).
type GlobalAdmission interface {
	FromGlobal(puts []*resource.Resource, deletes []resource.Key) func(storage.TxReader) ([]resource.Key, error)
}

// ZoneCredential is what a verified zone token says. A stream lives at most
// until ExpiresAt, and ends when its token is revoked (EndStreams).
type ZoneCredential struct {
	TokenID   string
	KeyID     string // the signing key (rotation)
	ExpiresAt time.Time
	// KeyRetiresAt, when set, is when the signing key stops verifying (a
	// rotated-out key): the stream ends then too.
	KeyRetiresAt time.Time
}

// StreamInfo describes a live stream for EndStreams.
type StreamInfo struct {
	Zone, TokenID, KeyID string
}

// Metadata a zone sends when it opens a stream: its name and its token as
// "Bearer <token>". The server authenticates them before it reads any
// message, so an unauthenticated peer never makes it decode one.
const (
	MetadataZone          = "meridian-zone"
	MetadataAuthorization = "authorization"
)

// MaxHandshakeBytes bounds the handshake message.
const MaxHandshakeBytes = 64 << 10

// ErrStreamRevoked ends the streams of a revoked token or a disabled zone.
var ErrStreamRevoked = errors.New("zone access revoked")

// ServerConfig configures the global's sync server.
type ServerConfig struct {
	// Store is the global's store; Registry its types. Required.
	Store    Store
	Registry *resource.Registry
	// Authenticator verifies zone tokens. Required.
	Authenticator ZoneAuthenticator
	// Admission, when set, checks every batch from a zone inside its write
	// transaction; without it the sink's own checks (before the write) hold.
	Admission ZoneAdmission
	// Logger defaults to a null logger; Clock to the wall clock.
	Logger hclog.Logger
	Clock  Clock
	// SoftwareVersion is reported to zones.
	SoftwareVersion string
	// Plane is the global control plane; its system namespace is the one
	// rewritten references of zone policies get (docs/kds.md#names-labels-references).
	Plane plane.Plane
	// Features the global supports; the handshake answers the intersection
	// with the zone's.
	Features []string
	// Stream tunes heartbeats, batching and backoffs.
	Stream StreamConfig
	// ZoneQuota bounds what each zone stores on the global (zero fields:
	// no bound); it needs Admission.
	ZoneQuota ZoneQuota
	// Metrics, when set, receives the sync metrics (never the default
	// registry implicitly).
	Metrics prometheus.Registerer
}

// Server is the global's SyncService: one stream per connected zone. It is
// safe for concurrent use; register it with syncv1.RegisterSyncServiceServer
// on a gRPC server (TLS, gzip) and call Shutdown before GracefulStop.
type Server struct {
	syncv1.UnimplementedSyncServiceServer

	cfg     ServerConfig
	log     hclog.Logger
	metrics *Metrics
	tracker *tracker
	reports reports

	// mu guards active and closed: the cancel function of each zone's
	// current stream (a newer stream of the same zone replaces it).
	mu     sync.Mutex
	active map[string]*activeStream
	closed bool
	// copies are the zone copies every session shares (see zoneCopies).
	copies   *zoneCopies
	rejected map[string]*rejections // per zone: what it rejected
}

type activeStream struct {
	cancel context.CancelCauseFunc
	info   StreamInfo
	// drain is closed by Shutdown (the session ends gracefully); done by
	// unregister.
	drain chan struct{}
	done  chan struct{}
}

// Causes of a stream's end the server itself decides.
var (
	errReplaced     = errors.New("replaced by a newer stream of the same zone")
	errShutdown     = errors.New("global control plane shutting down")
	errTokenExpired = errors.New("the zone token expired: issue a new one (meridianctl generate zone-token) and update the zone's token file")
	errKeyRetired   = errors.New("the zone token's signing key was rotated out and has retired: issue a new token")
)

// NewServer checks cfg and returns the server.
func NewServer(cfg ServerConfig) (*Server, error) {
	switch {
	case cfg.Store == nil:
		return nil, fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	case cfg.Registry == nil:
		return nil, fmt.Errorf("%w: Registry is required", ErrInvalidConfig)
	case cfg.Authenticator == nil:
		return nil, fmt.Errorf("%w: Authenticator is required", ErrInvalidConfig)
	case !cfg.Plane.IsGlobal():
		return nil, fmt.Errorf("%w: Plane must be the global", ErrInvalidConfig)
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
	var m *Metrics
	if cfg.Metrics != nil {
		if m, err = NewMetrics(cfg.Metrics); err != nil {
			return nil, err
		}
	}
	return &Server{cfg: cfg, log: cfg.Logger, metrics: m, tracker: newTracker(cfg.Clock, m),
		active: map[string]*activeStream{}, copies: newZoneCopies()}, nil
}

// Statuses returns every zone that connected since the server started,
// sorted by name (GET /zones).
func (s *Server) Statuses() []ZoneStatus { return s.tracker.statuses() }

// StatusChanged returns a channel closed at the next zone connect or
// disconnect (take a new one after each).
func (s *Server) StatusChanged() <-chan struct{} { return s.tracker.changes() }

// Status returns one zone's status (GET /zones/{name}/_overview).
func (s *Server) Status(zone string) (ZoneStatus, bool) { return s.tracker.status(zone) }

// Shutdown refuses new streams and ends every stream, so that the gRPC
// server's GracefulStop does not wait for zones that never hang up. Each
// session first drains (sends what is pending and the stamp of its last
// complete revision, waits for the answers up to DrainTimeout), so that
// zones resume exactly where they were; Shutdown returns when every stream
// has ended.
func (s *Server) Shutdown() {
	s.mu.Lock()
	s.closed = true
	active := make([]*activeStream, 0, len(s.active))
	for _, a := range s.active {
		active = append(active, a)
		close(a.drain)
	}
	s.mu.Unlock()
	deadline := s.cfg.Clock.NewTimer(s.cfg.Stream.DrainTimeout + 500*time.Millisecond)
	defer deadline.Stop()
	for _, a := range active {
		select {
		case <-a.done:
		case <-deadline.C():
			// Past the deadline: end the rest at once. A handler stuck in a
			// Send to a zone that reads nothing is GracefulStop's to bound.
			for _, b := range active {
				b.cancel(errShutdown)
			}
			return
		}
	}
}

// Stream implements syncv1.SyncServiceServer: handshake, then the session
// until the zone goes away, a newer stream of the zone replaces this one,
// or Shutdown. Errors become gRPC statuses here and nowhere else.
func (s *Server) Stream(stream syncv1.SyncService_StreamServer) error {
	ctx := stream.Context()
	zone, cred, err := s.authenticate(ctx)
	if err != nil {
		// Never recorded in the zone's status: anyone can send this.
		s.metrics.handshakeUnauthenticated()
		s.log.Warn("zone stream refused before its handshake", "zone", zone, "peer", peerAddr(ctx), "error", err)
		return toStatus(err)
	}
	ws := newWire(stream, func(m *syncv1.Message) *syncv1.StreamResponse { return &syncv1.StreamResponse{Message: m} })
	hs, err := recvHandshake(ctx, ws, s.cfg.Clock, s.cfg.Stream.HandshakeTimeout)
	if err != nil {
		s.metrics.handshakeRefused()
		return toStatus(err)
	}
	z, err := s.admit(hs, zone)
	if err == nil {
		err = s.nameCollides(ctx, zone)
	}
	if err != nil {
		s.refuse(ws, zone, err)
		return toStatus(err)
	}
	log := s.log.With("zone", z.Zone)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a, err := s.register(StreamInfo{Zone: z.Zone, TokenID: cred.TokenID, KeyID: cred.KeyID}, cred, cancel)
	if err != nil {
		s.refuse(ws, zone, err)
		return toStatus(err)
	}
	defer s.unregister(z.Zone, a)
	stopExpiry := s.endAtExpiry(ctx, cred, cancel)
	defer stopExpiry()
	recheck := func() {
		if err := s.cfg.Authenticator.Recheck(z.Zone, cred); err != nil {
			cancel(fmt.Errorf("%w: %v", ErrStreamRevoked, err))
		}
	}
	err = s.serve(ctx, ws, hs, z, a.drain, recheck, log)
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		err = cause
	}
	if errors.Is(err, errDrained) {
		err = errShutdown
	}
	log.Info("zone stream ended", "reason", err)
	return toStatus(err)
}

// authenticate reads the zone and token from the stream's metadata.
func (s *Server) authenticate(ctx context.Context) (string, ZoneCredential, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	zone := first(md.Get(MetadataZone))
	if err := checkZoneName(zone); err != nil {
		return truncate(zone, 64), ZoneCredential{}, fmt.Errorf("%w: metadata %s: %v", errUnauthenticated, MetadataZone, err)
	}
	scheme, token, _ := strings.Cut(first(md.Get(MetadataAuthorization)), " ")
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return zone, ZoneCredential{}, fmt.Errorf("%w for zone %q: metadata %s must be \"Bearer <zone token>\"", errUnauthenticated, zone, MetadataAuthorization)
	}
	cred, err := s.cfg.Authenticator.Authenticate(zone, token)
	if err != nil {
		return zone, ZoneCredential{}, fmt.Errorf("%w for zone %q: %w", errUnauthenticated, zone, err)
	}
	return zone, cred, nil
}

// endAtExpiry ends the stream when its token expires or its signing key
// retires, whichever comes first.
func (s *Server) endAtExpiry(ctx context.Context, cred ZoneCredential, cancel context.CancelCauseFunc) func() {
	at, cause := cred.ExpiresAt, errTokenExpired
	if !cred.KeyRetiresAt.IsZero() && (at.IsZero() || cred.KeyRetiresAt.Before(at)) {
		at, cause = cred.KeyRetiresAt, errKeyRetired
	}
	if at.IsZero() {
		return func() {}
	}
	t := s.cfg.Clock.NewTimer(at.Sub(s.cfg.Clock.Now()))
	done := make(chan struct{})
	go func() {
		select {
		case <-t.C():
			cancel(cause)
		case <-done:
		case <-ctx.Done():
		}
	}()
	return func() { t.Stop(); close(done) }
}

// features the global supports: the configured ones and policy status
// reports.
func (s *Server) features() []string {
	f := slices.Clone(s.cfg.Features)
	if !slices.Contains(f, FeaturePolicyStatus) {
		f = append(f, FeaturePolicyStatus)
	}
	return f
}

// EndStreams ends every live stream for which match holds, with cause (a
// revoked token, a disabled zone, a retired key); it returns how many.
func (s *Server) EndStreams(match func(StreamInfo) bool, cause error) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.active {
		if match(a.info) {
			a.cancel(cause)
			n++
		}
	}
	return n
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// serve answers an admitted handshake and runs the session.
// recheck runs on every heartbeat the zone sends: a stream whose access
// was withdrawn in a way no EndStreams reached (another replica's change
// not yet reread) ends then.
func (s *Server) serve(ctx context.Context, ws wireStream, hs *syncv1.Handshake, z plane.Plane, drain <-chan struct{},
	recheck func(), log hclog.Logger) error {
	applied, err := readRevision(ctx, s.cfg.Store, MetaKeyZoneRevision(z.Zone))
	if err != nil {
		return err
	}
	knownStore, err := readStoreID(ctx, s.cfg.Store, MetaKeyZoneStoreID(z.Zone))
	if err != nil {
		return err
	}
	if zs := hs.GetStoreId(); zs != "" && knownStore != "" && zs != knownStore {
		// A wiped or replaced zone store: its revisions are not the ones
		// the resume point counts. Ask for a full snapshot, which replaces
		// every resource the zone sent before.
		log.Warn("the zone's store was replaced: asking it for a full snapshot", "known_store", knownStore,
			"zone_store", zs, "dropped_resume_revision", applied)
		applied = 0
	}
	resume := hs.GetResumeRevision()
	if rs := hs.GetResumeStoreId(); resume > 0 && rs != "" && rs != s.cfg.Store.ID() {
		log.Warn("the zone's resume point belongs to another global store: sending a full snapshot",
			"resume_store", rs, "global_store", s.cfg.Store.ID(), "dropped_resume_revision", resume)
		resume = 0
	}
	resp := &syncv1.HandshakeResponse{Accepted: true, ResumeRevision: applied, StoreId: s.cfg.Store.ID(),
		SoftwareVersion: s.cfg.SoftwareVersion, Features: intersect(s.features(), hs.GetFeatures())}
	if err := ws.Send(&syncv1.Message{Kind: &syncv1.Message_HandshakeResponse{HandshakeResponse: resp}}); err != nil {
		return fmt.Errorf("send handshake response: %w", err)
	}
	id, g2z, z2g := s.tracker.connected(z.Zone, hs, z.Environment, applied)
	log.Info("zone connected", "version", hs.GetSoftwareVersion(), "environment", z.Environment,
		"zone_resume_revision", applied, "global_resume_revision", hs.GetResumeRevision())
	p := sessionParams{
		log: log, clock: s.cfg.Clock, stream: ws, cfg: s.cfg.Stream, store: s.cfg.Store,
		src: globalSource{reg: s.cfg.Registry, zone: z.Zone, copies: s.copies}, sendLog: log.Named("to-zone"), sent: g2z,
		rej:     s.rejectionsOf(z.Zone),
		sink:    globalSink{reg: s.cfg.Registry, store: s.cfg.Store, zone: z, global: s.cfg.Plane},
		recvLog: log.Named("from-zone"), received: z2g, metaKey: MetaKeyZoneRevision(z.Zone),
		storeKey: MetaKeyZoneStoreID(z.Zone), peerStore: hs.GetStoreId(), applied: applied,
		onHeartbeat: func() { s.tracker.heartbeat(z.Zone, id); recheck() },
		onReport:    func() reportAssembly { return s.reports.assemble(z.Zone, s.knownPolicies()) },
		drain:       drain,
	}
	if s.cfg.Admission != nil {
		quota, err := s.zoneUsage(ctx, z.Zone)
		if err != nil {
			return err
		}
		p.checkBatch = func(puts []*resource.Resource, deletes []resource.Key) func(storage.TxReader) ([]resource.Key, error) {
			return s.cfg.Admission.FromZone(z.Zone, quota, puts, deletes)
		}
		p.onApplied = func(rejected []*syncv1.ResourceError) {
			quota.Used.Resources += quota.Delta.Resources
			quota.Used.Bytes += quota.Delta.Bytes
			quota.Delta = admission.Usage{}
			s.quotaRejected(z.Zone, quota, rejected)
		}
	}
	sess := newSession(p)
	err = sess.run(ctx, resume)
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		err = cause
	}
	if zoneWentAway(err) {
		err = errZoneGone
	}
	s.tracker.disconnected(z.Zone, id, errString(err))
	return err
}

// errUnauthenticated marks a refused token; errBadHandshake a handshake
// that cannot be served.
var (
	errUnauthenticated = errors.New("zone token refused")
	errBadHandshake    = errors.New("invalid handshake")
)

// admit checks the handshake of a stream authenticated as zone.
func (s *Server) admit(hs *syncv1.Handshake, zone string) (plane.Plane, error) {
	name := hs.GetZone()
	if size := proto.Size(hs); size > MaxHandshakeBytes {
		return plane.Plane{}, fmt.Errorf("%w: %d bytes, at most %d", errBadHandshake, size, MaxHandshakeBytes)
	}
	if name != zone {
		return plane.Plane{}, fmt.Errorf("%w: handshake for zone %q on a stream authenticated as %q", errBadHandshake, name, zone)
	}
	env, err := envFromWire(hs.GetEnvironment())
	if err != nil {
		return plane.Plane{}, fmt.Errorf("%w: %v", errBadHandshake, err)
	}
	if ns := hs.GetSystemNamespace(); ns != "" && !isDNSLabel(ns) {
		return plane.Plane{}, fmt.Errorf("%w: system namespace %q is not an RFC 1123 label", errBadHandshake, ns)
	}
	z, err := plane.NewZone(name, env, hs.GetSystemNamespace(), true)
	if err != nil {
		return plane.Plane{}, fmt.Errorf("%w: %v", errBadHandshake, err)
	}
	return z, nil
}

// checkZoneName: zone names become label values and hash inputs; they
// must be RFC 1123 labels.
func checkZoneName(name string) error {
	if !isDNSLabel(name) {
		return fmt.Errorf("zone name %q must be a lowercase RFC 1123 label", name)
	}
	return nil
}

func isDNSLabel(s string) bool {
	ok := s != "" && len(s) <= 63
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		alnum := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
		edge := i == 0 || i == len(s)-1
		ok = alnum || (!edge && c == '-')
	}
	return ok
}

// refuse answers a refused handshake so the zone can show why. The zone's
// status is not touched: its stream is authenticated, but the status shows
// what the zone's real streams did, and the zone logs the refusal itself.
func (s *Server) refuse(ws wireStream, zone string, err error) {
	s.metrics.handshakeRefused()
	s.log.Warn("zone refused", "zone", zone, "error", err)
	resp := &syncv1.HandshakeResponse{Accepted: false, Error: err.Error(), SoftwareVersion: s.cfg.SoftwareVersion}
	_ = ws.Send(&syncv1.Message{Kind: &syncv1.Message_HandshakeResponse{HandshakeResponse: resp}})
}

// register makes this stream the zone's current one, ending an older
// stream of the same zone (after a network split the zone redials before
// the global notices the old stream is dead).
func (s *Server) register(info StreamInfo, cred ZoneCredential, cancel context.CancelCauseFunc) (*activeStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errShutdown
	}
	// Under s.mu, as EndStreams: an access withdrawn after Authenticate is
	// either seen here or ends the stream registered below.
	if err := s.cfg.Authenticator.Recheck(info.Zone, cred); err != nil {
		return nil, fmt.Errorf("%w for zone %q: %w", errUnauthenticated, info.Zone, err)
	}
	if old := s.active[info.Zone]; old != nil {
		old.cancel(errReplaced)
	}
	a := &activeStream{cancel: cancel, info: info, drain: make(chan struct{}), done: make(chan struct{})}
	s.active[info.Zone] = a
	return a, nil
}

func (s *Server) unregister(zone string, a *activeStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A newer stream may own the entry already.
	if s.active[zone] == a {
		delete(s.active, zone)
	}
	close(a.done)
}

// toStatus maps an internal error to the gRPC status the zone sees.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, errUnauthenticated), errors.Is(err, errTokenExpired), errors.Is(err, errKeyRetired), errors.Is(err, ErrStreamRevoked):
		code = codes.Unauthenticated
	case errors.Is(err, errBadHandshake), errors.Is(err, errProtocol):
		code = codes.InvalidArgument
	case errors.Is(err, errReplaced):
		code = codes.Aborted
	case errors.Is(err, errShutdown), errors.Is(err, ErrPeerSilent), errors.Is(err, storage.ErrClosed), errors.Is(err, errWatchClosed):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}

// zoneWentAway: gRPC cancels the stream (or Recv reports EOF or Canceled)
// when the zone's connection goes away; say so instead of "context
// canceled".
func zoneWentAway(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled
}

// errZoneGone is why a stream ended when its zone went away.
var errZoneGone = errors.New("the zone's connection closed (the zone stopped or restarted, or the network dropped it)")

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func intersect(a, b []string) []string {
	var out []string
	for _, f := range a {
		if slices.Contains(b, f) {
			out = append(out, f)
		}
	}
	return out
}

// recvHandshake waits for the zone's first message, bounded by timeout.
// The receiving goroutine ends with the stream if the wait times out.
func recvHandshake(ctx context.Context, ws wireStream, clock Clock, timeout time.Duration) (*syncv1.Handshake, error) {
	m, err := recvFirst(ctx, ws, clock, timeout)
	if err != nil {
		return nil, err
	}
	hs := m.GetHandshake()
	if hs == nil {
		return nil, fmt.Errorf("%w: first message is %T, not a handshake", errBadHandshake, m.GetKind())
	}
	return hs, nil
}

// recvFirst receives one message with a timeout (the caller must end the
// stream when it times out, so the receiving goroutine returns).
func recvFirst(ctx context.Context, ws wireStream, clock Clock, timeout time.Duration) (*syncv1.Message, error) {
	type result struct {
		m   *syncv1.Message
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := ws.Recv()
		ch <- result{m, err}
	}()
	t := clock.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-t.C():
		return nil, fmt.Errorf("no handshake within %s: %w", timeout, context.DeadlineExceeded)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// knownPolicies returns what one report's assembly asks of every status:
// whether the global holds a policy of its own under (typ, mesh, name), the
// only statuses a zone may report. The zone copies every session shares
// answer without I/O once the policy was sent; before that (a report right
// after a restart or a reconnect) one listing per type and mesh answers for
// the rest of the report: a Get per status made a 40,000-status report take
// seconds. The returned function belongs to one session (no locking).
func (s *Server) knownPolicies() func(typ, mesh, name string) bool {
	listed := map[typeMesh]map[string]bool{}
	return func(typ, mesh, name string) bool {
		d, ok := s.cfg.Registry.Lookup(typ)
		if !ok || !d.IsPolicy() {
			return false
		}
		if s.copies.has(resource.Key{Type: d.Name, Mesh: mesh, Name: name}) {
			return true
		}
		tm := typeMesh{d.Name, mesh}
		names, ok := listed[tm]
		if !ok {
			names = s.globalPolicyNames(d.Name, mesh)
			listed[tm] = names
		}
		return names[name]
	}
}

// globalPolicyNames lists the names of the global's own policies of one
// type in one mesh; a store error lists none (the report's statuses of
// them are dropped until the next report).
func (s *Server) globalPolicyNames(typ, mesh string) map[string]bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := s.cfg.Store.List(ctx, storage.ListOptions{Type: typ, Mesh: mesh})
	if err != nil {
		s.log.Warn("listing policies for a status report failed", "type", typ, "mesh", mesh, "error", err)
		return map[string]bool{}
	}
	names := make(map[string]bool, len(list.Items))
	for _, r := range list.Items {
		if mapping.IsGlobalOrigin(r) {
			names[r.Name] = true
		}
	}
	return names
}

// nameCollides refuses a zone whose name is another zone's name followed by
// one of that zone's namespaces: the hashed names of its resources in the
// system namespace would be those of the other zone's resources in that
// namespace (Kuma's hash joins the zone and the namespace without a
// separator, and must stay as it is).
func (s *Server) nameCollides(ctx context.Context, zone string) error {
	for _, other := range s.knownZones(ctx) {
		ns, ok := strings.CutPrefix(zone, other)
		if !ok || ns == "" || !isDNSLabel(ns) {
			continue
		}
		for _, typ := range typesWhere(s.cfg.Registry, func(d *resource.TypeDescriptor) bool { return d.Sync.ZoneToGlobal }) {
			list, err := s.cfg.Store.List(ctx, storage.ListOptions{Type: typ, Limit: 1,
				Labels: map[string]string{resource.LabelZone: other, resource.LabelNamespace: ns}})
			if err != nil {
				return fmt.Errorf("check zone name %q: %w", zone, err)
			}
			if list.Total > 0 {
				return fmt.Errorf("%w: zone name %q is zone %q followed by its namespace %q: their resources would get the "+
					"same hashed names on the global (Kuma's hash joins zone and namespace without a separator); "+
					"choose another zone name", errBadHandshake, zone, other, ns)
			}
		}
	}
	return nil
}

// knownZones are the zones that connected since the server started and
// those with a Zone resource.
func (s *Server) knownZones(ctx context.Context) []string {
	var out []string
	for _, st := range s.tracker.statuses() {
		out = append(out, st.Zone)
	}
	if list, err := s.cfg.Store.List(ctx, storage.ListOptions{Type: "Zone"}); err == nil {
		for _, r := range list.Items {
			if !slices.Contains(out, r.Name) {
				out = append(out, r.Name)
			}
		}
	}
	return out
}

// ZoneQuota bounds what one zone may store on the global: resources and
// bytes (admission.ResourceSize). Zero means no bound.
type ZoneQuota struct {
	MaxResources int
	MaxBytes     int64
}

// zoneUsage counts what zone stores on the global now, as its session's
// quota.
func (s *Server) zoneUsage(ctx context.Context, zone string) (*admission.Quota, error) {
	q := &admission.Quota{MaxResources: s.cfg.ZoneQuota.MaxResources, MaxBytes: s.cfg.ZoneQuota.MaxBytes}
	for _, typ := range typesWhere(s.cfg.Registry, func(d *resource.TypeDescriptor) bool { return d.Sync.ZoneToGlobal }) {
		list, err := s.cfg.Store.List(ctx, storage.ListOptions{Type: typ,
			Labels: map[string]string{resource.LabelOrigin: resource.OriginZone, resource.LabelZone: zone}})
		if err != nil {
			return nil, fmt.Errorf("count the resources of zone %s: %w", zone, err)
		}
		for _, r := range list.Items {
			q.Used.Resources++
			q.Used.Bytes += admission.ResourceSize(r)
		}
	}
	s.tracker.quota(zone, QuotaStatus{Resources: q.Used.Resources, Bytes: q.Used.Bytes, MaxResources: q.MaxResources, MaxBytes: q.MaxBytes})
	return q, nil
}

// quotaRejected records a zone's use of its quota after a batch, counting
// the resources refused for it.
func (s *Server) quotaRejected(zone string, q *admission.Quota, rejected []*syncv1.ResourceError) {
	st, _ := s.tracker.status(zone)
	n := uint64(0)
	if st.Quota != nil {
		n = st.Quota.Rejected
	}
	for _, re := range rejected {
		if strings.Contains(re.GetMessage(), admission.ErrQuota.Error()) {
			n++
		}
	}
	s.tracker.quota(zone, QuotaStatus{Resources: q.Used.Resources, Bytes: q.Used.Bytes, MaxResources: q.MaxResources,
		MaxBytes: q.MaxBytes, Rejected: n})
}
