// Package dataplane is the zone's side of the workloads' agents
// (docs/dataplane.md#joining): meridian-dp joins with a Dataplane token,
// registers its Dataplane (the zone owns the resource while the agent
// lives and removes it when the agent is gone past a grace period), and
// gets its certificates signed: the xDS client certificate its workload's
// xDS stream presents (the zone's xDS CA) and the workload certificate of
// the mesh CA. It also keeps the endpoint summaries the zone shares with
// the other zones.
package dataplane

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/ca"
	"github.com/meridian-mesh/meridian/internal/meshca"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/xds"
	dataplanev1 "github.com/meridian-mesh/meridian/proto/meridian/dataplane/v1"
)

// LabelManagedBy marks a Dataplane an agent registered: the zone removes
// it once its agent is gone past the grace period. Dataplanes written
// through the API carry no such label and stay.
const (
	LabelManagedBy = "meridian.io/managed-by"
	ManagedByAgent = "meridian-dp"
)

// DefaultGrace is how long a Dataplane outlives its agent.
const DefaultGrace = time.Minute

// XDSClientValidity is the life of an xDS client certificate.
const XDSClientValidity = 24 * time.Hour

// CA is the mesh CA as the agent server uses it (meshca.Zone).
type CA interface {
	MTLS(mesh string) meshca.MeshTLS
	Issue(mesh string, csr *x509.CertificateRequest, leaf ca.Leaf) (chain, bundle []byte, expires time.Time, err error)
	Changed() <-chan struct{}
}

// Revocations says whether a token id was revoked.
type Revocations interface {
	Revoked(id string) bool
}

// Config wires a Server. Every field but Logger and Now is required.
type Config struct {
	Store     storage.Store
	Registry  *resource.Registry
	Plane     plane.Plane
	Admission *admission.Controller
	Tokens    *auth.DataplaneTokens
	Revoked   Revocations
	CA        CA
	// XDSCA signs the xDS client certificates; XDSBundle is what the
	// agents verify the zone's xDS server with.
	XDSCA     *ca.Authority
	XDSBundle []byte
	// EndStreams ends the xDS streams of a Dataplane or token.
	EndStreams func(match func(xds.Identity) bool, reason string)
	Grace      time.Duration
	Logger     hclog.Logger
	Now        func() time.Time
}

// Server implements the agent service. Safe for concurrent use.
type Server struct {
	dataplanev1.UnimplementedAgentServiceServer
	cfg Config

	// nodeLocks serialize, per node, registering a Dataplane and removing
	// it after its grace period: a sweep never deletes a Dataplane an
	// agent has just registered again.
	nodeLocks [64]sync.Mutex

	mu       sync.Mutex
	sessions map[string]*session // by node id
	// gone are the nodes whose agent left, with when; a Dataplane is
	// removed Grace after.
	gone map[string]goneNode
	next chan struct{} // closed on a presence change
}

type session struct {
	id      xds.Identity
	key     resource.Key
	cancel  context.CancelCauseFunc
	since   time.Time
	version string
}

type goneNode struct {
	key resource.Key
	at  time.Time
}

// NewServer checks cfg.
func NewServer(cfg Config) (*Server, error) {
	switch {
	case cfg.Store == nil || cfg.Registry == nil || cfg.Admission == nil || cfg.Tokens == nil || cfg.Revoked == nil ||
		cfg.CA == nil || cfg.XDSCA == nil || cfg.EndStreams == nil:
		return nil, errors.New("dataplane: Store, Registry, Admission, Tokens, Revoked, CA, XDSCA and EndStreams are required")
	case !cfg.Plane.IsZone():
		return nil, errors.New("dataplane: agents join a zone")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Server{cfg: cfg, sessions: map[string]*session{}, gone: map[string]goneNode{}, next: make(chan struct{})}, nil
}

// Register adds the agent service to g.
func (s *Server) Register(g *grpc.Server) { dataplanev1.RegisterAgentServiceServer(g, s) }

// token verifies the call's Dataplane token.
func (s *Server) token(ctx context.Context) (auth.DataplaneClaims, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var raw string
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			raw = strings.TrimSpace(t)
		}
	}
	if raw == "" {
		return auth.DataplaneClaims{}, status.Error(codes.Unauthenticated, "no Dataplane token: send it as \"authorization: Bearer <token>\"")
	}
	c, err := s.cfg.Tokens.Verify(raw)
	if err != nil {
		return auth.DataplaneClaims{}, status.Error(codes.Unauthenticated, err.Error())
	}
	if s.cfg.Revoked.Revoked(c.ID) {
		return auth.DataplaneClaims{}, status.Errorf(codes.Unauthenticated, "dataplane token %s was revoked", c.ID)
	}
	return c, nil
}

