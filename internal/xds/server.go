package xds

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	deltav3 "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	sotwv3 "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The xDS server (docs/dataplane.md#xds): go-control-plane's ADS server,
// state of the world and delta, over a snapshot cache holding one snapshot
// per connected proxy. Every stream proves which Dataplane it is before
// anything is sent (Identify), asks only for that Dataplane's resources,
// and ends when the Dataplane's token is revoked or another agent takes
// the Dataplane over. Per proxy and type the server records what it sent,
// what the proxy acknowledged and the last rejection.

// Identity is who a stream proved to be: a Dataplane, by its node id and
// its mesh, namespace ("" for the system namespace) and name, and the
// token its agent joined with.
type Identity struct {
	NodeID                string
	Mesh, Namespace, Name string
	TokenID               string
	// Kind is the kind of proxy (ProxyGRPC, ProxyEnvoy), from the node's
	// metadata (meridian.io/proxy, which meridian-dp's Envoy bootstrap
	// sets); a proxyless gRPC client sets none.
	Kind string
	// AccessLogPipe is where the proxy's agent reads access log lines for
	// tcp backends (node metadata meridian.io/access-log-pipe); "" for
	// none or a value that is not a clean absolute path.
	AccessLogPipe string
}

// MetadataProxy is the node metadata key that names the kind of proxy.
const MetadataProxy = "meridian.io/proxy"

// MetadataAccessLogPipe is the node metadata key naming the agent's
// access log pipe.
const MetadataAccessLogPipe = "meridian.io/access-log-pipe"

// accessLogPipeOf is the access log pipe a node's metadata names, when it
// is a clean absolute path of at most 1 KiB (it is written into the
// proxy's own listeners only).
func accessLogPipeOf(node *corev3.Node) string {
	p := node.GetMetadata().GetFields()[MetadataAccessLogPipe].GetStringValue()
	if p == "" || len(p) > 1024 || !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsAny(p, "\x00\n") {
		return ""
	}
	return p
}

// kindOf is the proxy kind a node's metadata names.
func kindOf(node *corev3.Node) string {
	if node.GetMetadata().GetFields()[MetadataProxy].GetStringValue() == ProxyEnvoy {
		return ProxyEnvoy
	}
	return ProxyGRPC
}

// ErrUnauthenticated is wrapped by an Identify that finds no identity.
var ErrUnauthenticated = errors.New("unauthenticated")

// ServerConfig wires a Server. Identify is required.
type ServerConfig struct {
	// Identify finds the identity of a stream from its context (its TLS
	// client certificate); an error refuses the stream.
	Identify func(ctx context.Context) (Identity, error)
	// Connected is called (outside any lock) when a node's first stream
	// opens, so its resources are computed at once.
	Connected func(nodeID string)
	Logger    hclog.Logger
	Metrics   prometheus.Registerer
	Now       func() time.Time
}

// Server serves xDS. Safe for concurrent use.
type Server struct {
	cfg   ServerConfig
	ctx   context.Context // the server's life: its end ends every stream
	cache cachev3.SnapshotCache
	// watcher is the cache the streams watch (nackCache).
	watcher nackCache
	// lastStream numbers the streams (go-control-plane's own numbers
	// start again with each of its servers, one per stream).
	lastStream atomic.Int64

	mu      sync.Mutex
	streams map[int64]*streamInfo
	nodes   map[string]*nodeState
	// live are the cancel functions of the running streams, for ending
	// a node's or a token's streams.
	live map[*liveStream]struct{}
	// interned shares equal resources between the nodes' snapshots.
	interned internTable
	// nconnected counts the nodes with an open stream.
	nconnected int

	pushes, acks, nacks *prometheus.CounterVec
	connected           prometheus.Gauge
}

type streamInfo struct {
	id   Identity
	node string // the node id the stream's requests carry
}

type liveStream struct {
	id     Identity
	cancel context.CancelCauseFunc
}

// nodeState is what the server knows of one node.
type nodeState struct {
	id      Identity
	streams int
	since   time.Time
	types   map[string]*TypeStatus
	// res are the resources last set, and versions their versions by
	// type; held are res's references in the intern table, by list;
	// snap is the cache's snapshot of them, whose unchanged types the
	// next one shares.
	res      *Resources
	versions map[string]string
	held     [4][]internKey
	snap     *cachev3.Snapshot
}

// TypeStatus is the state of one resource type on one proxy.
type TypeStatus struct {
	Sent  string `json:"sent,omitempty"`
	Acked string `json:"acked,omitempty"`
	// Nack is the last rejection, while it is the newest answer.
	Nack *Nack `json:"nack,omitempty"`
}

// Nack is a rejection by a proxy, with its message and the policies that
// shaped the resources of the type.
type Nack struct {
	Version  string    `json:"version"`
	Message  string    `json:"message"`
	At       time.Time `json:"at"`
	Policies []string  `json:"policies,omitempty"`
}

// NodeStatus is a proxy's xDS state (docs/api.md `_xds`).
type NodeStatus struct {
	Connected bool                   `json:"connected"`
	Since     time.Time              `json:"since"`
	Types     map[string]*TypeStatus `json:"types"`
}

// NewServer builds a Server; Register it on a gRPC server.
func NewServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Identify == nil {
		return nil, errors.New("xds server: Identify is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, streams: map[int64]*streamInfo{}, nodes: map[string]*nodeState{}, live: map[*liveStream]struct{}{},
		interned:  internTable{entries: map[internKey]*internEntry{}},
		pushes:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_xds_pushes_total", Help: "xDS responses sent to proxies, by type."}, []string{"type"}),
		acks:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_xds_acks_total", Help: "xDS responses proxies acknowledged, by type."}, []string{"type"}),
		nacks:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_xds_nacks_total", Help: "xDS responses proxies rejected, by type."}, []string{"type"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_xds_connected_proxies", Help: "Proxies with an open xDS stream."}),
	}
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{s.pushes, s.acks, s.nacks, s.connected} {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("xds metrics: %w", err)
			}
		}
	}
	// Not ADS-consistent: a client asking for a service that does not
	// exist gets an answer without it at once (gRPC then fails the call)
	// instead of a watch that waits forever.
	s.cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	s.ctx, s.watcher = ctx, nackCache{SnapshotCache: s.cache, s: s}
	return s, nil
}

