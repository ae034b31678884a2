package xds

import (
	"context"
	"crypto/sha256"
	"errors"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meridian-mesh/meridian/internal/policy"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// testServer serves xDS on loopback; a stream's identity is the node id
// in its "node" metadata (the real server reads it from the client
// certificate).
func testServer(t *testing.T) (*Server, discoveryv3.AggregatedDiscoveryServiceClient) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := NewServer(ctx, ServerConfig{Identify: func(ctx context.Context) (Identity, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("node"); len(v) == 1 {
			mesh, name, _ := strings.Cut(v[0], ".")
			return Identity{NodeID: v[0], Mesh: mesh, Name: name, TokenID: "t-" + v[0]}, nil
		}
		return Identity{}, ErrUnauthenticated
	}})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.Register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
}

func listenerResources(names ...string) *Resources {
	res := &Resources{}
	for _, n := range names {
		res.Listeners = append(res.Listeners, &listenerv3.Listener{Name: n})
		res.shape(resourcev3.ListenerType, n, [][]policy.Origin{{{Meta: policy.Meta{Type: "MeshTimeout", Name: "t-" + n}}}})
	}
	return res
}

// adsStream is a client stream whose responses one goroutine reads.
type adsStream struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	ch chan recvResult
}

type recvResult struct {
	resp *discoveryv3.DiscoveryResponse
	err  error
}

func openStream(t *testing.T, c discoveryv3.AggregatedDiscoveryServiceClient, as string) *adsStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if as != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "node", as)
	}
	st, err := c.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := &adsStream{AggregatedDiscoveryService_StreamAggregatedResourcesClient: st, ch: make(chan recvResult, 16)}
	go func() {
		for {
			r, err := st.Recv()
			out.ch <- recvResult{r, err}
			if err != nil {
				return
			}
		}
	}()
	return out
}

// recv reads one response, failing after timeout.
func recv(t *testing.T, st *adsStream, timeout time.Duration) (*discoveryv3.DiscoveryResponse, error) {
	t.Helper()
	select {
	case r := <-st.ch:
		return r.resp, r.err
	case <-time.After(timeout):
		return nil, errTimeout
	}
}

var errTimeout = errors.New("no response")

func TestServerACKAndNACK(t *testing.T) {
	s, c := testServer(t)
	ctx := context.Background()
	if err := s.Set(ctx, "m.web-1", listenerResources("a", "b")); err != nil {
		t.Fatal(err)
	}
	st := openStream(t, c, "m.web-1")
	node := &corev3.Node{Id: "m.web-1"}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{"a", "b"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := recv(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResources()) != 2 {
		t.Fatalf("%d resources, want 2", len(resp.GetResources()))
	}
	// ACK.
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{"a", "b"},
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		st, _ := s.Status("m.web-1")
		l := st.Types["Listener"]
		return st.Connected && l != nil && l.Acked == resp.GetVersionInfo() && l.Sent == resp.GetVersionInfo()
	})
	// Setting the same resources again sends nothing.
	if err := s.Set(ctx, "m.web-1", listenerResources("a", "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := recv(t, st, 200*time.Millisecond); !errors.Is(err, errTimeout) {
		t.Fatalf("unchanged resources were sent again: %v", err)
	}
	// A change is pushed; the proxy rejects it.
	if err := s.Set(ctx, "m.web-1", listenerResources("a", "c")); err != nil {
		t.Fatal(err)
	}
	resp2, err := recv(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp2.GetVersionInfo() == resp.GetVersionInfo() {
		t.Fatal("a change kept its version")
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{"a", "b"},
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp2.GetNonce(), ErrorDetail: &status.Status{Message: "listener c: bad filter"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		st, _ := s.Status("m.web-1")
		l := st.Types["Listener"]
		return l != nil && l.Nack != nil
	})
	status, _ := s.Status("m.web-1")
	l := status.Types["Listener"]
	if l.Acked != resp.GetVersionInfo() || l.Nack.Version != resp2.GetVersionInfo() || l.Nack.Message != "listener c: bad filter" {
		t.Fatalf("after the NACK: %+v %+v", l, l.Nack)
	}
	if strings.Join(l.Nack.Policies, ",") != "MeshTimeout t-a,MeshTimeout t-c" {
		t.Fatalf("NACK names %v", l.Nack.Policies)
	}
	// A rejected version is not sent again.
	if _, err := recv(t, st, 300*time.Millisecond); !errors.Is(err, errTimeout) {
		t.Fatalf("a rejected version was retried: %v", err)
	}
	// The next change clears the NACK once acknowledged.
	if err := s.Set(ctx, "m.web-1", listenerResources("a")); err != nil {
		t.Fatal(err)
	}
	resp3, err := recv(t, st, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{"a"},
		VersionInfo: resp3.GetVersionInfo(), ResponseNonce: resp3.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		st, _ := s.Status("m.web-1")
		l := st.Types["Listener"]
		return l.Nack == nil && l.Acked == resp3.GetVersionInfo()
	})
}

