package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-mesh/meridian/internal/xds"
)

// An Envoy sidecar (docs/dataplane.md#envoy): the agent writes Envoy's
// bootstrap (ADS through the agent's relay to the zone, SDS from the
// agent) and serves the workload certificate and the mesh's
// trust bundle over SDS on a unix socket in its directory, so the key
// reaches Envoy on the machine it was made on and nowhere else.

const (
	// EnvoyBootstrapFile is Envoy's bootstrap in the agent's directory.
	EnvoyBootstrapFile = "envoy.json"
	// SDSSocket is the agent's SDS server, a unix socket (0600).
	SDSSocket = "sds.sock"
	// EnvoyAdminPort is where Envoy's admin listens (loopback), as in Kuma;
	// the zone's MeshMetric listener scrapes it.
	EnvoyAdminPort = xds.EnvoyAdminPort
	adsCluster     = "ads_cluster"
)

// EnvoyBootstrap is the path of Envoy's bootstrap.
func (j *Joined) EnvoyBootstrap() string { return filepath.Join(j.agent.cfg.Dir, EnvoyBootstrapFile) }

// WriteEnvoyBootstrap writes Envoy's bootstrap, checked against Envoy's
// own constraints first.
func (j *Joined) WriteEnvoyBootstrap() error {
	a := j.agent
	h2, err := anypb.New(&upstreamhttpv3.HttpProtocolOptions{UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
			Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})
	if err != nil {
		return err
	}
	grpcCluster := func(name string, addr *corev3.Address) *clusterv3.Cluster {
		return &clusterv3.Cluster{
			Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
			ConnectTimeout:                durationpb.New(defaultConnectTimeout),
			TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2},
			LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}}}},
			}}},
		}
	}
	// ADS through the agent's relay (relay.go), as gRPC workloads do.
	ads := grpcCluster(adsCluster, &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: a.relayPath()}}})
	ads.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
	sds := grpcCluster(xds.AgentSDSCluster, &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: filepath.Join(a.cfg.Dir, SDSSocket)}}})
	sds.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
	adsSource := &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
	b := &bootstrapv3.Bootstrap{
		Node: &corev3.Node{Id: j.NodeID(), Cluster: j.info.GetMesh(), Locality: &corev3.Locality{Zone: j.Zone()},
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"meridian.io/dataplane":   structpb.NewStringValue(j.info.GetName()),
				"meridian.io/namespace":   structpb.NewStringValue(j.info.GetNamespace()),
				"meridian.io/proxy":       structpb.NewStringValue(xds.ProxyEnvoy),
				xds.MetadataAccessLogPipe: structpb.NewStringValue(filepath.Join(a.cfg.Dir, AccessLogPipe)),
			}}},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{ads, sds}},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &corev3.ApiConfigSource{ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3,
				SetNodeOnFirstMessageOnly: true,
				GrpcServices:              []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: adsCluster}}}}},
			LdsConfig: adsSource, CdsConfig: adsSource,
		},
		Admin: &bootstrapv3.Admin{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: EnvoyAdminPort}}}}},
	}
	if err := b.ValidateAll(); err != nil {
		return fmt.Errorf("envoy bootstrap: %w", err)
	}
	raw, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(b)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(a.cfg.Dir, EnvoyBootstrapFile), raw)
}

// defaultConnectTimeout bounds the bootstrap clusters' connects.
const defaultConnectTimeout = 5 * time.Second

// SDS serves a joined Dataplane's certificates to its Envoy. Stop it
// with Close.
type SDS struct {
	j     *Joined
	cache cachev3.SnapshotCache
	srv   *grpc.Server
	mu    sync.Mutex
	last  string // the version served
}

// ServeSDS starts the agent's SDS server on the unix socket in its
// directory and keeps it current as certificates are renewed.
func (j *Joined) ServeSDS(ctx context.Context) (*SDS, error) {
	path := filepath.Join(j.agent.cfg.Dir, SDSSocket)
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, &Error{What: "cannot serve SDS", Where: path, Err: err}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	s := &SDS{j: j, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), srv: grpc.NewServer()}
	secretv3.RegisterSecretDiscoveryServiceServer(s.srv, serverv3.NewServer(ctx, s.cache, nil))
	if err := s.Update(ctx); err != nil {
		ln.Close()
		return nil, err
	}
	j.agent.onRenew(func() {
		if err := s.Update(ctx); err != nil {
			j.agent.cfg.Logger.Warn("updating SDS secrets", "error", err)
		}
	})
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Update serves the certificate files as they are now.
func (s *SDS) Update(ctx context.Context) error {
	dir := filepath.Join(s.j.agent.cfg.Dir, CertsDir)
	cert, key, ca := readOrNil(filepath.Join(dir, "cert.pem")), readOrNil(filepath.Join(dir, "key.pem")), readOrNil(filepath.Join(dir, "ca.pem"))
	if cert == nil || key == nil || ca == nil {
		return &Error{What: "no workload certificate to serve over SDS", Where: dir, Err: errors.New("missing files")}
	}
	mesh := s.j.info.GetMesh()
	secrets := []types.Resource{
		&tlsv3.Secret{Name: xds.IdentitySecret(mesh), Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: cert}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: key}},
		}}},
		&tlsv3.Secret{Name: xds.CASecret(mesh), Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: ca}},
		}}},
	}
	h := sha256.New()
	for _, r := range secrets {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
		if err != nil {
			return err
		}
		h.Write(b)
	}
	version := hex.EncodeToString(h.Sum(nil))[:16]
	s.mu.Lock()
	defer s.mu.Unlock()
	if version == s.last {
		return nil
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.SecretType: secrets})
	if err != nil {
		return err
	}
	if err := s.cache.SetSnapshot(ctx, s.j.NodeID(), snap); err != nil {
		return err
	}
	s.last = version
	return nil
}

// Close stops serving.
func (s *SDS) Close() { s.srv.Stop() }

// onRenew registers fn to run after each renewal of the certificates.
func (a *Agent) onRenew(fn func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.renewed = append(a.renewed, fn)
}
