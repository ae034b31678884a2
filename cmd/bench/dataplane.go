package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	sotwclient "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-mesh/meridian/internal/agent"
	"github.com/meridian-mesh/meridian/internal/launcher"
)

// The data plane scenario (docs/dataplane.md): a global and two zones
// serving xDS, a mesh with mTLS.
//
//   - enforcement: real grpc-go workloads under meridian-dp in zone-2 (a
//     greeter and a client calling it every 2 ms); a MeshTrafficPermission
//     written on the global denies, then allows, the client, 30 times; each
//     change's latency is from the write to the first call that sees the
//     new decision;
//   - proxies: N simulated proxies join zone-1 in this process, each with
//     meridian-dp's own agent code (a Join session, its keys and
//     certificates, its xDS relay) and go-control-plane's ADS client
//     through that relay, so each proxy holds one connection to the zone,
//     as a meridian-dp does; one mesh-wide MeshTrafficPermission change on the global
//     changes every proxy's server listener, timed until all N have
//     acknowledged it; zone-1's RSS per connected proxy and its idle CPU
//     with them connected.

const meshWithMTLS = `{"type":"Mesh","name":"default","mtls":{"enabledBackend":"ca-1","backends":[{"name":"ca-1","type":"builtin"}]}}`

const allowAllMTP = `{"type":"MeshTrafficPermission","mesh":"default","name":"allow-all","spec":{"targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"action":"Allow"}}]}}`

func dataPlane(b binariesAndN, proxies int, r results) error {
	e, g, err := withGlobal(b)
	if err != nil {
		return err
	}
	defer e.close()
	z1, err := e.zone(g, "zone-1", "universal")
	if err != nil {
		return err
	}
	z2, err := e.zone(g, "zone-2", "universal")
	if err != nil {
		return err
	}
	if err := e.do("PUT", g.api+"/meshes/default", meshWithMTLS, nil); err != nil {
		return err
	}
	if err := e.do("PUT", g.api+"/meshes/default/meshtrafficpermissions/allow-all", allowAllMTP, nil); err != nil {
		return err
	}
	if err := enforcement(e, g, z2, r); err != nil {
		return fmt.Errorf("enforcement: %w", err)
	}
	if proxies > 0 {
		if err := manyProxies(e, g, z1, proxies, b.profileDir, r); err != nil {
			return fmt.Errorf("%d proxies: %w", proxies, err)
		}
	}
	return nil
}

// enforcement measures global write → the first call in zone-2 that sees
// the new decision.
func enforcement(e *env, g, z *plane, r results) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	server, err := e.workload(z, "greeter-1", "greeter", port, nil, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	defer server.Stop(5 * time.Second)
	clientPort, err := freePort()
	if err != nil {
		return err
	}
	calls := newCallLog()
	client, err := e.workload(z, "client-1", "client", clientPort, calls, "call", "--service", "greeter", "--every", "2ms", "--timeout", "1s")
	if err != nil {
		return err
	}
	defer client.Stop(5 * time.Second)
	if _, err := calls.await(time.Now(), "ok ", 60*time.Second); err != nil {
		return fmt.Errorf("the client never reached the greeter: %w (last: %s)", err, calls.last())
	}
	deny := `{"type":"MeshTrafficPermission","mesh":"default","name":"deny-client","spec":{"targetRef":{"kind":"MeshService","name":"greeter"},"from":[{"targetRef":{"kind":"MeshService","name":"client"},"default":{"action":"Deny"}}]}}`
	var lat []time.Duration
	for i := range 30 {
		time.Sleep(50 * time.Millisecond)
		want, method, body := "error PermissionDenied", "PUT", deny
		if i%2 == 1 {
			want, method, body = "ok ", "DELETE", ""
		}
		t0 := time.Now()
		if err := e.do(method, g.api+"/meshes/default/meshtrafficpermissions/deny-client", body, nil); err != nil {
			return err
		}
		at, err := calls.await(t0, want, 10*time.Second)
		if err != nil {
			return fmt.Errorf("change %d (%s): %w (last: %s)", i, want, err, calls.last())
		}
		lat = append(lat, at.Sub(t0))
	}
	slices.Sort(lat)
	r["enforce_p50_ms"] = msOf(lat[len(lat)/2])
	r["enforce_p99_ms"] = msOf(lat[(len(lat)*99+99)/100-1])
	return nil
}

