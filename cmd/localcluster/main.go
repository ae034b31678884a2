// Command localcluster is the README's main job: it builds Meridian, starts a
// global control plane and two zones connected to it on loopback (embedded
// stores in a temporary folder, zone tokens issued by the global, KDS over
// TLS), applies the example policies on the global and in zone-1, prints
// what each control plane holds and one proxy's effective config, then runs
// real gRPC workloads under meridian-dp (examples/greeter): a client in
// zone-1 calling greeters in zone-1 and zone-2, denied and allowed again by
// a MeshTrafficPermission written on the global. Ctrl-C stops everything.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meridian-mesh/meridian/internal/launcher"
)

func main() {
	once := flag.Bool("once", false, "stop after printing instead of waiting for Ctrl-C")
	verbose := flag.Bool("v", false, "show the control planes' logs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *once, *verbose); err != nil {
		fmt.Fprintf(os.Stderr, "localcluster: %v\n", err)
		stop()
		os.Exit(1)
	}
}

type cluster struct {
	bins    launcher.Binaries
	root    string
	tmp     string
	procs   []*launcher.Process
	apis    map[string]string
	xds     map[string]string // the zones' xDS addresses
	logSink io.Writer
}

func run(ctx context.Context, once, verbose bool) error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := launcher.ModuleRoot(wd)
	if err != nil {
		return fmt.Errorf("run this from the Meridian checkout: %w", err)
	}
	tmp, err := os.MkdirTemp("", "meridian-local-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	fmt.Println("building global-cp, zone-cp, meridianctl, meridian-dp and the greeter example ...")
	bins, err := launcher.Build(ctx, root, filepath.Join(tmp, "bin"))
	if err != nil {
		return err
	}
	c := &cluster{bins: bins, root: root, tmp: tmp, apis: map[string]string{}, xds: map[string]string{}, logSink: io.Discard}
	if verbose {
		c.logSink = os.Stderr
	}
	defer c.stopAll()
	if err := c.startAll(ctx, tmp); err != nil {
		return err
	}
	if err := c.demo(ctx); err != nil {
		return err
	}
	if err := c.dataPlaneDemo(ctx); err != nil {
		return err
	}
	c.printTryIt()
	if once {
		return nil
	}
	fmt.Println("\nrunning; try the meridianctl commands above. Ctrl-C stops everything.")
	<-ctx.Done()
	c.stopAll()
	fmt.Println("\nstopped: the workloads, global, zone-1 and zone-2 shut down; their temporary data directory is removed.")
	return nil
}

// printTryIt says how to run meridianctl against the running planes.
func (c *cluster) printTryIt() {
	fmt.Printf("\n=== the web console (a browser on this machine is admin without a token)\n")
	fmt.Printf("  global: %s/gui/   (zones, live)\n", c.apis["global"])
	fmt.Printf("  zone-1: %s/gui/meshes/default/dataplanes/web-1?namespace=web-ns   (a proxy, field by field, and a what-if form)\n", c.apis["zone-1"])
	fmt.Printf("  zone-2: %s/gui/\n", c.apis["zone-2"])
	fmt.Printf("\n=== try it yourself\n")
	fmt.Printf("meridianctl is built at %s (or run: go run ./cmd/meridianctl); its address comes from\n", c.bins.Meridianctl)
	fmt.Printf("--api-address or MERIDIAN_API_ADDRESS, and loopback callers are admin without a token:\n\n")
	fmt.Printf("  export MERIDIAN_API_ADDRESS=%s   # the global\n", c.apis["global"])
	fmt.Printf("  %s get meshtimeouts\n", c.bins.Meridianctl)
	fmt.Printf("  %s inspect zones\n", c.bins.Meridianctl)
	fmt.Printf("  go run ./cmd/meridianctl --api-address %s inspect dataplane web-1 -n web-ns   # zone-1\n", c.apis["zone-1"])
	fmt.Printf("  go run ./cmd/meridianctl --api-address %s get meshtimeouts                    # zone-2\n", c.apis["zone-2"])
}

func (c *cluster) startAll(ctx context.Context, tmp string) error {
	kds, err := launcher.FreeAddress()
	if err != nil {
		return err
	}
	globalDir := filepath.Join(tmp, "global")
	if err := c.start(ctx, "global", c.bins.Global, globalDir, "--kds-address", kds); err != nil {
		return err
	}
	for _, z := range []struct{ name, env string }{{"zone-1", "kubernetes"}, {"zone-2", "universal"}} {
		tokenFile := filepath.Join(tmp, z.name+".token")
		if err := c.zoneToken(ctx, z.name, tokenFile); err != nil {
			return err
		}
		xds, err := launcher.FreeAddress()
		if err != nil {
			return err
		}
		c.xds[z.name] = xds
		err = c.start(ctx, z.name, c.bins.Zone, filepath.Join(tmp, z.name), "--zone", z.name, "--environment", z.env,
			"--global-address", kds, "--zone-token-file", tokenFile,
			"--kds-ca-file", filepath.Join(globalDir, "kds-server.crt"), "--xds-address", xds)
		if err != nil {
			return err
		}
	}
	return nil
}