// Register adds the aggregated discovery service to g.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, &adsService{s: s})
}

// adsService authenticates every stream, then hands it to go-control-plane
// with a context the server can end (revocation, takeover).
type adsService struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	s *Server
}

type identityKey struct{}

// Each stream runs on a go-control-plane server of its own whose context
// is the stream's: go-control-plane's stream loop ends with its server's
// context, not with the stream's, so a stream the server ends (a revoked
// token, a takeover) returns at once, in the handler's goroutine, with no
// goroutine of ours waiting beside it.

func (a *adsService) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return a.s.serve(stream.Context(), func(ctx context.Context, cb streamCallbacks) error {
		return sotwv3.NewServer(ctx, a.s.watcher, cb).StreamHandler(sotwStream{stream, ctx}, resourcev3.AnyType)
	})
}

func (a *adsService) DeltaAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return a.s.serve(stream.Context(), func(ctx context.Context, cb streamCallbacks) error {
		return deltav3.NewServer(ctx, a.s.watcher, cb).DeltaStreamHandler(deltaStream{stream, ctx}, resourcev3.AnyType)
	})
}

type sotwStream struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	ctx context.Context
}

func (s sotwStream) Context() context.Context { return s.ctx }

type deltaStream struct {
	discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	ctx context.Context
}

func (s deltaStream) Context() context.Context { return s.ctx }

// errStreamEnded is the cause of a stream the server ended.
var errStreamEnded = errors.New("xds stream ended by the control plane")