// Join registers the Dataplane and holds the session.
func (s *Server) Join(req *dataplanev1.JoinRequest, stream grpc.ServerStreamingServer[dataplanev1.JoinResponse]) error {
	ctx := stream.Context()
	claims, err := s.token(ctx)
	if err != nil {
		return err
	}
	res, dp, err := s.admit(claims, req.GetDataplane())
	if err != nil {
		return err
	}
	id := xds.Identity{NodeID: xds.NodeID(dp.Mesh, dp.Name, dp.Namespace), Mesh: dp.Mesh, Name: dp.Name, Namespace: dp.Namespace, TokenID: claims.ID}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	unlock := s.lockNode(id.NodeID)
	stored, err := s.register(ctx, res, dp)
	if err != nil {
		unlock()
		return err
	}
	sess := &session{id: id, key: stored.Key(), cancel: cancel, since: s.cfg.Now(), version: req.GetVersion()}
	s.open(sess)
	unlock()
	defer s.close(sess)
	mtls := s.cfg.CA.MTLS(dp.Mesh)
	if err := stream.Send(&dataplanev1.JoinResponse{Event: &dataplanev1.JoinResponse_Joined{Joined: &dataplanev1.Joined{
		NodeId: id.NodeID, Mesh: dp.Mesh, Name: dp.Name, Namespace: dp.Namespace, Zone: s.cfg.Plane.Zone, Mtls: mtls.Enabled,
	}}}); err != nil {
		return err
	}
	s.cfg.Logger.Info("agent joined", "node", id.NodeID, "token", claims.ID, "version", req.GetVersion())
	for {
		changed := s.cfg.CA.Changed()
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); errors.Is(cause, errSessionEnded) {
				return status.Error(codes.Aborted, cause.Error())
			}
			return nil
		case <-changed:
			now := s.cfg.CA.MTLS(dp.Mesh)
			if now == mtls {
				continue
			}
			mtls = now
			if err := stream.Send(&dataplanev1.JoinResponse{Event: &dataplanev1.JoinResponse_Renew{Renew: &dataplanev1.Renew{Mtls: now.Enabled}}}); err != nil {
				return err
			}
		}
	}
}

var errSessionEnded = errors.New("agent session ended")

// lockNode locks the node's registration; call the returned function to
// unlock.
func (s *Server) lockNode(nodeID string) func() {
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	m := &s.nodeLocks[h.Sum32()%uint32(len(s.nodeLocks))]
	m.Lock()
	return m.Unlock
}

// admit decodes the Dataplane as admission prepares it for this zone (with
// the agent's label) and checks the token admits it.
func (s *Server) admit(claims auth.DataplaneClaims, doc []byte) (*resource.Resource, *xds.Dataplane, error) {
	res, err := s.cfg.Registry.Decode(doc)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "dataplane file: %v", err)
	}
	if res.Type != "Dataplane" {
		return nil, nil, status.Errorf(codes.InvalidArgument, "dataplane file: a %s, not a Dataplane", res.Type)
	}
	res.Labels.Set(LabelManagedBy, ManagedByAgent)
	if err := s.cfg.Admission.Prepare(res); err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "dataplane file: %v", err)
	}
	ns := s.cfg.Plane.Namespace(res.Namespace)
	dp, err := xds.ParseDataplane(res, ns)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "dataplane file: %v", err)
	}
	if why := claims.Admits(dp.Mesh, ns, dp.Name, dp.InboundTags()); why != "" {
		return nil, nil, status.Errorf(codes.PermissionDenied, "dataplane token %s does not admit Dataplane %s of mesh %s: %s", claims.ID, dp.Name, dp.Mesh, why)
	}
	return res, dp, nil
}

// register stores an admitted Dataplane as this zone's, through admission
// as the API would.
func (s *Server) register(ctx context.Context, res *resource.Resource, dp *xds.Dataplane) (*resource.Resource, error) {
	result, err := s.cfg.Store.Apply(ctx, s.cfg.Admission.Put(res))
	if err != nil {
		switch {
		case errors.Is(err, admission.ErrForbidden), errors.Is(err, admission.ErrOwned):
			return nil, status.Errorf(codes.PermissionDenied, "register Dataplane %s: %v", dp.Name, err)
		case errors.Is(err, storage.ErrNotFound):
			return nil, status.Errorf(codes.FailedPrecondition, "register Dataplane %s: %v", dp.Name, err)
		}
		return nil, status.Errorf(codes.Unavailable, "register Dataplane %s: %v", dp.Name, err)
	}
	return result.Stored[0], nil
}