// start launches one control plane on a fresh API port and waits until ready.
func (c *cluster) start(ctx context.Context, name, bin, dataDir string, args ...string) error {
	addr, err := launcher.FreeAddress()
	if err != nil {
		return err
	}
	args = append([]string{"--data-dir", dataDir, "--api-address", addr}, args...)
	p := &launcher.Process{Name: name, Path: bin, Args: args, Log: &launcher.PrefixWriter{Prefix: "[" + name + "] ", W: c.logSink}}
	if err := p.Start(); err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	readyCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.WaitHTTP(readyCtx, "http://"+addr+"/readyz"); err != nil {
		return err
	}
	c.apis[name] = "http://" + addr
	fmt.Printf("%-7s API %s\n", name, c.apis[name])
	return nil
}

// zoneToken issues a token for zone on the global with meridianctl.
func (c *cluster) zoneToken(ctx context.Context, zone, path string) error {
	out, err := exec.CommandContext(ctx, c.bins.Meridianctl, "--api-address", c.apis["global"],
		"generate", "zone-token", "--zone", zone, "--valid-for", "24h").Output()
	if err != nil {
		return fmt.Errorf("generate zone-token: %w", err)
	}
	return os.WriteFile(path, out, 0o600)
}

// stopAll stops every process (SIGTERM, then SIGKILL after 5 s); a second
// call does nothing.
func (c *cluster) stopAll() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		if err := c.procs[i].Stop(5 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	c.procs = nil
}

// ctl runs meridianctl against one control plane, echoing the command.
func (c *cluster) ctl(ctx context.Context, cp string, args ...string) error {
	full := append([]string{"--api-address", c.apis[cp]}, args...)
	fmt.Printf("\n$ meridianctl %s\n", joinArgs(full))
	cmd := exec.CommandContext(ctx, c.bins.Meridianctl, full...)
	cmd.Dir = c.root
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stdout
	return cmd.Run()
}

func joinArgs(args []string) string {
	s := ""
	for i, a := range args {
		if i > 0 {
			s += " "
		}
		s += a
	}
	return s
}

func (c *cluster) demo(ctx context.Context) error {
	type step struct {
		cp       string
		args     []string
		mayFail  bool
		headline string
	}
	run := func(steps []step) error {
		for _, s := range steps {
			if s.headline != "" {
				fmt.Printf("\n=== %s\n", s.headline)
			}
			err := c.ctl(ctx, s.cp, s.args...)
			var exitErr *exec.ExitError
			if err != nil && !(s.mayFail && errors.As(err, &exitErr)) {
				return fmt.Errorf("meridianctl %v: %w", s.args, err)
			}
		}
		return nil
	}
	err := run([]step{
		{"global", []string{"apply", "-f", "examples/global-policies.yaml"}, false, "fleet-wide policies on the global"},
		{"global", []string{"apply", "-f", "examples/global-guardrails.yaml"}, false, "a guardrail: an override that zones cannot undo"},
		{"zone-1", []string{"apply", "-f", "examples/zone-1-resources.yaml"}, false, "proxies and a producer policy in zone-1"},
		{"global", []string{"apply", "-f", "examples/invalid-policy.yaml"}, true,
			"invalid policies are rejected with field paths (this failure is intended: the file is wrong on purpose)"},
	})
	if err != nil {
		return err
	}
	fmt.Println("(intended: the global refused the invalid policies and stored nothing; the demo goes on)")
	// Sync is asynchronous (milliseconds); wait until zone-2 has the
	// producer policy relayed from zone-1, the last thing to arrive.
	c.waitFor(ctx, "zone-2", "/meshes/default/meshtimeouts?filter[labels.kuma.io/display-name]=backend-timeouts")
	c.waitFor(ctx, "zone-1", "/meshes/default/meshtimeouts?filter[labels.kuma.io/display-name]=idle-timeout-cap")
	err = run([]step{
		{"global", []string{"inspect", "zones"}, false, "the zones, as the global sees them"},
		{"global", []string{"get", "meshtimeouts"}, false, "what the global holds: its own policies and zone-1's producer policy"},
		{"zone-1", []string{"get", "meshtimeouts"}, false, "what zone-1 sees: the global's policies (hashed names) and its own"},
		{"zone-2", []string{"get", "meshtimeouts"}, false, "what zone-2 sees: the global's policies and zone-1's producer policy"},
	})
	if err != nil {
		return err
	}
	if err := c.summarize(ctx, "zone-1", "web-ns", "web-1"); err != nil {
		return err
	}
	return run([]step{
		{"zone-1", []string{"inspect", "dataplane", "web-1", "-n", "web-ns"}, false, "web-1's effective config in zone-1, per inbound and outbound"},
		{"zone-1", []string{"inspect", "dataplane", "web-1", "-n", "web-ns", "--explain", "--type", "MeshTimeout", "--outbound", "backend"},
			false, "why web-1's timeouts to backend are what they are: who set each field, who lost"},
	})
}

