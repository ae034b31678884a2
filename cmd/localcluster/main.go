// Command localcluster is the README's main job: it builds Meridian, starts a
// global control plane and two zones connected to it on loopback (embedded
// stores in a temporary folder, zone tokens issued by the global, KDS over
// TLS), applies the example policies on the global and in zone-1, and prints
// what each control plane holds and one proxy's effective config. Ctrl-C
// stops everything.
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
	procs   []*launcher.Process
	apis    map[string]string
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
	fmt.Println("building global-cp, zone-cp and meridianctl ...")
	bins, err := launcher.Build(ctx, root, filepath.Join(tmp, "bin"))
	if err != nil {
		return err
	}
	c := &cluster{bins: bins, root: root, apis: map[string]string{}, logSink: io.Discard}
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
	c.printTryIt()
	if once {
		return nil
	}
	fmt.Println("\nrunning; try the meridianctl commands above. Ctrl-C stops everything.")
	<-ctx.Done()
	c.stopAll()
	fmt.Println("\nstopped: global, zone-1 and zone-2 shut down; their temporary data directory is removed.")
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
		err := c.start(ctx, z.name, c.bins.Zone, filepath.Join(tmp, z.name), "--zone", z.name, "--environment", z.env,
			"--global-address", kds, "--zone-token-file", tokenFile,
			"--kds-ca-file", filepath.Join(globalDir, "kds-server.crt"))
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