// open records a session; an agent already holding the node is ended (the
// newer wins: a restarted or rescheduled workload).
func (s *Server) open(sess *session) {
	s.mu.Lock()
	old := s.sessions[sess.id.NodeID]
	s.sessions[sess.id.NodeID] = sess
	delete(s.gone, sess.id.NodeID)
	s.changedLocked()
	s.mu.Unlock()
	if old != nil {
		old.cancel(fmt.Errorf("%w: another agent took Dataplane %s over", errSessionEnded, sess.id.NodeID))
		s.cfg.Logger.Info("agent took a Dataplane over", "node", sess.id.NodeID)
	}
}

// close ends a session; the Dataplane is removed Grace later unless an
// agent joins again.
func (s *Server) close(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[sess.id.NodeID] != sess {
		return // taken over
	}
	delete(s.sessions, sess.id.NodeID)
	s.gone[sess.id.NodeID] = goneNode{key: sess.key, at: s.cfg.Now()}
	s.changedLocked()
	s.cfg.Logger.Info("agent left", "node", sess.id.NodeID)
}

func (s *Server) changedLocked() {
	close(s.next)
	s.next = make(chan struct{})
}

// Live reports whether the node's agent is connected.
func (s *Server) Live(nodeID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[nodeID] != nil
}

// Changed returns a channel closed at the next presence change.
func (s *Server) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// Status is the agent state of a node.
func (s *Server) Status(nodeID string) xds.AgentStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.sessions[nodeID]; sess != nil {
		return xds.AgentStatus{Connected: true, Since: sess.since, Version: sess.version, Token: sess.id.TokenID}
	}
	if g, ok := s.gone[nodeID]; ok {
		return xds.AgentStatus{LeftAt: g.at}
	}
	return xds.AgentStatus{}
}

// Revoke ends the sessions and xDS streams that joined with token id.
func (s *Server) Revoke(id string) {
	s.mu.Lock()
	var ended []*session
	for _, sess := range s.sessions {
		if sess.id.TokenID == id {
			ended = append(ended, sess)
		}
	}
	s.mu.Unlock()
	for _, sess := range ended {
		sess.cancel(fmt.Errorf("%w: dataplane token %s was revoked", errSessionEnded, id))
	}
	s.cfg.EndStreams(func(i xds.Identity) bool { return i.TokenID == id }, "dataplane token "+id+" was revoked")
}

// Sign signs a CSR of the agent's.
func (s *Server) Sign(ctx context.Context, req *dataplanev1.SignRequest) (*dataplanev1.SignResponse, error) {
	claims, err := s.token(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	sess := s.sessions[req.GetNodeId()]
	s.mu.Unlock()
	if sess == nil || sess.id.TokenID != claims.ID {
		return nil, status.Errorf(codes.FailedPrecondition, "no session of node %q with this token: join first", req.GetNodeId())
	}
	csr, err := ca.ParseCSR(req.GetCsr())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	switch req.GetKind() {
	case dataplanev1.CertificateKind_CERTIFICATE_KIND_XDS:
		return s.signXDS(sess.id, csr)
	case dataplanev1.CertificateKind_CERTIFICATE_KIND_WORKLOAD:
		return s.signWorkload(ctx, sess, csr)
	}
	return nil, status.Errorf(codes.InvalidArgument, "unknown certificate kind %v", req.GetKind())
}

// signXDS issues the certificate the workload's xDS stream presents: it
// names the Dataplane (IdentityURI), which no other stream can claim.
func (s *Server) signXDS(id xds.Identity, csr *x509.CertificateRequest) (*dataplanev1.SignResponse, error) {
	u := IdentityURI(id)
	chain, err := s.cfg.XDSCA.IssueLeaf(csr, ca.Leaf{CommonName: id.NodeID, URIs: []*url.URL{u}}, XDSClientValidity)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &dataplanev1.SignResponse{CertificateChain: ca.EncodeCerts(chain...), TrustBundle: s.cfg.XDSBundle, ExpiresAt: chain[0].NotAfter.Unix()}, nil
}

// signWorkload issues the workload certificate of the mesh CA with the
// identities of the Dataplane's inbounds, as stored now.
func (s *Server) signWorkload(ctx context.Context, sess *session, csr *x509.CertificateRequest) (*dataplanev1.SignResponse, error) {
	res, err := s.cfg.Store.Get(ctx, sess.key)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "Dataplane %s: %v", sess.id.NodeID, err)
	}
	dp, err := xds.ParseDataplane(res, sess.id.Namespace)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	leaf := ca.Leaf{CommonName: sess.id.NodeID}
	for _, id := range dp.Identities() {
		u, err := url.Parse(id)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "identity %q: %v", id, err)
		}
		leaf.URIs = append(leaf.URIs, u)
	}
	chain, bundle, expires, err := s.cfg.CA.Issue(dp.Mesh, csr, leaf)
	if errors.Is(err, meshca.ErrNotReady) {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &dataplanev1.SignResponse{CertificateChain: chain, TrustBundle: bundle, ExpiresAt: expires.Unix()}, nil
}