// serve identifies a stream and runs it until it ends or the server ends
// it; the stream's error then tells the proxy why.
func (s *Server) serve(ctx context.Context, run func(context.Context, streamCallbacks) error) error {
	id, err := s.cfg.Identify(ctx)
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, identityKey{}, id))
	stop := context.AfterFunc(s.ctx, func() { cancel(nil) })
	ls := &liveStream{id: id, cancel: cancel}
	s.mu.Lock()
	s.live[ls] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.live, ls)
		s.mu.Unlock()
		stop()
		cancel(nil)
	}()
	err = run(ctx, streamCallbacks{s: s, id: s.lastStream.Add(1)})
	if ctx.Err() == nil {
		return err
	}
	if cause := context.Cause(ctx); errors.Is(cause, errStreamEnded) {
		return status.Error(codes.PermissionDenied, cause.Error())
	}
	return status.FromContextError(ctx.Err()).Err()
}

// End ends the running streams whose identity match selects, with reason.
func (s *Server) End(match func(Identity) bool, reason string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for ls := range s.live {
		if match(ls.id) {
			ls.cancel(fmt.Errorf("%w: %s", errStreamEnded, reason))
			n++
		}
	}
	return n
}

// streamCallbacks are go-control-plane's callbacks for one stream, which
// the server knows by id (go-control-plane's stream ids are ignored).
type streamCallbacks struct {
	s  *Server
	id int64
}

