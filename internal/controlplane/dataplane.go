package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/dataplane"
	"github.com/meridian-mesh/meridian/internal/meshca"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/policyview"
	"github.com/meridian-mesh/meridian/internal/revocation"
	"github.com/meridian-mesh/meridian/internal/xds"
	"github.com/wI2L/jsondiff"
)

// DefaultXDSAddress is where a zone serves xDS and the agents' service.
const DefaultXDSAddress = "127.0.0.1:5678"

// metaDataplaneTokens is the store meta key of revoked Dataplane tokens.
const metaDataplaneTokens = "auth/revoked-dataplane-tokens"

// dataPlane is a zone's data plane: the mesh CA, the agents' service, the
// endpoints and the xDS server, on one gRPC listener.
type dataPlane struct {
	view    *policyview.View
	tokens  *auth.DataplaneTokens
	revoked *revocation.List
	agents  *dataplane.Server
	xds     *xds.Server
	meshCA  *meshca.Zone
	ctrl    *xds.Controller
}

// startDataPlane starts the zone's data plane and points the API at it;
// everything stops with ctx.
func (p *process) startDataPlane(ctx context.Context, view *policyview.View, programmed *atomic.Pointer[xds.Controller]) (err error) {
	cfg := p.cfg
	dp := &dataPlane{view: view}
	if dp.tokens, err = auth.LoadOrCreateDataplaneTokens(cfg.DataDir, nil); err != nil {
		return err
	}
	if dp.revoked, err = revocation.Open(ctx, revocation.Config{Store: p.store, MetaKey: metaDataplaneTokens, Remember: auth.MaxValidity}); err != nil {
		return err
	}
	if dp.meshCA, err = meshca.NewZone(meshca.ZoneConfig{Zone: cfg.Plane.Zone, Standalone: !cfg.Plane.Federated,
		Config: meshca.Config{Store: p.store, Logger: cfg.Logger.Named("meshca"), Rand: rand.Reader}}); err != nil {
		return err
	}
	serverTLS, err := auth.LoadOrCreateServerTLS(auth.ServerTLSConfig{CertFile: cfg.XDSTLSCertFile, KeyFile: cfg.XDSTLSKeyFile,
		DataDir: cfg.DataDir, Name: "xds-server"})
	if err != nil {
		return fmt.Errorf("xds tls: %w", err)
	}
	bundle, err := os.ReadFile(serverTLS.CertFile)
	if err != nil {
		return fmt.Errorf("xds tls: %w", err)
	}
	clientCA, err := auth.LoadOrCreateCA(cfg.DataDir, auth.XDSClientCAName, "zone "+cfg.Plane.Zone+" xDS clients", time.Now)
	if err != nil {
		return err
	}
	if dp.xds, err = xds.NewServer(ctx, xds.ServerConfig{Identify: dp.identify, Logger: cfg.Logger.Named("xds"), Metrics: p.metrics}); err != nil {
		return err
	}
	adm, err := admission.New(admission.Config{Registry: p.reg, Plane: cfg.Plane})
	if err != nil {
		return err
	}
	if dp.agents, err = dataplane.NewServer(dataplane.Config{Store: p.store, Registry: p.reg, Plane: cfg.Plane, Admission: adm,
		Tokens: dp.tokens, Revoked: dp.revoked, CA: dp.meshCA, XDSCA: clientCA, XDSBundle: bundle, EndStreams: dp.endStreams,
		Grace: cfg.DataplaneGrace, Logger: cfg.Logger.Named("agents")}); err != nil {
		return err
	}
	endpoints, err := dataplane.NewEndpoints(dataplane.EndpointsConfig{Store: p.store, Plane: cfg.Plane,
		Live: dp.agents.Live, Presence: dp.agents.Changed, Logger: cfg.Logger.Named("endpoints")})
	if err != nil {
		return err
	}
	dp.ctrl, err = xds.NewController(xds.ControllerConfig{Server: dp.xds, Zone: cfg.Plane.Zone, Logger: cfg.Logger.Named("xds"),
		Sources: xds.Sources{Snapshot: view.Snapshot, Changed: view.Changed, Endpoints: endpoints.Of, EndpointsChanged: endpoints.Changed,
			MTLS: func(mesh string) bool { return dp.meshCA.MTLS(mesh).Enabled }, MTLSChanged: dp.meshCA.Changed,
			SnapshotGen: view.SnapshotGen, ChangedSince: view.ChangedSince},
		ProgrammedChanged: view.DecorationsChanged})
	if err != nil {
		return err
	}
	dp.xds.OnConnect(func(string) { dp.ctrl.Kick() })
	programmed.Store(dp.ctrl)
	gs, ln, err := p.newXDSServer(serverTLS, clientCA.Cert)
	if err != nil {
		return err
	}
	dp.xds.Register(gs)
	dp.agents.Register(gs)
	p.api.DataplaneTokens, p.api.XDS = dp, dp
	p.run(ctx, dp.meshCA.Run)
	p.run(ctx, dp.agents.Run)
	p.run(ctx, endpoints.Run)
	p.run(ctx, dp.ctrl.Run)
	p.run(ctx, func(ctx context.Context) error {
		// Stopped when the process ends, before the store closes.
		stopped := context.AfterFunc(ctx, func() { stopGRPC(gs, cfg.ShutdownTimeout/2) })
		defer stopped()
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("xds server: %w", err)
		}
		return nil
	})
	cfg.Logger.Info("xds listening", "address", ln.Addr().String(), "cert", serverTLS.CertFile, "generated_cert", serverTLS.Generated)
	return nil
}