func TestServerRefusesOtherNodes(t *testing.T) {
	s, c := testServer(t)
	if err := s.Set(context.Background(), "m.backend-1", listenerResources("secret")); err != nil {
		t.Fatal(err)
	}
	// No identity: refused before anything is sent.
	st := openStream(t, c, "")
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "m.backend-1"}, TypeUrl: resourcev3.ListenerType})
	if _, err := recv(t, st, 5*time.Second); grpcstatus.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream without identity: %v", err)
	}
	// web-1 asking as backend-1.
	st = openStream(t, c, "m.web-1")
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "m.backend-1"}, TypeUrl: resourcev3.ListenerType})
	resp, err := recv(t, st, 5*time.Second)
	if grpcstatus.Code(err) != codes.PermissionDenied || len(resp.GetResources()) > 0 {
		t.Fatalf("web-1 asking for backend-1: %v %v", resp, err)
	}
	// A stream that started as web-1 cannot switch node later.
	if err := s.Set(context.Background(), "m.web-1", listenerResources("a")); err != nil {
		t.Fatal(err)
	}
	st = openStream(t, c, "m.web-1")
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "m.web-1"}, TypeUrl: resourcev3.ListenerType})
	if _, err := recv(t, st, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "m.backend-1"}, TypeUrl: resourcev3.ClusterType})
	if _, err := recv(t, st, 5*time.Second); grpcstatus.Code(err) != codes.PermissionDenied {
		t.Fatalf("switching node: %v", err)
	}
}

func TestServerEndsStreams(t *testing.T) {
	s, c := testServer(t)
	if err := s.Set(context.Background(), "m.web-1", listenerResources("a")); err != nil {
		t.Fatal(err)
	}
	st := openStream(t, c, "m.web-1")
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "m.web-1"}, TypeUrl: resourcev3.ListenerType})
	if _, err := recv(t, st, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(s.Connected()) == 1 })
	if n := s.End(func(id Identity) bool { return id.TokenID == "t-m.web-1" }, "dataplane token t was revoked"); n != 1 {
		t.Fatalf("ended %d streams", n)
	}
	_, err := recv(t, st, 5*time.Second)
	if grpcstatus.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("ended stream: %v", err)
	}
	waitFor(t, func() bool {
		st, _ := s.Status("m.web-1")
		return !st.Connected && len(s.Connected()) == 0
	})
}

// TestVersionsAreContentHashes: the same resources in any order have the
// same version; a change of one byte changes it; a digest known in
// advance stands for encoding the resource.
func TestVersionsAreContentHashes(t *testing.T) {
	version := func(res *Resources) string {
		t.Helper()
		v, err := Versions(res)
		if err != nil {
			t.Fatal(err)
		}
		return v[resourcev3.ListenerType]
	}
	a := &Resources{Listeners: []types.Resource{&listenerv3.Listener{Name: "a"}, &listenerv3.Listener{Name: "b"}}}
	b := &Resources{Listeners: []types.Resource{&listenerv3.Listener{Name: "b"}, &listenerv3.Listener{Name: "a"}}}
	c := &Resources{Listeners: []types.Resource{&listenerv3.Listener{Name: "a"}, &listenerv3.Listener{Name: "b", StatPrefix: "x"}}}
	va, vb, vc := version(a), version(b), version(c)
	if va != vb || va == vc {
		t.Fatalf("versions %s %s %s", va, vb, vc)
	}
	enc, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c.Listeners[1])
	known := &Resources{Listeners: []types.Resource{&listenerv3.Listener{Name: "a"}, &listenerv3.Listener{Name: "b"}}}
	known.setSum(listListeners, 1, sha256.Sum256(enc))
	if vk := version(known); vk != vc {
		t.Fatalf("version with a known digest %s, computed %s", vk, vc)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
	}
}

// TestServerDelta: a delta stream (what Envoy prefers) sends the node on
// its first request only; responses are acknowledged by nonce; a
// rejection is recorded and not answered with the same resources again.
func TestServerDelta(t *testing.T) {
	s, c := testServer(t)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "node", "m.web-1"))
	defer cancel()
	if err := s.Set(ctx, "m.web-1", listenerResources("a", "b")); err != nil {
		t.Fatal(err)
	}
	st, err := c.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *discoveryv3.DeltaDiscoveryResponse, 8)
	errs := make(chan error, 1)
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				errs <- err
				return
			}
			ch <- r
		}
	}()
	next := func(timeout time.Duration) *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case err := <-errs:
			t.Fatalf("stream ended: %v", err)
		case <-time.After(timeout):
		}
		return nil
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "m.web-1"}, TypeUrl: resourcev3.ListenerType,
		ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	r := next(5 * time.Second)
	if r == nil || len(r.GetResources()) != 2 {
		t.Fatalf("first response: %v", r)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ListenerType, ResponseNonce: r.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		st, _ := s.Status("m.web-1")
		l := st.Types["Listener"]
		return l != nil && l.Acked != "" && l.Acked == l.Sent
	})
	if err := s.Set(ctx, "m.web-1", listenerResources("a", "c")); err != nil {
		t.Fatal(err)
	}
	r = next(5 * time.Second)
	if r == nil || len(r.GetResources()) != 1 || r.GetResources()[0].GetName() != "c" || len(r.GetRemovedResources()) != 1 {
		t.Fatalf("delta response: %v", r)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ListenerType, ResponseNonce: r.GetNonce(),
		ErrorDetail: &status.Status{Message: "listener c: bad"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		st, _ := s.Status("m.web-1")
		l := st.Types["Listener"]
		return l.Nack != nil && l.Nack.Message == "listener c: bad"
	})
	if r := next(300 * time.Millisecond); r != nil {
		t.Fatalf("a rejected delta was sent again: %v", r)
	}
}