func (c streamCallbacks) OnStreamOpen(ctx context.Context, _ int64, _ string) error {
	return c.s.open(ctx, c.id)
}
func (c streamCallbacks) OnStreamClosed(int64, *corev3.Node) { c.s.closed(c.id) }
func (c streamCallbacks) OnStreamRequest(_ int64, req *discoveryv3.DiscoveryRequest) error {
	return c.s.request(c.id, req.GetNode(), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
}
func (c streamCallbacks) OnStreamResponse(_ context.Context, _ int64, _ *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
	c.s.sent(c.id, resp.GetTypeUrl(), resp.GetVersionInfo())
}
func (c streamCallbacks) OnDeltaStreamOpen(ctx context.Context, _ int64, _ string) error {
	return c.s.open(ctx, c.id)
}
func (c streamCallbacks) OnDeltaStreamClosed(int64, *corev3.Node) { c.s.closed(c.id) }
func (c streamCallbacks) OnStreamDeltaRequest(_ int64, req *discoveryv3.DeltaDiscoveryRequest) error {
	return c.s.request(c.id, req.GetNode(), req.GetTypeUrl(), "", req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
}
func (c streamCallbacks) OnStreamDeltaResponse(_ int64, _ *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
	c.s.sent(c.id, resp.GetTypeUrl(), resp.GetSystemVersionInfo())
}

func (s *Server) open(ctx context.Context, id int64) error {
	ident, ok := ctx.Value(identityKey{}).(Identity)
	if !ok {
		return status.Error(codes.Unauthenticated, "stream without an identity")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[id] = &streamInfo{id: ident}
	return nil
}

func (s *Server) closed(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	delete(s.streams, id)
	if st == nil || st.node == "" {
		return
	}
	if n := s.nodes[st.node]; n != nil {
		n.streams--
		if n.streams == 0 {
			s.connected.Dec()
			s.nconnected--
		}
	}
}

// request checks a request's node against the stream's identity and
// records an acknowledgement or a rejection.
func (s *Server) request(id int64, node *corev3.Node, typeURL, version, nonce, detail string, nack bool) error {
	s.mu.Lock()
	st := s.streams[id]
	if st == nil {
		s.mu.Unlock()
		return status.Error(codes.Internal, "unknown stream")
	}
	nodeID := node.GetId()
	if nodeID == "" && st.node != "" {
		nodeID = st.node // the node is sent on a stream's first request only
	}
	if nodeID != st.id.NodeID {
		s.mu.Unlock()
		return status.Errorf(codes.PermissionDenied, "this stream is Dataplane %q: it cannot ask for node %q", st.id.NodeID, nodeID)
	}
	first := false
	if st.node == "" {
		st.node = nodeID
		n := s.node(nodeID)
		n.id = st.id
		n.id.Kind = kindOf(node)
		n.id.AccessLogPipe = accessLogPipeOf(node)
		n.streams++
		if n.streams == 1 {
			n.since = s.cfg.Now()
			s.connected.Inc()
			s.nconnected++
			first = true
		}
	}
	n := s.node(nodeID)
	if nonce != "" {
		ts := n.typeStatus(typeURL)
		if nack {
			ts.Nack = &Nack{Version: ts.Sent, Message: detail, At: s.cfg.Now(), Policies: n.policiesOf(typeURL)}
			s.nacks.WithLabelValues(shortType(typeURL)).Inc()
			s.cfg.Logger.Warn("proxy rejected configuration", "node", nodeID, "type", shortType(typeURL), "message", detail, "policies", ts.Nack.Policies)
		} else {
			if version == "" {
				version = ts.Sent // delta: the nonce acknowledges what was sent
			}
			ts.Acked, ts.Nack = version, nil
			s.acks.WithLabelValues(shortType(typeURL)).Inc()
		}
	}
	s.mu.Unlock()
	if first && s.cfg.Connected != nil {
		s.cfg.Connected(nodeID)
	}
	return nil
}

func (s *Server) sent(id int64, typeURL, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil || st.node == "" {
		return
	}
	s.node(st.node).typeStatus(typeURL).Sent = version
	s.pushes.WithLabelValues(shortType(typeURL)).Inc()
}

func (s *Server) node(id string) *nodeState {
	n := s.nodes[id]
	if n == nil {
		n = &nodeState{types: map[string]*TypeStatus{}, versions: map[string]string{}}
		s.nodes[id] = n
	}
	return n
}

func (n *nodeState) typeStatus(typeURL string) *TypeStatus {
	ts := n.types[typeURL]
	if ts == nil {
		ts = &TypeStatus{}
		n.types[typeURL] = ts
	}
	return ts
}

// policiesOf lists the policies behind the resources of a type.
func (n *nodeState) policiesOf(typeURL string) []string {
	if n.res == nil {
		return nil
	}
	var out []string
	for _, ps := range n.res.Shaped()[typeURL] {
		out = append(out, ps...)
	}
	sort.Strings(out)
	return compact(out)
}

func compact(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// Connected lists the identities of the nodes with an open stream, by
// mesh and node id.
func (s *Server) Connected() []Identity { return s.appendConnected(nil) }

// appendConnected appends the nodes with an open stream to buf[:0], in
// mesh and node id order (the controller's pass reuses buf).
func (s *Server) appendConnected(buf []Identity) []Identity {
	s.mu.Lock()
	out := buf[:0]
	for _, n := range s.nodes {
		if n.streams > 0 {
			out = append(out, n.id)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Identity) int {
		return cmp.Or(strings.Compare(a.Mesh, b.Mesh), strings.Compare(a.NodeID, b.NodeID))
	})
	return out
}

// Kind is the kind of proxy a node last connected as ("" for a node never
// seen).
func (s *Server) Kind(nodeID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[nodeID]; n != nil {
		return n.id.Kind
	}
	return ""
}

// current is the node's current rendering (nil: none). It is not written
// once set; a rendering from it reads it without the lock.
func (s *Server) current(nodeID string) *Resources {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[nodeID]; n != nil {
		return n.res
	}
	return nil
}

// lastIdentity is the identity a node last connected with (ok false for
// a node never seen).
func (s *Server) lastIdentity(nodeID string) (Identity, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[nodeID]; n != nil && n.id.NodeID != "" {
		return n.id, true
	}
	return Identity{}, false
}

// anyConnected says whether some node has an open stream.
func (s *Server) anyConnected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nconnected > 0
}

// isConnected says whether a node has an open stream.
func (s *Server) isConnected(nodeID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	return n != nil && n.streams > 0
}

// Status is a node's xDS state; ok is false for a node never seen.
func (s *Server) Status(nodeID string) (NodeStatus, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	if n == nil {
		return NodeStatus{Types: map[string]*TypeStatus{}}, false
	}
	out := NodeStatus{Connected: n.streams > 0, Since: n.since, Types: map[string]*TypeStatus{}}
	for t, ts := range n.types {
		c := *ts
		if ts.Nack != nil {
			nk := *ts.Nack
			c.Nack = &nk
		}
		out.Types[shortType(t)] = &c
	}
	return out, true
}

// Set makes res the node's resources: each type's version is a hash of
// its resources, so a type that did not change is not sent again. The
// server keeps res, whose resources it replaces by equal ones other nodes
// hold (internTable): neither may change afterwards. A list holding the
// very resources of the node's last one (a rendering that reused them)
// keeps its version, references and cache resources as they are. Set is
// called for a node by one goroutine at a time (the controller).
func (s *Server) Set(ctx context.Context, nodeID string, res *Resources) error {
	if err := digestAll(res); err != nil {
		return err
	}
	s.mu.Lock()
	last := s.node(nodeID).res
	lastVersions := s.nodes[nodeID].versions
	s.mu.Unlock()
	versions, kept := versionsFrom(res, last, lastVersions)

	s.mu.Lock()
	n := s.node(nodeID)
	if n.res != last { // forgotten meanwhile: nothing of the last is held
		kept = [4]bool{}
	}
	same := n.res != nil && len(n.versions) == len(versions)
	for t, v := range versions {
		same = same && n.versions[t] == v
	}
	for i, list := range res.lists() {
		if kept[i] {
			continue
		}
		held := s.interned.intern(i, *list, res.sums[i])
		s.interned.release(n.held[i])
		n.held[i] = held
	}
	prevVersions, prevSnap := n.versions, n.snap
	n.versions, n.res = versions, res
	if same {
		s.mu.Unlock()
		return nil
	}
	// A type whose version did not change keeps the cache's resources
	// of the last snapshot (its index by name is not built again).
	snap := &cachev3.Snapshot{}
	for i, list := range res.lists() {
		typeURL := listTypes[i]
		rt := cachev3.GetResponseType(typeURL)
		if prevSnap != nil && prevVersions[typeURL] == versions[typeURL] {
			snap.Resources[rt] = prevSnap.Resources[rt]
			continue
		}
		snap.Resources[rt] = cachev3.NewResources(versions[typeURL], *list)
	}
	n.snap = snap
	s.mu.Unlock()
	return s.cache.SetSnapshot(ctx, nodeID, snap)
}

// sameItems: the very same resources in the same order.
func sameItems(a, b []types.Resource) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// OnConnect sets the function called when a node's first stream opens.
// Call it before serving.
func (s *Server) OnConnect(fn func(nodeID string)) { s.cfg.Connected = fn }

// Snapshot is the node's current snapshot (what it gets).
func (s *Server) Snapshot(nodeID string) (cachev3.ResourceSnapshot, error) {
	return s.cache.GetSnapshot(nodeID)
}

// Forget drops a node's snapshot and state (its Dataplane is gone).
func (s *Server) Forget(nodeID string) {
	s.cache.ClearSnapshot(nodeID)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	if n == nil {
		return
	}
	for _, keys := range n.held {
		s.interned.release(keys)
	}
	n.res, n.versions, n.held, n.snap = nil, nil, [4][]internKey{}, nil
	if n.streams == 0 {
		delete(s.nodes, nodeID)
	}
}

// nackCache keeps a rejected version from being sent again. The snapshot
// cache answers every state-of-the-world request whose version is not the
// snapshot's at once, and a rejection carries the version the proxy still
// runs: left alone, the proxy would get the version it refused, refuse it
// again, and so on. A rejection of the version last sent is taken as
// knowing it, so the next response is the next change. (Delta streams keep
// what was sent per resource and do not loop.)
type nackCache struct {
	cachev3.SnapshotCache
	s *Server
}

func (c nackCache) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, value chan cachev3.Response) (func(), error) {
	if req.GetErrorDetail() != nil {
		if sent := c.s.sentVersion(req.GetNode().GetId(), req.GetTypeUrl()); sent != "" {
			req = proto.Clone(req).(*cachev3.Request)
			req.VersionInfo = sent
		}
	}
	return c.SnapshotCache.CreateWatch(req, sub, value)
}

// sentVersion is the version last sent to a node for a type.
func (s *Server) sentVersion(nodeID, typeURL string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[nodeID]; n != nil {
		if ts := n.types[typeURL]; ts != nil {
			return ts.Sent
		}
	}
	return ""
}

// Versions are the versions of res by type URL: hashes of the resources'
// digests, so that the same resources always have the same version. It
// completes res's digests first (an encoding of each resource that has
// none): call it before res is shared.
func Versions(res *Resources) (map[string]string, error) {
	return VersionsAfter(res, nil, nil)
}

// VersionsAfter are res's versions as Set makes them for a node whose last
// resources were last, of versions lastVersions (nil: none): a list
// holding the very resources of last's keeps its version.
func VersionsAfter(res, last *Resources, lastVersions map[string]string) (map[string]string, error) {
	if err := digestAll(res); err != nil {
		return nil, err
	}
	versions, _ := versionsFrom(res, last, lastVersions)
	return versions, nil
}

// versionsFrom are res's versions, with a list holding the very resources
// of last's (versions lastVersions) keeping its version; kept says which.
// res's digests are complete.
func versionsFrom(res, last *Resources, lastVersions map[string]string) (map[string]string, [4]bool) {
	versions := make(map[string]string, len(listTypes))
	var kept [4]bool
	var buf []byte // versionOf's, every list's in turn
	for i, list := range res.lists() {
		if v, ok := lastVersions[listTypes[i]]; ok && last != nil && sameItems(*list, *last.lists()[i]) {
			kept[i] = true
			versions[listTypes[i]] = v
			continue
		}
		versions[listTypes[i]], buf = versionOf(*list, res.sums[i], buf)
	}
	return versions, kept
}

// versionOf hashes resources, sorted by name, each by its digest (sums,
// by position). It writes what it hashes in buf, which it returns for the
// next list.
func versionOf(items []types.Resource, sums [][sha256.Size]byte, buf []byte) (string, []byte) {
	// One buffer hashed at once: hashing three small writes per
	// resource cost more than the hash itself. Renderings mostly emit
	// their lists in name order: then it is written as it is read.
	buf = slices.Grow(buf[:0], len(items)*(sha256.Size+1+48)) // a name is mostly shorter
	prev := ""
	for i, r := range items {
		name := cachev3.GetResourceName(r)
		if i > 0 && name < prev {
			return versionOfUnsorted(items, sums, buf)
		}
		prev = name
		buf = appendVersioned(buf, name, &sums[i])
	}
	return versionHash(buf), buf
}

// appendVersioned writes one resource as a version hashes it: its name and
// its digest.
func appendVersioned(buf []byte, name string, sum *[sha256.Size]byte) []byte {
	buf = append(buf, name...)
	buf = append(buf, 0)
	return append(buf, sum[:]...)
}

// versionHash is the version of what versionOf wrote.
func versionHash(buf []byte) string {
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:8])
}