// reportProgrammed adds to a global policy's status in the report to the
// global its Programmed condition when some connected proxy leaves part of
// it out (docs/dataplane.md#programmed); ctrl is set once the data plane
// runs.
func reportProgrammed(ctrl *atomic.Pointer[xds.Controller]) func(*policy.MeshSnapshot, *policy.GlobalPolicyStatus) {
	return func(snap *policy.MeshSnapshot, st *policy.GlobalPolicyStatus) {
		c := ctrl.Load()
		if c == nil {
			return
		}
		if cond, ok := c.ProgrammedProblem(snap, st.Mesh, st.Type, st.LocalName, st.LocalNamespace); ok {
			// The list's conditions are the snapshot's: never written.
			st.Conditions = append(slices.Clip(st.Conditions), cond)
		}
	}
}

// newXDSServer binds the xDS address: TLS with the zone's xDS certificate;
// a client certificate of the zone's xDS client CA identifies a workload's
// xDS stream, the agents authenticate with their Dataplane tokens.
func (p *process) newXDSServer(serverTLS *auth.ServerTLS, clientCA *x509.Certificate) (*grpc.Server, net.Listener, error) {
	pool := x509.NewCertPool()
	pool.AddCert(clientCA)
	tlsCfg := serverTLS.Config.Clone()
	tlsCfg.ClientAuth, tlsCfg.ClientCAs = tls.VerifyClientCertIfGiven, pool
	ln, err := net.Listen("tcp", p.cfg.XDSAddress)
	if err != nil {
		return nil, nil, fmt.Errorf("xds address %s: %w", p.cfg.XDSAddress, err)
	}
	gs := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.MaxHeaderListSize(64<<10),
		grpc.MaxRecvMsgSize(4<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.ConnectionTimeout(10*time.Second),
		// A zone holds a connection per proxy (its agent's, which
		// relays the workload's xDS streams) whose inbound messages are
		// small (requests, ACKs, CSRs). No read buffer of grpc-go's own
		// (32 KiB by default): the TLS connection under the framer
		// buffers its records already.
		grpc.ReadBufferSize(0),
		// Proxies joining and acknowledging are work: the memory
		// trimmer hands the garbage back once they are quiet.
		grpc.StatsHandler(p.trimmer.GRPCStats()),
	)
	return gs, ln, nil
}

// identify reads a workload's xDS stream identity from its verified client
// certificate; a revoked token's certificate is refused.
func (dp *dataPlane) identify(ctx context.Context) (xds.Identity, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return xds.Identity{}, fmt.Errorf("%w: no peer", xds.ErrUnauthenticated)
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 {
		return xds.Identity{}, fmt.Errorf("%w: xDS streams present the client certificate meridian-dp writes for the workload", xds.ErrUnauthenticated)
	}
	id, err := dataplane.IdentityOf(info.State.VerifiedChains[0][0])
	if err != nil {
		return xds.Identity{}, err
	}
	if dp.revoked.Revoked(id.TokenID) {
		return xds.Identity{}, fmt.Errorf("%w: dataplane token %s was revoked", xds.ErrUnauthenticated, id.TokenID)
	}
	return id, nil
}

func (dp *dataPlane) endStreams(match func(xds.Identity) bool, reason string) {
	dp.xds.End(match, reason)
}

// Issue issues a Dataplane token (api.DataplaneTokens).
func (dp *dataPlane) Issue(req auth.DataplaneTokenRequest) (string, auth.DataplaneClaims, error) {
	return dp.tokens.Issue(req)
}

