package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meridian-mesh/meridian/internal/launcher"
	"github.com/meridian-mesh/meridian/internal/storage/etcdstore/etcdtest"
)

// plane is one control plane process with a fresh data dir.
type plane struct {
	name    string
	proc    *launcher.Process
	api     string // http://host:port
	debug   string // http://host:port of /debug/pprof
	dataDir string
	kds     string // the global's KDS address
	xds     string // a zone's xDS address
	// addrs are the addresses it was started with, by flag.
	addrs map[string]string
}

// env builds and runs processes for one run of a scenario.
type env struct {
	bins launcher.Binaries
	// logDir, when set (-logs), receives each process's log as <name>.log,
	// at logLevel (-log-level).
	logDir, logLevel string
	// names remembers where each plane stores a display name (roundOf).
	names  sync.Map // plane api + display -> "name?namespace=ns"
	tmp    string
	planes []*plane
	http   *http.Client
	// store is the global's store (bolt or etcd); etcd is the cluster the
	// global uses with -store etcd.
	store string
	etcd  *etcdtest.Cluster
}

func newEnv(bins launcher.Binaries, logDir, logLevel, store string) (*env, error) {
	tmp, err := os.MkdirTemp("", "meridian-bench-")
	if err != nil {
		return nil, err
	}
	return &env{bins: bins, logDir: logDir, logLevel: logLevel, tmp: tmp, store: store,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 60 * time.Second}}, nil
}

// close stops every process and removes the data.
func (e *env) close() {
	for i := len(e.planes) - 1; i >= 0; i-- {
		_ = e.planes[i].proc.Stop(10 * time.Second)
	}
	if e.etcd != nil {
		e.etcd.Close()
	}
	_ = os.RemoveAll(e.tmp)
}