// workload starts meridian-dp in zone z for Dataplane name (service svc on
// port) running the greeter with args; out, when set, receives its output.
func (e *env) workload(z *plane, name, svc string, port int, out io.Writer, args ...string) (*launcher.Process, error) {
	dir := filepath.Join(e.tmp, "workloads", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var tok struct {
		Token string `json:"token"`
	}
	if err := e.do("POST", z.api+"/tokens/dataplane", fmt.Sprintf(`{"mesh":"default","name":%q,"validFor":"2h"}`, name), &tok); err != nil {
		return nil, err
	}
	dp := fmt.Sprintf("type: Dataplane\nmesh: default\nname: %s\nnetworking:\n  address: 127.0.0.1\n  inbound:\n    - port: %d\n      tags:\n        kuma.io/service: %s\n", name, port, svc)
	for f, data := range map[string]string{"dataplane.yaml": dp, "token": tok.Token} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(data), 0o600); err != nil {
			return nil, err
		}
	}
	if out == nil {
		out = io.Discard
	}
	p := &launcher.Process{Name: name, Path: e.bins.MeridianDP, Log: out, Args: append([]string{"run",
		"--cp-address", "https://" + z.xds, "--dataplane-file", filepath.Join(dir, "dataplane.yaml"),
		"--dataplane-token-file", filepath.Join(dir, "token"), "--ca-cert-file", filepath.Join(z.dataDir, "xds-server.crt"),
		"--dir", filepath.Join(dir, "agent"), "--", e.bins.Greeter}, args...)}
	if err := p.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// callLog timestamps a client's output lines as they arrive.
type callLog struct {
	mu    sync.Mutex
	lines []timedLine
	part  string
	added chan struct{}
}

type timedLine struct {
	at   time.Time
	text string
}

func newCallLog() *callLog { return &callLog{added: make(chan struct{})} }

func (c *callLog) Write(p []byte) (int, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	sc := bufio.NewScanner(strings.NewReader(c.part + string(p)))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	c.part = ""
	if len(p) > 0 && p[len(p)-1] != '\n' && len(lines) > 0 {
		c.part, lines = lines[len(lines)-1], lines[:len(lines)-1]
	}
	for _, l := range lines {
		c.lines = append(c.lines, timedLine{now, l})
	}
	close(c.added)
	c.added = make(chan struct{})
	return len(p), nil
}

// await returns when the first line after since starting with prefix
// arrived.
func (c *callLog) await(since time.Time, prefix string, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	seen := 0
	for {
		c.mu.Lock()
		for ; seen < len(c.lines); seen++ {
			l := c.lines[seen]
			if l.at.After(since) && strings.HasPrefix(l.text, prefix) {
				c.mu.Unlock()
				return l.at, nil
			}
		}
		added := c.added
		c.mu.Unlock()
		select {
		case <-added:
		case <-deadline:
			return time.Time{}, fmt.Errorf("no %q within %s", prefix, timeout)
		}
	}
}

func (c *callLog) last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lines) == 0 {
		return "nothing"
	}
	return c.lines[len(c.lines)-1].text
}

func freePort() (int, error) {
	addr, err := launcher.FreeAddress()
	if err != nil {
		return 0, err
	}
	var port int
	_, err = fmt.Sscanf(addr[strings.LastIndex(addr, ":")+1:], "%d", &port)
	return port, err
}

// simProxy is one simulated proxy: its agent session and its ADS stream.
type simProxy struct {
	node   string
	conn   *grpc.ClientConn
	agent  *agent.Agent
	relay  *agent.Relay
	ads    sotwclient.ADSClient
	mu     sync.Mutex
	ackAt  time.Time // when the last response was acknowledged
	acked  string    // the version of the listeners last acknowledged
	nfirst atomic.Bool
}

