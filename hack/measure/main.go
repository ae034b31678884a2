// Command measure times two API paths against real control plane processes
// it builds and starts itself (fresh stores in a temporary folder), for the
// figures quoted in issue notes:
//
//	go run ./hack/measure getafterchange   # zone: GET of a policy right after each change, 10,000 policies
//	go run ./hack/measure yamllist [-c 4]  # global: RSS of 10,000-item YAML lists
//
// It is a measurement tool, not a test: it asserts nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/launcher"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "measure:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("measure", flag.ExitOnError)
	conc := fs.Int("c", 1, "yamllist: concurrent list requests")
	n := fs.Int("n", 10000, "policies to create")
	if len(os.Args) < 2 {
		return fmt.Errorf("usage: measure getafterchange|yamllist [-c N] [-n N]")
	}
	what := os.Args[1]
	if err := fs.Parse(os.Args[2:]); err != nil {
		return err
	}
	ctx := context.Background()
	wd, _ := os.Getwd()
	root, err := launcher.ModuleRoot(wd)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "meridian-measure-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bins, err := launcher.Build(ctx, root, filepath.Join(tmp, "bin"))
	if err != nil {
		return err
	}
	addr, err := launcher.FreeAddress()
	if err != nil {
		return err
	}
	kds, err := launcher.FreeAddress()
	if err != nil {
		return err
	}
	var p *launcher.Process
	switch what {
	case "getafterchange":
		p = &launcher.Process{Name: "zone", Path: bins.Zone, Log: io.Discard, Args: []string{"--zone", "z1", "--environment", "universal",
			"--data-dir", filepath.Join(tmp, "zone"), "--api-address", addr, "--xds-address", kds}}
	case "yamllist":
		p = &launcher.Process{Name: "global", Path: bins.Global, Log: io.Discard, Args: []string{"--data-dir", filepath.Join(tmp, "global"),
			"--api-address", addr, "--kds-address", kds}}
	default:
		return fmt.Errorf("unknown measurement %q", what)
	}
	if err := p.Start(); err != nil {
		return err
	}
	defer func() { _ = p.Stop(5 * time.Second) }()
	api := "http://" + addr
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.WaitHTTP(wctx, api+"/readyz"); err != nil {
		return err
	}
	if what == "getafterchange" {
		return getAfterChange(api, *n)
	}
	return yamlList(api, p.PID(), *n, *conc)
}

func put(api, path, body string) error {
	req, _ := http.NewRequest("PUT", api+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("PUT %s: %s", path, resp.Status)
	}
	return nil
}

func timeout(i, v int) string {
	return fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":"t-%05d","labels":{"team":"a"},"spec":{"targetRef":{"kind":"Mesh"},`+
		`"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds","http":{"requestTimeout":"5s"}}}]}}`, i, v)
}

// fill creates n MeshTimeouts with 8 concurrent clients.
func fill(api string, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	ch := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				if err := put(api, fmt.Sprintf("/meshes/default/meshtimeouts/t-%05d", i), timeout(i, i%60+1)); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		ch <- i
	}
	close(ch)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func getAfterChange(api string, n int) error {
	dp := `{"type":"Dataplane","mesh":"default","name":"dp","networking":{"address":"10.0.0.1","inbound":[{"port":80,"tags":{"kuma.io/service":"web"}}],` +
		`"outbound":[{"port":1000,"tags":{"kuma.io/service":"a"}},{"port":1001,"tags":{"kuma.io/service":"b"}}]}}`
	if err := put(api, "/meshes/default/dataplanes/dp", dp); err != nil {
		return err
	}
	if err := fill(api, n); err != nil {
		return err
	}
	var lat []time.Duration
	for k := 0; k < 50; k++ {
		if err := put(api, "/meshes/default/meshtimeouts/t-00000", timeout(0, 100+k)); err != nil {
			return err
		}
		start := time.Now()
		resp, err := http.Get(api + "/meshes/default/meshtimeouts/t-00000")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("zone GET of a policy right after a change (%d policies, 50 changes): p50 %s p90 %s max %s\n",
		n, lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1])
	return nil
}

func rss(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS") || strings.HasPrefix(l, "VmHWM") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

func yamlList(api string, pid, n, conc int) error {
	fmt.Println("idle:", rss(pid))
	if err := fill(api, n); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	fmt.Printf("after %d PUTs: %s\n", n, rss(pid))
	var wg sync.WaitGroup
	start := time.Now()
	for k := 0; k < conc; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", fmt.Sprintf("%s/meshes/default/meshtimeouts?size=%d", api, n), nil)
			req.Header.Set("Accept", "application/yaml")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	fmt.Printf("after %d concurrent YAML lists (%s): %s\n", conc, time.Since(start).Round(time.Millisecond), rss(pid))
	time.Sleep(10 * time.Second)
	fmt.Println("10 s later:", rss(pid))
	return nil
}