// IdentityURI is the URI SAN of an xDS client certificate:
// meridian://dataplane?mesh=M&namespace=NS&name=N&token=T.
func IdentityURI(id xds.Identity) *url.URL {
	q := url.Values{}
	q.Set("mesh", id.Mesh)
	q.Set("namespace", id.Namespace)
	q.Set("name", id.Name)
	q.Set("token", id.TokenID)
	return &url.URL{Scheme: "meridian", Host: "dataplane", RawQuery: q.Encode()}
}

// IdentityOf reads an xDS client certificate's identity; the caller has
// verified the certificate to the zone's xDS CA.
func IdentityOf(cert *x509.Certificate) (xds.Identity, error) {
	for _, u := range cert.URIs {
		if u.Scheme != "meridian" || u.Host != "dataplane" {
			continue
		}
		q := u.Query()
		id := xds.Identity{Mesh: q.Get("mesh"), Namespace: q.Get("namespace"), Name: q.Get("name"), TokenID: q.Get("token")}
		if id.Mesh == "" || id.Name == "" || id.TokenID == "" {
			break
		}
		id.NodeID = xds.NodeID(id.Mesh, id.Name, id.Namespace)
		return id, nil
	}
	return xds.Identity{}, fmt.Errorf("%w: the client certificate names no Dataplane", xds.ErrUnauthenticated)
}

// Sweep removes the Dataplanes whose agent has been gone past the grace
// period; run it every few seconds.
func (s *Server) Sweep(ctx context.Context) {
	now := s.cfg.Now()
	s.mu.Lock()
	due := map[string]resource.Key{}
	for node, g := range s.gone {
		if now.Sub(g.at) >= s.cfg.Grace {
			due[node] = g.key
		}
	}
	s.mu.Unlock()
	for node, key := range due {
		s.remove(ctx, node, key)
	}
}

// remove deletes a node's Dataplane unless its agent came back meanwhile.
func (s *Server) remove(ctx context.Context, node string, key resource.Key) {
	unlock := s.lockNode(node)
	defer unlock()
	s.mu.Lock()
	g, still := s.gone[node]
	live := s.sessions[node] != nil
	s.mu.Unlock()
	if !still || live || g.key != key {
		return
	}
	if err := s.cfg.Store.Delete(ctx, key, 0); err != nil && !errors.Is(err, storage.ErrNotFound) {
		s.cfg.Logger.Warn("removing a Dataplane whose agent is gone", "dataplane", key, "error", err)
		return // tried again at the next sweep
	}
	s.mu.Lock()
	delete(s.gone, node)
	s.mu.Unlock()
	s.cfg.Logger.Info("Dataplane removed: its agent is gone", "dataplane", key, "grace", s.cfg.Grace)
}

// Adopt starts the grace period of every agent-registered Dataplane of the
// store that has no session (after a restart: their agents come back, or
// they go).
func (s *Server) Adopt(ctx context.Context) error {
	res, err := s.cfg.Store.List(ctx, storage.ListOptions{Type: "Dataplane", Labels: map[string]string{LabelManagedBy: ManagedByAgent}})
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range res.Items {
		node := xds.NodeID(r.Mesh, r.Name, s.cfg.Plane.Namespace(r.Namespace))
		if s.sessions[node] == nil {
			if _, ok := s.gone[node]; !ok {
				s.gone[node] = goneNode{key: r.Key(), at: now}
			}
		}
	}
	return nil
}

// Run sweeps until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Adopt(ctx); err != nil {
		return err
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Sweep(ctx)
		}
	}
}