// Revoke revokes a Dataplane token and ends its sessions and streams.
func (dp *dataPlane) Revoke(ctx context.Context, id string) (int, error) {
	if err := dp.revoked.Revoke(ctx, id); err != nil {
		return 0, err
	}
	n := dp.xds.End(func(i xds.Identity) bool { return i.TokenID == id }, "dataplane token "+id+" was revoked")
	dp.agents.Revoke(id)
	return n, nil
}

// XDS is a Dataplane's data plane state (api.XDSState).
func (dp *dataPlane) XDS(ctx context.Context, mesh, name, namespace string, q api.XDSQuery) (any, error) {
	kind := q.Proxy
	if kind == "" {
		kind = dp.xds.Kind(xds.NodeID(mesh, name, namespace)) // the kind its proxy connected as
	}
	if kind == "" {
		kind = xds.ProxyGRPC
	}
	if q.Shadow {
		return dp.shadow(ctx, kind, mesh, name, namespace, q.Diff)
	}
	res, err := dp.ctrl.Inspect(ctx, kind, mesh, name, namespace)
	if err != nil {
		return nil, err
	}
	raw, err := dumpJSON(res)
	if err != nil {
		return nil, err
	}
	node := xds.NodeID(mesh, name, namespace)
	conn, _ := dp.xds.Status(node)
	return xds.View{Node: node, Proxy: kind, Agent: dp.agents.Status(node), Connection: conn, MTLS: dp.meshCA.MTLS(mesh),
		ConfigDump: raw, Policies: res.Shaped(), Dropped: res.Dropped}, nil
}

// ShadowView is `_xds?shadow=true`: the configuration as if the policies
// labelled kuma.io/effect: shadow were applied, and with include=diff a
// JSON patch from the real one to it (Kuma's shape).
type ShadowView struct {
	XDS  json.RawMessage `json:"xds"`
	Diff *jsondiff.Patch `json:"diff,omitempty"` // with include=diff; [] when they are the same
}

func (dp *dataPlane) shadow(ctx context.Context, kind, mesh, name, namespace string, diff bool) (any, error) {
	snap, err := dp.view.ShadowSnapshot(ctx, mesh)
	if err != nil {
		return nil, err
	}
	shadow, err := dp.ctrl.InspectWith(snap, kind, mesh, name, namespace)
	if err != nil {
		return nil, err
	}
	shadowDump, err := dumpJSON(shadow)
	if err != nil {
		return nil, err
	}
	out := ShadowView{XDS: shadowDump}
	if !diff {
		return out, nil
	}
	real, err := dp.ctrl.Inspect(ctx, kind, mesh, name, namespace)
	if err != nil {
		return nil, err
	}
	realDump, err := dumpJSON(real)
	if err != nil {
		return nil, err
	}
	patch, err := jsondiff.CompareJSON(realDump, shadowDump)
	if err != nil {
		return nil, fmt.Errorf("shadow diff: %w", err)
	}
	if patch == nil {
		patch = jsondiff.Patch{}
	}
	out.Diff = &patch
	return out, nil
}

// dumpJSON is res as an Envoy admin config dump, in JSON.
func dumpJSON(res *xds.Resources) (json.RawMessage, error) {
	versions, err := xds.Versions(res)
	if err != nil {
		return nil, err
	}
	dump, err := xds.ConfigDump(res, versions)
	if err != nil {
		return nil, err
	}
	return xds.MarshalJSON(dump)
}

// ConfigWarnings names what the proxy of a Dataplane an agent runs is not
// given (api.XDSState).
func (dp *dataPlane) ConfigWarnings(ctx context.Context, mesh, name, namespace string) ([]string, error) {
	if dp.agents.Status(xds.NodeID(mesh, name, namespace)).Token == "" {
		return nil, nil // no agent: no proxy the zone configures
	}
	res, err := dp.ctrl.Inspect(ctx, xds.ProxyGRPC, mesh, name, namespace)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(res.Dropped))
	for i, d := range res.Dropped {
		out[i] = "not given to the proxy (grpc): " + d
	}
	return out, nil
}

// Programmed is a policy's Programmed condition (api.XDSState).
func (dp *dataPlane) Programmed(snap *policy.MeshSnapshot, mesh, policyType, name, namespace string) (policy.Condition, bool) {
	return dp.ctrl.Programmed(snap, mesh, policyType, name, namespace)
}

// stopGRPC stops a gRPC server gracefully within timeout.
func stopGRPC(gs *grpc.Server, timeout time.Duration) {
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