// manyProxies joins n simulated proxies to z and measures a mesh-wide
// change, RSS per proxy and idle CPU.
func manyProxies(e *env, g, z *plane, n int, profileDir string, r results) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tok struct {
		Token string `json:"token"`
	}
	if err := e.do("POST", z.api+"/tokens/dataplane", `{"mesh":"default","tags":{"role":"sim"},"validFor":"2h"}`, &tok); err != nil {
		return err
	}
	caPEM, err := os.ReadFile(filepath.Join(z.dataDir, "xds-server.crt"))
	if err != nil {
		return err
	}
	quiesce([]*plane{g, z}, time.Second)
	rss0, _ := usage(z.proc.PID())

	joinStart, joinCPU := time.Now(), onCPU(z.proc.PID())
	var joinProfile sync.WaitGroup
	if profileDir != "" {
		joinProfile.Go(func() { _ = e.profile(z, profileDir, "proxies-join", 5*time.Second) })
	}
	defer joinProfile.Wait()
	proxies := make([]*simProxy, n)
	errs := make(chan error, n)
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				p, err := joinSimProxy(ctx, e, z, i, tok.Token, caPEM)
				if err != nil {
					errs <- fmt.Errorf("proxy %d: %w", i, err)
					continue
				}
				proxies[i] = p
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	defer func() {
		for _, p := range proxies {
			p.conn.Close()
			p.relay.Close()
			p.agent.Close()
		}
	}()
	// Every proxy has its first listeners.
	if err := waitAll(proxies, 60*time.Second, func(_ int, p *simProxy) bool { return p.nfirst.Load() }); err != nil {
		return fmt.Errorf("first configuration: %w", err)
	}
	r["proxies_joined_ms"] = msOf(time.Since(joinStart))
	r["proxies_join_cpu_ms"] = msOf(onCPU(z.proc.PID())-joinCPU) / float64(n)
	quiesce([]*plane{g, z}, 3*time.Second) // settled: the memory trimmer has run
	rss1, _ := usage(z.proc.PID())
	r["proxy_rss_kib"] = (rss1 - rss0) * 1024 / float64(n)
	if profileDir != "" {
		joinProfile.Wait() // one CPU profile at a time
		if err := e.heapProfile(z, profileDir, "proxies"); err != nil {
			return err
		}
	}
	cpu0 := onCPU(z.proc.PID())
	if profileDir != "" {
		if err := e.profile(z, profileDir, "proxies-idle", 5*time.Second); err != nil {
			return err
		}
	} else {
		time.Sleep(5 * time.Second)
	}
	r["proxies_idle_cpu_pct"] = (onCPU(z.proc.PID()) - cpu0).Seconds() / 5 * 100

	// One mesh-wide change: every proxy's inbound RBAC changes.
	before := make([]string, n)
	for i, p := range proxies {
		p.mu.Lock()
		before[i] = p.acked
		p.mu.Unlock()
	}
	var profiles sync.WaitGroup
	if profileDir != "" {
		profiles.Add(1)
		go func() { defer profiles.Done(); _ = e.profile(z, profileDir, "proxies-change", 3*time.Second) }()
	}
	defer profiles.Wait()
	t0 := time.Now()
	deny := `{"type":"MeshTrafficPermission","mesh":"default","name":"deny-legacy","spec":{"targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"MeshService","name":"legacy"},"default":{"action":"Deny"}}]}}`
	if err := e.do("PUT", g.api+"/meshes/default/meshtrafficpermissions/deny-legacy", deny, nil); err != nil {
		return err
	}
	if err := waitAll(proxies, 30*time.Second, func(i int, p *simProxy) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.acked != before[i]
	}); err != nil {
		return fmt.Errorf("mesh-wide change: %w", err)
	}
	var last time.Time
	for _, p := range proxies {
		p.mu.Lock()
		if p.ackAt.After(last) {
			last = p.ackAt
		}
		p.mu.Unlock()
	}
	r["proxies_acked_ms"] = msOf(last.Sub(t0))
	return nil
}

// joinSimProxy joins proxy i with meridian-dp's agent and opens its ADS
// stream for listeners, acknowledging every response.
func joinSimProxy(ctx context.Context, e *env, z *plane, i int, token string, caPEM []byte) (*simProxy, error) {
	dir := filepath.Join(e.tmp, "sim", fmt.Sprint(i))
	dp := fmt.Sprintf(`{"type":"Dataplane","mesh":"default","name":"sim-%d","networking":{"address":"127.0.0.1","inbound":[{"port":%d,"tags":{"kuma.io/service":"sim-%d","role":"sim"}}]}}`,
		i, 20000+i, i%10)
	a, err := agent.New(agent.Config{CPAddress: "https://" + z.xds, Dataplane: []byte(dp), Token: token, CACert: caPEM, Dir: dir, Version: "bench"})
	if err != nil {
		return nil, err
	}
	j, err := a.Join(ctx)
	if err != nil {
		a.Close()
		return nil, err
	}
	go j.Hold(ctx)
	// The workload's side: its xDS stream through the agent's relay, as
	// meridian-dp's bootstrap has it.
	relay, err := j.ServeRelay()
	if err != nil {
		a.Close()
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, agent.RelaySocket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		relay.Close()
		a.Close()
		return nil, err
	}
	p := &simProxy{node: j.NodeID(), conn: conn, agent: a, relay: relay}
	p.ads = sotwclient.NewADSClient(ctx, &corev3.Node{Id: j.NodeID()}, resourcev3.ListenerType)
	if err := p.ads.InitConnect(conn); err != nil {
		conn.Close()
		relay.Close()
		a.Close()
		return nil, err
	}
	go p.run()
	return p, nil
}

// run acknowledges every response until the stream ends.
func (p *simProxy) run() {
	for {
		resp, err := p.ads.Fetch()
		if err != nil {
			return
		}
		if err := p.ads.Ack(); err != nil {
			return
		}
		p.mu.Lock()
		p.ackAt, p.acked = time.Now(), versionOfResponse(resp)
		p.mu.Unlock()
		p.nfirst.Store(true)
	}
}

// versionOfResponse identifies a response's content (the ADS client keeps
// the version to itself): its resources' bytes.
func versionOfResponse(resp *sotwclient.Response) string {
	var b strings.Builder
	for _, r := range resp.Resources {
		b.Write(r.GetValue())
	}
	return fmt.Sprintf("%d:%x", len(resp.Resources), hashString(b.String()))
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// waitAll waits until ok holds for every proxy.
func waitAll(proxies []*simProxy, timeout time.Duration, ok func(int, *simProxy) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		missing := 0
		for i, p := range proxies {
			if !ok(i, p) {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d proxies not there after %s", missing, len(proxies), timeout)
		}
		time.Sleep(time.Millisecond)
	}
}