// start starts a plane on fresh loopback ports: its API, its debug
// listener and the flags named in ports (each given an address of its
// own), and waits until it is ready. A port is free when chosen and bound
// by the child a moment later; another process may take it meanwhile, so
// a child that exits saying its address is in use is started again on
// other ports.
func (e *env) start(name, bin string, args []string, ports ...string) (*plane, error) {
	var log io.Writer = io.Discard
	if e.logDir != "" {
		f, err := os.OpenFile(filepath.Join(e.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		log = f // closed when the bench exits
	}
	for attempt := 1; ; attempt++ {
		p, err := e.startOnce(name, bin, args, ports, log)
		if err == nil {
			e.planes = append(e.planes, p)
			return p, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
	}
}

func (e *env) startOnce(name, bin string, args, ports []string, log io.Writer) (*plane, error) {
	addrs := map[string]string{}
	args = slices.Clone(args) // the ports are added per attempt
	for _, flag := range append([]string{"--api-address", "--debug-address"}, ports...) {
		a, err := launcher.FreeAddress()
		if err != nil {
			return nil, err
		}
		addrs[flag] = a
		args = append(args, flag, a)
	}
	p := &plane{name: name, api: "http://" + addrs["--api-address"], debug: "http://" + addrs["--debug-address"],
		dataDir: filepath.Join(e.tmp, name), addrs: addrs}
	full := append([]string{"--data-dir", p.dataDir, "--log-level", e.logLevel}, args...)
	tail := &tailWriter{}
	p.proc = &launcher.Process{Name: name, Path: bin, Args: full, Log: io.MultiWriter(log, tail)}
	if err := p.restart(); err != nil {
		return nil, fmt.Errorf("%w (its last output: %q)", err, tail.String())
	}
	return p, nil
}

// tailWriter keeps the last bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	buf []byte
}

const tailBytes = 2 << 10

func (t *tailWriter) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if n := len(t.buf); n > tailBytes {
		t.buf = append(t.buf[:0], t.buf[n-tailBytes:]...)
	}
	return len(b), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// restart starts (again) the plane's process and waits until it is ready.
func (p *plane) restart() error {
	if err := p.proc.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return p.proc.WaitHTTP(ctx, p.api+"/readyz")
}

func (e *env) global() (*plane, error) {
	var args []string
	if e.store == "etcd" {
		more, err := e.etcdArgs()
		if err != nil {
			return nil, err
		}
		args = append(args, more...)
	}
	g, err := e.start("global", e.bins.Global, args, "--kds-address")
	if err != nil {
		return nil, err
	}
	g.kds = g.addrs["--kds-address"]
	return g, nil
}

// etcdArgs starts the env's 3-member etcd cluster and returns the global's
// flags to use it.
func (e *env) etcdArgs() ([]string, error) {
	c, err := etcdtest.Launch(filepath.Join(e.tmp, "etcd"), 3, etcdtest.Options{})
	e.etcd = c
	if err != nil {
		return nil, err
	}
	key := filepath.Join(e.tmp, "secrets.key")
	if err := os.WriteFile(key, bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		return nil, err
	}
	return []string{"--store", "etcd", "--etcd-endpoints", strings.Join(c.Endpoints(), ","), "--etcd-secrets-key-file", key}, nil
}

// zone starts a zone connected to g.
func (e *env) zone(g *plane, name, environment string) (*plane, error) {
	return e.zoneStarted(g, name, environment, nil)
}

// zoneStarted is zone; started, when set, receives the time just before
// the process starts (the zone token, which an operator issues ahead of a
// zone's start, is issued and written before that).
func (e *env) zoneStarted(g *plane, name, environment string, started *time.Time) (*plane, error) {
	token, err := e.zoneToken(g, name)
	if err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(e.tmp, name+".token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return nil, err
	}
	if started != nil {
		*started = time.Now()
	}
	z, err := e.start(name, e.bins.Zone, []string{"--zone", name, "--environment", environment, "--global-address", g.kds,
		"--zone-token-file", tokenFile, "--kds-ca-file", filepath.Join(g.dataDir, "kds-server.crt")}, "--xds-address")
	if err != nil {
		return nil, err
	}
	z.xds = z.addrs["--xds-address"]
	return z, nil
}

func (e *env) zoneToken(g *plane, zone string) (string, error) {
	var resp struct {
		Token string `json:"token"`
	}
	if err := e.do("POST", g.api+"/tokens/zone", fmt.Sprintf(`{"zone":%q,"validFor":"2h"}`, zone), &resp); err != nil {
		return "", err
	}
	return resp.Token, nil
}

// do sends a request and decodes a JSON answer into out (nil: discard).
func (e *env) do(method, url, body string, out any) error {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// timeoutBody is a MeshTimeout for all traffic with idle seconds.
func timeoutBody(name string, idle int) string {
	return fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":%q,"spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}}]}}`, name, idle)
}

// putAll writes names with workers concurrent clients; it returns the
// elapsed time.
func (e *env) putAll(api string, names []string, workers int, body func(name string) string) (time.Duration, error) {
	start := time.Now()
	next := make(chan string)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range next {
				if err := e.do("PUT", api+"/meshes/default/meshtimeouts/"+n, body(n), nil); err != nil {
					errs <- err
					for range next {
					}
					return
				}
			}
		}()
	}
	for _, n := range names {
		next <- n
	}
	close(next)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// total is a list's total on a plane.
func (e *env) total(api, plural, query string) (int, error) {
	var page struct {
		Total int `json:"total"`
	}
	err := e.do("GET", api+"/meshes/default/"+plural+"?size=1"+query, "", &page)
	return page.Total, err
}

// waitTotal polls until every plane lists want resources of plural; it
// returns when the last one did, measured from since.
func (e *env) waitTotal(planes []*plane, plural string, want int, since time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for _, p := range planes {
		for {
			n, err := e.total(p.api, plural, "")
			if err == nil && n >= want {
				break
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%s lists %d %s, want %d, after %s (%v)", p.name, n, plural, want, timeout, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return time.Since(since), nil
}

// minorFaults reads how many page faults a process has taken that needed no
// I/O (/proc/<pid>/stat's minflt): on this kind of VM each costs about
// 11 µs (a first touch of 16 MiB of fresh anonymous memory took 44–59 ms;
// the same pages populated by the kernel in one call, MAP_POPULATE, 3 ms),
// so they are a visible share of a cold start's and a rebuild's time.
func minorFaults(pid int) float64 {
	fields := statFields(pid)
	if len(fields) < 8 {
		return 0
	}
	n, _ := strconv.ParseFloat(fields[7], 64)
	return n
}

// statFields reads /proc/<pid>/stat and returns the fields after the
// command name (which may hold spaces): state is [0], minflt [7], utime
// [11], stime [12]. Nil when the process is gone.
func statFields(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(data)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// usage reads a process's RSS (MiB) and CPU seconds (user+system) from /proc.
func usage(pid int) (rssMiB, cpuSec float64) {
	rssMiB = statusMiB(pid)["VmRSS"]
	if fields := statFields(pid); len(fields) > 12 {
		ut, _ := strconv.ParseFloat(fields[11], 64)
		st, _ := strconv.ParseFloat(fields[12], 64)
		cpuSec = (ut + st) / 100 // USER_HZ is 100 on Linux
	}
	return rssMiB, cpuSec
}

// statusMiB reads the sizes in /proc/PID/status (VmRSS, VmHWM, RssAnon...)
// in MiB; nil when the process is gone.
func statusMiB(pid int) map[string]float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		field, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(rest, " kB") {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
		out[field] = kb / 1024
	}
	return out
}

// rssParts splits a process's RSS into anonymous memory (the Go heap and
// runtime) and file-backed pages (mostly the embedded store's memory map,
// which the kernel can drop and read back).
func rssParts(pid int) (anonMiB, fileMiB float64) {
	st := statusMiB(pid)
	return st["RssAnon"], st["RssFile"]
}

// onCPU is the time the process's live threads spent on a CPU, to the
// nanosecond (/proc/PID/task/*/schedstat), where utime and stime count
// 10 ms ticks: over a few seconds of idling, a tick more or less in each of
// four processes would move the figure by most of its bar.
func onCPU(pid int) time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited meanwhile
		}
		if f := strings.Fields(string(data)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// profile saves a CPU profile of the plane taken over d to dir/<name>-<tag>.pprof.
func (e *env) profile(p *plane, dir, tag string, d time.Duration) error {
	return saveURL(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", p.debug, int(d.Seconds())), filepath.Join(dir, p.name+"-"+tag+".pprof"))
}

// saveURL writes what url answers to path.
func saveURL(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// heapProfile writes p's heap profile (in use and allocated, as of its
// last collection), its goroutines, its /metrics and its /proc smaps to
// dir.
func (e *env) heapProfile(p *plane, dir, tag string) error {
	if err := saveURL(p.debug+"/debug/pprof/heap?gc=1", filepath.Join(dir, p.name+"-"+tag+".heap.pprof")); err != nil {
		return err
	}
	// Goroutine stacks are resident memory the heap profile leaves out.
	if err := saveURL(p.debug+"/debug/pprof/goroutine?debug=1", filepath.Join(dir, p.name+"-"+tag+".goroutines.txt")); err != nil {
		return err
	}
	// The runtime's memory classes (go_memstats_*) beside the profile say
	// where resident memory the profile does not show goes.
	if err := saveURL(p.api+"/metrics", filepath.Join(dir, p.name+"-"+tag+".metrics.txt")); err != nil {
		return err
	}
	// smaps says which mappings the resident file-backed pages belong to
	// (the store's file, the binary).
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", p.proc.PID()))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, p.name+"-"+tag+".smaps.txt"), smaps, 0o644)
}

// commitTotals are the global store's commit counters from its /metrics
// (the embedded store only; an etcd-backed global has none).
type commitTotals struct {
	commits, writes, seconds float64
	ok                       bool
}

// metricFamilies reads and parses api's /metrics.
func (e *env) metricFamilies(api string) (map[string]*dto.MetricFamily, error) {
	resp, err := e.http.Get(api + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", api, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s/metrics: %w", api, err)
	}
	return families, nil
}

// storeCommits reads the commit histograms' counts and sums from api's
// /metrics.
func (e *env) storeCommits(api string) (commitTotals, error) {
	families, err := e.metricFamilies(api)
	if err != nil {
		return commitTotals{}, err
	}
	var t commitTotals
	if f := families["meridian_store_commit_writes"]; f != nil && len(f.GetMetric()) == 1 {
		h := f.GetMetric()[0].GetHistogram()
		t.commits, t.writes, t.ok = float64(h.GetSampleCount()), h.GetSampleSum(), true
	}
	if f := families["meridian_store_commit_duration_seconds"]; f != nil && len(f.GetMetric()) == 1 {
		t.seconds = f.GetMetric()[0].GetHistogram().GetSampleSum()
	}
	return t, nil
}

// snapshotSeconds reads from api's /metrics the time the plane spent on
// the full snapshots it received from the global, by phase ("receive":
// first chunk to last; "apply": last chunk to committed), summed over all of
// them, and how many it applied.
func (e *env) snapshotSeconds(api string) (receive, apply float64, count uint64, err error) {
	families, err := e.metricFamilies(api)
	if err != nil {
		return 0, 0, 0, err
	}
	f := families["meridian_sync_full_snapshot_seconds"]
	if f == nil {
		return 0, 0, 0, nil
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["direction"] != "global_to_zone" {
			continue
		}
		h := m.GetHistogram()
		switch labels["phase"] {
		case "receive":
			receive = h.GetSampleSum()
		case "apply":
			apply, count = h.GetSampleSum(), h.GetSampleCount()
		}
	}
	return receive, apply, count, nil
}

// recordColdSnapshot stores the cold zone's snapshot phases in
// milliseconds. The zone observes them right after its transaction, which
// may be a moment after it lists everything, so the metrics are polled
// briefly; a zone without them (an older build) records nothing.
func (e *env) recordColdSnapshot(r results, z *plane) error {
	for deadline := time.Now().Add(2 * time.Second); ; {
		receive, apply, count, err := e.snapshotSeconds(z.api)
		if err != nil {
			return err
		}
		if count > 0 {
			r["cold_zone_receive_ms"], r["cold_zone_apply_ms"] = receive*1000, apply*1000
			return nil
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// since is what the store committed between before and t: commits, writes
// and mean commit in milliseconds (ok is false when the store has no commit
// metrics or nothing committed).
func (t commitTotals) since(before commitTotals) (commits, writes, meanMs float64, ok bool) {
	commits = t.commits - before.commits
	if !before.ok || !t.ok || commits <= 0 {
		return 0, 0, 0, false
	}
	return commits, t.writes - before.writes, (t.seconds - before.seconds) / commits * 1000, true
}

// recordCommits stores, under prefix, the writes per commit and the mean
// commit duration between two readings.
func recordCommits(r results, prefix string, before, after commitTotals) {
	if commits, writes, meanMs, ok := after.since(before); ok {
		r[prefix+"_commit_writes"], r[prefix+"_commit_ms"] = writes/commits, meanMs
	}
}

// onCPUs reads the global's and one zone's CPU time, in that order.
func onCPUs(global, zone *plane) [2]time.Duration {
	return [2]time.Duration{onCPU(global.proc.PID()), onCPU(zone.proc.PID())}
}

// recordCPUPerWrite stores, under prefix, the global's and the zone's CPU
// per write, in microseconds, between two readings of onCPUs: from the
// first write until every zone lists the last, so the zone's tail counts.
func recordCPUPerWrite(r results, prefix string, before, after [2]time.Duration, writes int) {
	r[prefix+"_global_cpu_us"] = float64((after[0] - before[0]).Microseconds()) / float64(writes)
	r[prefix+"_zone_cpu_us"] = float64((after[1] - before[1]).Microseconds()) / float64(writes)
}

// recordZoneCommits stores, under prefix, how many commits a zone's store
// made between two readings and their mean duration. A zone applies each
// batch it receives as one write, so writes per commit say nothing there;
// the count of commits shows how the sender's batching spared the zone.
func recordZoneCommits(r results, prefix string, before, after commitTotals) {
	if commits, _, meanMs, ok := after.since(before); ok {
		r[prefix+"_commits"], r[prefix+"_commit_ms"] = commits, meanMs
	}
}