// TestEqualResourcesAreShared: nodes given equal resources hold one copy;
// a copy lives while some node holds it.
func TestEqualResourcesAreShared(t *testing.T) {
	s, _ := testServer(t)
	ctx := context.Background()
	for _, node := range []string{"m.web-1", "m.web-2"} {
		if err := s.Set(ctx, node, listenerResources("a", "b")); err != nil {
			t.Fatal(err)
		}
	}
	r1, _, _ := s.Current("m.web-1")
	r2, _, _ := s.Current("m.web-2")
	if r1.Listeners[0] != r2.Listeners[0] || r1.Listeners[1] != r2.Listeners[1] {
		t.Fatal("equal listeners of two nodes are separate copies")
	}
	if n := len(s.interned.entries); n != 2 {
		t.Fatalf("%d interned resources, want 2", n)
	}
	// web-1 moves on: "b" is still web-2's, "c" is new.
	if err := s.Set(ctx, "m.web-1", listenerResources("a", "c")); err != nil {
		t.Fatal(err)
	}
	if n := len(s.interned.entries); n != 3 {
		t.Fatalf("%d interned resources, want 3", n)
	}
	// Setting equal resources again keeps one reference per node.
	if err := s.Set(ctx, "m.web-2", listenerResources("a", "b")); err != nil {
		t.Fatal(err)
	}
	// So does setting the very list the node holds (a rendering that
	// changed another type): its version and references stand.
	held, versions, _ := s.Current("m.web-2")
	again := *held
	if err := s.Set(ctx, "m.web-2", &again); err != nil {
		t.Fatal(err)
	}
	if _, v, _ := s.Current("m.web-2"); !maps.Equal(v, versions) {
		t.Fatalf("versions after setting the same lists: %v, before %v", v, versions)
	}
	if n := len(s.interned.entries); n != 3 {
		t.Fatalf("%d interned resources after setting the same lists, want 3", n)
	}
	s.Forget("m.web-2")
	if n := len(s.interned.entries); n != 2 {
		t.Fatalf("%d interned resources after web-2 left, want 2 (web-1's)", n)
	}
	s.Forget("m.web-1")
	if n := len(s.interned.entries); n != 0 {
		t.Fatalf("%d interned resources with no node, want 0", n)
	}
}

func TestAccessLogPipeOfNodeMetadata(t *testing.T) {
	for _, tc := range []struct {
		pipe, want string
	}{
		{"/run/dp/access-logs.pipe", "/run/dp/access-logs.pipe"},
		{"relative/pipe", ""},
		{"/run/../etc/passwd", ""},
		{"/run/dp/\npipe", ""},
		{"/" + strings.Repeat("a", 1100), ""},
		{"", ""},
	} {
		node := &corev3.Node{Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{MetadataAccessLogPipe: structpb.NewStringValue(tc.pipe)}}}
		if got := accessLogPipeOf(node); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.pipe, got, tc.want)
		}
	}
}

// TestVersionIgnoresOrder: a list's version is that of its resources by
// name, whichever order it holds them in, and changes with a digest.
func TestVersionIgnoresOrder(t *testing.T) {
	names := []string{"a", "b", "b2", "c"}
	items := make([]types.Resource, len(names))
	sums := make([][sha256.Size]byte, len(names))
	for i, n := range names {
		items[i] = &listenerv3.Listener{Name: n}
		sums[i] = sha256.Sum256([]byte(n))
	}
	sorted, buf := versionOf(items, sums, nil)
	for _, order := range [][]int{{3, 2, 1, 0}, {1, 0, 2, 3}, {0, 1, 3, 2}} {
		shuffled := make([]types.Resource, len(order))
		shuffledSums := make([][sha256.Size]byte, len(order))
		for i, j := range order {
			shuffled[i], shuffledSums[i] = items[j], sums[j]
		}
		var v string
		if v, buf = versionOf(shuffled, shuffledSums, buf); v != sorted {
			t.Errorf("order %v: version %s, in name order %s", order, v, sorted)
		}
	}
	sums[2][0]++
	if v, _ := versionOf(items, sums, buf); v == sorted {
		t.Error("a changed digest kept the version")
	}
}