// versionOfUnsorted is versionOf for a list out of name order (a gRPC
// proxy's listeners: its clients', then its servers'): of the list sorted
// by name. Names are read once, not per comparison.
func versionOfUnsorted(items []types.Resource, sums [][sha256.Size]byte, buf []byte) (string, []byte) {
	type named struct {
		name string
		i    int
	}
	order := make([]named, len(items))
	for i, r := range items {
		order[i] = named{cachev3.GetResourceName(r), i}
	}
	slices.SortFunc(order, func(a, b named) int { return strings.Compare(a.name, b.name) })
	buf = buf[:0]
	for _, o := range order {
		buf = appendVersioned(buf, o.name, &sums[o.i])
	}
	return versionHash(buf), buf
}

// shortType is a type URL's last part (Listener, Cluster...).
func shortType(typeURL string) string {
	for i := len(typeURL) - 1; i >= 0; i-- {
		if typeURL[i] == '.' || typeURL[i] == '/' {
			return typeURL[i+1:]
		}
	}
	return typeURL
}

// Current is what the node was last given: its resources and their
// versions by type URL; ok is false before the first rendering.
func (s *Server) Current(nodeID string) (res *Resources, versions map[string]string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	if n == nil || n.res == nil {
		return nil, nil, false
	}
	return n.res, maps.Clone(n.versions), true
}