// summarize prints one sentence about a proxy's effective config, from
// its _config view: how many inbounds and outbounds, which policy types
// shape it, and from how many policies.
func (c *cluster) summarize(ctx context.Context, cp, ns, name string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", c.apis[cp]+"/meshes/default/dataplanes/"+name+"/_config?namespace="+ns, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var cfg struct {
		Inbounds []struct {
			Policies map[string]struct {
				Rules []struct {
					Origin []struct{ Name string } `json:"origin"`
				} `json:"rules"`
			} `json:"policies"`
		} `json:"inbounds"`
		Outbounds []struct {
			Policies map[string]struct {
				Origin []struct{ Name string } `json:"origin"`
			} `json:"policies"`
		} `json:"outbounds"`
		Proxy map[string]struct {
			Origin []struct{ Name string } `json:"origin"`
		} `json:"proxy"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cfg); err != nil {
		return fmt.Errorf("%s _config: %w", name, err)
	}
	types, policies := map[string]bool{}, map[string]bool{}
	for _, in := range cfg.Inbounds {
		for t, p := range in.Policies {
			types[t] = true
			for _, r := range p.Rules {
				for _, o := range r.Origin {
					policies[o.Name] = true
				}
			}
		}
	}
	for _, out := range cfg.Outbounds {
		for t, p := range out.Policies {
			types[t] = true
			for _, o := range p.Origin {
				policies[o.Name] = true
			}
		}
	}
	for t, p := range cfg.Proxy {
		types[t] = true
		for _, o := range p.Origin {
			policies[o.Name] = true
		}
	}
	names := make([]string, 0, len(types))
	for t := range types {
		names = append(names, t)
	}
	sort.Strings(names)
	fmt.Printf("\n=== in one sentence\n%s in %s has %d inbound(s) and %d outbound(s), shaped by %d policies of %d types (%s).\n",
		name, cp, len(cfg.Inbounds), len(cfg.Outbounds), len(policies), len(names), strings.Join(names, ", "))
	return nil
}

// waitFor polls a zone's list path until it has an item, for up to 10 s.
func (c *cluster) waitFor(ctx context.Context, cp, path string) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		resp, err := http.Get(c.apis[cp] + path)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), `"total":0`) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dataPlaneDemo runs real gRPC workloads under meridian-dp: greeters in
// zone-1 (Kubernetes) and zone-2 (Universal), a client in zone-1 calling
// them, a deny written on the global and removed again, and the failover
// to zone-2 when zone-1's greeter stops.
func (c *cluster) dataPlaneDemo(ctx context.Context) error {
	fmt.Printf("\n=== a mesh with mTLS, and real gRPC workloads under meridian-dp (examples/greeter)\n")
	if err := c.ctl(ctx, "global", "apply", "-f", "examples/greeter/mesh.yaml"); err != nil {
		return err
	}
	c.waitFor(ctx, "zone-1", "/meshes/greeter/meshtrafficpermissions")
	c.waitFor(ctx, "zone-2", "/meshes/greeter/meshtrafficpermissions")
	p1, p2, pc := freePort(), freePort(), freePort()
	g1, err := c.workload(ctx, "zone-1", "greeter-1", "greeter-ns", "greeter", p1, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", p1))
	if err != nil {
		return err
	}
	if _, err := c.workload(ctx, "zone-2", "greeter-2", "", "greeter", p2, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", p2)); err != nil {
		return err
	}
	client, err := c.workload(ctx, "zone-1", "client-1", "greeter-ns", "client", pc, "call", "--service", "greeter", "--every", "250ms")
	if err != nil {
		return err
	}
	fmt.Println("\nclient-1 (zone-1) calls xds:///greeter every 250 ms; its calls:")
	client.show(ctx, 1500*time.Millisecond)

	fmt.Printf("\n=== a MeshTrafficPermission written on the global denies the client (the real error a gRPC client gets)\n")
	if err := c.ctl(ctx, "global", "apply", "-f", "examples/greeter/deny-client.yaml"); err != nil {
		return err
	}
	client.show(ctx, 1500*time.Millisecond)

	fmt.Printf("\n=== removed on the global: allowed again\n")
	if err := c.ctl(ctx, "global", "delete", "meshtrafficpermission", "deny-client", "--mesh", "greeter"); err != nil {
		return err
	}
	client.show(ctx, 1500*time.Millisecond)

	fmt.Printf("\n=== zone-1's greeter stops: the calls fail over to zone-2\n")
	if err := g1.proc.Stop(5 * time.Second); err != nil {
		return err
	}
	client.show(ctx, 1500*time.Millisecond)
	fmt.Printf("\nwhat client-1 gets over xDS, its connection and certificates:\n  curl '%s/meshes/greeter/dataplanes/client-1/_xds?namespace=greeter-ns'\n", c.apis["zone-1"])
	return nil
}

// demoWorkload is one meridian-dp running the greeter, its output kept.
type demoWorkload struct {
	proc *launcher.Process
	out  *lineBuffer
}

// workload starts meridian-dp in zone for Dataplane name (of service svc
// on port) running the greeter with args. ns is its namespace in a
// Kubernetes zone.
func (c *cluster) workload(ctx context.Context, zone, name, ns, svc string, port int, args ...string) (*demoWorkload, error) {
	dir := filepath.Join(c.tmp, "workloads", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	tokenArgs := []string{"--api-address", c.apis[zone], "generate", "dataplane-token", "--mesh", "greeter", "--name", name, "--valid-for", "24h"}
	dp := fmt.Sprintf("type: Dataplane\nmesh: greeter\nname: %s\nnetworking:\n  address: 127.0.0.1\n  inbound:\n    - port: %d\n      tags:\n        kuma.io/service: %s\n", name, port, svc)
	if ns != "" {
		tokenArgs = append(tokenArgs, "--namespace", ns)
		dp = fmt.Sprintf("apiVersion: kuma.io/v1alpha1\nkind: Dataplane\nmesh: greeter\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  networking:\n    address: 127.0.0.1\n    inbound:\n      - port: %d\n        tags:\n          kuma.io/service: %s\n", name, ns, port, svc)
	}
	token, err := exec.CommandContext(ctx, c.bins.Meridianctl, tokenArgs...).Output()
	if err != nil {
		return nil, fmt.Errorf("generate dataplane-token for %s: %w", name, err)
	}
	files := map[string][]byte{"dataplane.yaml": []byte(dp), "token": token}
	for f, data := range files {
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			return nil, err
		}
	}
	out := &lineBuffer{}
	p := &launcher.Process{Name: name, Path: c.bins.MeridianDP, Log: out, Args: append([]string{"run",
		"--cp-address", "https://" + c.xds[zone], "--dataplane-file", filepath.Join(dir, "dataplane.yaml"),
		"--dataplane-token-file", filepath.Join(dir, "token"),
		"--ca-cert-file", filepath.Join(c.tmp, zone, "xds-server.crt"), "--dir", filepath.Join(dir, "agent"),
		"--", c.bins.Greeter}, args...)}
	if err := p.Start(); err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	where := zone
	if ns != "" {
		where += ", namespace " + ns
	}
	fmt.Printf("$ meridian-dp run --cp-address https://%s --dataplane-file %s ... -- greeter %s   # %s in %s\n",
		c.xds[zone], filepath.Join("workloads", name, "dataplane.yaml"), strings.Join(args, " "), name, where)
	return &demoWorkload{proc: p, out: out}, nil
}

// show prints the workload's call results for d.
func (w *demoWorkload) show(ctx context.Context, d time.Duration) {
	mark := w.out.len()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	for _, l := range w.out.since(mark) {
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "error ") {
			fmt.Println("  " + l)
		}
	}
}

// lineBuffer keeps a process's output lines.
type lineBuffer struct {
	mu    sync.Mutex
	lines []string
	part  string
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	parts := strings.Split(b.part+string(p), "\n")
	b.lines = append(b.lines, parts[:len(parts)-1]...)
	b.part = parts[len(parts)-1]
	return len(p), nil
}

func (b *lineBuffer) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.lines)
}

func (b *lineBuffer) since(mark int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lines[mark:]...)
}

func freePort() int {
	addr, err := launcher.FreeAddress()
	if err != nil {
		return 0
	}
	var port int
	_, _ = fmt.Sscanf(addr[strings.LastIndex(addr, ":")+1:], "%d", &port)
	return port
}
