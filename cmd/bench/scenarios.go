package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding/gzip"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/zonesim"
)

// results collects one run's figures by name.
type results map[string]float64

// fleet runs the process scenarios of one run: a global with one zone
// (PUT rate, propagation, cold zone, one change both ways and relayed,
// reconnect, resources, idle CPU, _rules).
func fleet(bins binariesAndN, r results) error {
	e, g, err := withGlobal(bins)
	if err != nil {
		return err
	}
	defer e.close()
	z1, err := e.zone(g, "zone-1", "kubernetes")
	if err != nil {
		return err
	}
	z2, err := e.zone(g, "zone-2", "universal")
	if err != nil {
		return err
	}
	if _, err := e.waitTotal([]*plane{z1, z2}, "meshtimeouts", 0, time.Now(), 30*time.Second); err != nil {
		return err
	}
	n := bins.n
	var profiles sync.WaitGroup
	if bins.profileDir != "" {
		for _, p := range []*plane{g, z1} {
			profiles.Add(1)
			go func() { defer profiles.Done(); _ = e.profile(p, bins.profileDir, "put", 3*time.Second) }()
		}
	}
	if err := putPhase(e, g, []*plane{z1, z2}, n, putKeys{"put", "put_rate_1zone", "last_write_to_zones_ms"}, 60*time.Second, &profiles, r); err != nil {
		return err
	}
	if bins.writesOnly {
		return nil
	}

	// A cold zone: process start to listing every policy, against planes
	// at rest. The two zones' own work after the burst (their status
	// computations, the reports the global takes in) is not the cold
	// zone's: on two shared cores it added about 90 ms (A/B, four runs
	// each: 508–574 ms without this wait, 412–475 with it).
	quiesce([]*plane{g, z1, z2}, 500*time.Millisecond)
	_, globalCPU0 := usage(g.proc.PID())
	var start time.Time
	z3, err := e.zoneStarted(g, "zone-3", "universal", &start)
	if err != nil {
		return err
	}
	if bins.profileDir != "" {
		for _, p := range []*plane{g, z3} {
			profiles.Add(1)
			go func() { defer profiles.Done(); _ = e.profile(p, bins.profileDir, "cold", 5*time.Second) }()
		}
	}
	if r["cold_zone_ms"], err = ms(e.waitTotal([]*plane{z3}, "meshtimeouts", n, start, 60*time.Second)); err != nil {
		return err
	}
	r["cold_zone_faults"] = minorFaults(z3.proc.PID())
	if err := e.recordColdSnapshot(r, z3); err != nil {
		return err
	}
	// CPU seconds, steadier than the wall time on two shared cores: the
	// zone's own (process start → lists all) and the global's meanwhile.
	_, zoneCPU := usage(z3.proc.PID())
	_, globalCPU := usage(g.proc.PID())
	r["cold_zone_cpu_ms"], r["cold_zone_global_cpu_ms"] = zoneCPU*1000, (globalCPU-globalCPU0)*1000
	profiles.Wait()

	// One change at a time, each direction. The cold zone's tail (its
	// first status computation, the report the global takes in) is another
	// scenario's work: the rounds start once it is done.
	quiesce([]*plane{g, z1, z2, z3}, 500*time.Millisecond)
	if err := oneChanges(e, g, []*plane{z1}, "t-0", "global_to_zone", r, func(v int) (string, string) {
		return g.api + "/meshes/default/meshtimeouts/t-0", withRound(timeoutBody("t-0", 1), v)
	}); err != nil {
		return err
	}
	if err := oneChanges(e, z2, []*plane{g}, "z2-own", "zone_to_global", r, func(v int) (string, string) {
		return z2.api + "/meshes/default/meshtimeouts/z2-own", withRound(timeoutBody("z2-own", 1), v)
	}); err != nil {
		return err
	}
	producer := func(v int) (string, string) {
		body := `{"type":"MeshTimeout","mesh":"default","name":"relayed","namespace":"backend-ns","spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"idleTimeout":"5s"}}]}}`
		return z1.api + "/meshes/default/meshtimeouts/relayed?namespace=backend-ns", withRound(body, v)
	}
	if err := oneChanges(e, z1, []*plane{z2}, "relayed", "zone_to_zone", r, producer); err != nil {
		return err
	}

	// _rules of a proxy every policy matches: first call after a change,
	// and warm.
	dp := `{"type":"Dataplane","mesh":"default","name":"web-1","networking":{"address":"10.0.0.1","inbound":[{"port":8080,"tags":{"kuma.io/service":"web"}}],"outbound":[{"port":10001,"tags":{"kuma.io/service":"backend"}}]}}`
	if err := e.do("PUT", z2.api+"/meshes/default/dataplanes/web-1", dp, nil); err != nil {
		return err
	}
	if err := oneChanges(e, g, []*plane{z2}, "t-1", "", nil, func(v int) (string, string) {
		return g.api + "/meshes/default/meshtimeouts/t-1", withRound(timeoutBody("t-1", 1), v)
	}); err != nil {
		return err
	}
	var rulesProfile sync.WaitGroup
	if bins.profileDir != "" {
		rulesProfile.Add(1)
		go func() {
			defer rulesProfile.Done()
			_ = e.profile(z2, bins.profileDir, "rules-after-change", 10*time.Second)
		}()
		time.Sleep(50 * time.Millisecond) // the profile is running when the call starts
	}
	t0 := time.Now()
	if err := e.do("GET", z2.api+"/meshes/default/dataplanes/web-1/_rules", "", nil); err != nil {
		return err
	}
	r["rules_first_ms"] = msOf(time.Since(t0))
	rulesProfile.Wait()
	t0 = time.Now()
	if err := e.do("GET", z2.api+"/meshes/default/dataplanes/web-1/_rules", "", nil); err != nil {
		return err
	}
	r["rules_warm_ms"] = msOf(time.Since(t0))

	// The inspected zone's footprint (the zone RSS bar is "after
	// inspecting a proxy"): zone-2 holds the snapshot _rules was computed
	// from and the proxy's memoized rules; zone-1, measured below, never
	// computed a proxy's rules. Read once every plane is quiet, as below.
	quiesce([]*plane{g, z1, z2, z3}, 3*time.Second)
	r["inspected_rss_mib"], _ = usage(z2.proc.PID())
	r["inspected_rss_anon_mib"], r["inspected_rss_file_mib"] = rssParts(z2.proc.PID())
	if bins.profileDir != "" {
		if err := e.heapProfile(z2, bins.profileDir, "inspected"); err != nil {
			return err
		}
	}

	// Reconnect with no changes: what the global resends, and how long
	// until the zone is connected and synced again.
	before, err := sentTo(e, g, "zone-2")
	if err != nil {
		return err
	}
	if err := z2.proc.Stop(10 * time.Second); err != nil {
		return err
	}
	t0 = time.Now()
	if err := z2.restart(); err != nil {
		return err
	}
	for {
		var st struct {
			Connected bool `json:"connected"`
		}
		if err := e.do("GET", g.api+"/zones/zone-2/_overview", "", &st); err == nil && st.Connected {
			break
		}
		if time.Since(t0) > 30*time.Second {
			return fmt.Errorf("zone-2 did not reconnect")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r["reconnect_ms"] = msOf(time.Since(t0))
	time.Sleep(500 * time.Millisecond)
	after, err := sentTo(e, g, "zone-2")
	if err != nil {
		return err
	}
	r["reconnect_resent"] = float64(after - before)

	// Resources once settled, then idle CPU over 5 s. Settled: no plane
	// used CPU for 3 s, so one-off tails are over — the restarted zone-2
	// computing its policy statuses once after loading and the global
	// taking in its report, each process handing its free heap back to the
	// OS after a burst (controlplane's memory trimmer).
	planes := []*plane{g, z1, z2, z3}
	quiesce(planes, 3*time.Second)
	for _, p := range []*plane{g, z1} {
		rss, cpu := usage(p.proc.PID())
		r[p.name+"_rss_mib"] = rss
		r[p.name+"_rss_anon_mib"], r[p.name+"_rss_file_mib"] = rssParts(p.proc.PID())
		r[p.name+"_cpu_s"] = cpu
		r[p.name+"_faults"] = minorFaults(p.proc.PID())
		if bins.profileDir != "" {
			if err := e.heapProfile(p, bins.profileDir, "settled"); err != nil {
				return err
			}
		}
	}
	var idle0 []time.Duration
	for _, p := range planes {
		idle0 = append(idle0, onCPU(p.proc.PID()))
	}
	if bins.profileDir != "" {
		for _, p := range planes {
			profiles.Add(1)
			go func() { defer profiles.Done(); _ = e.profile(p, bins.profileDir, "idle", 5*time.Second) }()
		}
	}
	time.Sleep(5 * time.Second)
	profiles.Wait()
	var idle time.Duration
	for i, p := range planes {
		idle += onCPU(p.proc.PID()) - idle0[i]
	}
	r["idle_cpu_pct"] = idle.Seconds() / 5 * 100
	return nil
}

// withGlobal is a fresh environment running a global; the caller closes it.
func withGlobal(bins binariesAndN) (*env, *plane, error) {
	e, err := newEnv(bins.bins, bins.logDir, bins.logLevel, bins.store)
	if err != nil {
		return nil, nil, err
	}
	g, err := e.global()
	if err != nil {
		e.close()
		return nil, nil, err
	}
	return e, g, nil
}

// sentTo is how many resources (and removals) the global sent a zone.
func sentTo(e *env, g *plane, zone string) (uint64, error) {
	var st struct {
		GlobalToZone struct {
			ResourcesSent uint64 `json:"resourcesSent"`
			RemovalsSent  uint64 `json:"removalsSent"`
		} `json:"globalToZone"`
	}
	err := e.do("GET", g.api+"/zones/"+zone+"/_overview", "", &st)
	return st.GlobalToZone.ResourcesSent + st.GlobalToZone.RemovalsSent, err
}

// oneChanges writes one resource 30 times with a new value each time and
// measures, for each write, how long until every target lists it (by
// display name) with that value; p50 and p99 go to r under key (none
// without a key: a single change to wait for).
func oneChanges(e *env, src *plane, targets []*plane, display, key string, r results, write func(v int) (string, string)) error {
	rounds := 30
	if key == "" {
		rounds = 1
	}
	var lat []time.Duration
	for i := range rounds {
		v := 1000 + i + int(time.Now().UnixNano()%1000)*1000
		url, body := write(v)
		if err := e.do("PUT", url, body, nil); err != nil {
			return err
		}
		t0 := time.Now()
		want := fmt.Sprintf("round:%d", v)
		for _, t := range targets {
			for {
				got, err := roundOf(e, t, display)
				if err == nil && strings.Contains(got, want) {
					break
				}
				if time.Since(t0) > 30*time.Second {
					return fmt.Errorf("%s: %s never reached %s", key, display, t.name)
				}
				time.Sleep(500 * time.Microsecond)
			}
		}
		lat = append(lat, time.Since(t0))
	}
	if key != "" {
		slices.Sort(lat)
		r[key+"_p50_ms"] = msOf(lat[len(lat)/2])
		r[key+"_p99_ms"] = msOf(lat[(len(lat)*99+99)/100-1])
	}
	_ = src
	return nil
}

// roundLabel marks each write of a change measurement; it syncs with the
// resource, and nothing normalizes it.
const roundLabel = "bench.meridian.dev/round"

func withRound(body string, v int) string {
	return strings.Replace(body, `"spec":`, fmt.Sprintf(`"labels":{%q:"%d"},"spec":`, roundLabel, v), 1)
}

// roundOf reads the round label of the resource a plane stores under a
// display name ("round:" when it has none yet). It finds the stored name
// once (e.names), so that polling is a GET by name: a filtered list of
// 10,000 policies per poll would load the plane being measured.
func roundOf(e *env, p *plane, display string) (string, error) {
	path, ok := e.names.Load(p.api + display)
	if !ok {
		var page struct {
			Items []struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"items"`
		}
		if err := e.do("GET", p.api+"/meshes/default/meshtimeouts?filter[labels.kuma.io/display-name]="+url.QueryEscape(display), "", &page); err != nil {
			return "", err
		}
		if len(page.Items) != 1 {
			return "", fmt.Errorf("%s holds %d resources named %s", p.name, len(page.Items), display)
		}
		path = page.Items[0].Name + "?namespace=" + url.QueryEscape(page.Items[0].Namespace)
		e.names.Store(p.api+display, path)
	}
	var r struct {
		Labels map[string]string `json:"labels"`
	}
	if err := e.do("GET", p.api+"/meshes/default/meshtimeouts/"+path.(string), "", &r); err != nil {
		return "", err
	}
	return "round:" + r.Labels[roundLabel], nil
}

// tenZones: the PUT rate with ten zone processes on the same machine.
func tenZones(bins binariesAndN, r results) error {
	e, g, err := withGlobal(bins)
	if err != nil {
		return err
	}
	defer e.close()
	var zones []*plane
	for i := range 10 {
		z, err := e.zone(g, fmt.Sprintf("zone-%d", i+1), "universal")
		if err != nil {
			return err
		}
		zones = append(zones, z)
	}
	var profiles sync.WaitGroup
	if bins.profileDir != "" {
		for _, p := range []*plane{g, zones[0]} {
			profiles.Add(1)
			go func() { defer profiles.Done(); _ = e.profile(p, bins.profileDir, "ten-put", 3*time.Second) }()
		}
	}
	return putPhase(e, g, zones, bins.n, putKeys{"put10", "put_rate_10zones", "last_write_to_10zones_ms"}, 120*time.Second, &profiles, r)
}

// putKeys name a PUT phase's figures: prefix for the commit and CPU rows,
// and the rate's and the last write's keys.
type putKeys struct{ prefix, rate, lastWrite string }

// putPhase writes n MeshTimeouts to the global with 8 clients and records
// the rate, the global's commits, last write → every zone lists all, the
// CPU per PUT of the global and zones[0] (until the last zone lists all,
// so the zone's tail counts) and zones[0]'s commits. profiles (CPU
// profiles of the phase, started by the caller) is waited for once the
// writes are done.
func putPhase(e *env, g *plane, zones []*plane, n int, k putKeys, timeout time.Duration, profiles *sync.WaitGroup, r results) error {
	commits0, err := e.storeCommits(g.api)
	if err != nil {
		return err
	}
	zoneCommits0, err := e.storeCommits(zones[0].api)
	if err != nil {
		return err
	}
	cpu0 := onCPUs(g, zones[0])
	took, err := e.putAll(g.api, names("t-", n), 8, func(name string) string { return timeoutBody(name, 1) })
	profiles.Wait()
	if err != nil {
		return err
	}
	last := time.Now()
	r[k.rate] = float64(n) / took.Seconds()
	commits1, err := e.storeCommits(g.api)
	if err != nil {
		return err
	}
	recordCommits(r, k.prefix, commits0, commits1)
	if r[k.lastWrite], err = ms(e.waitTotal(zones, "meshtimeouts", n, last, timeout)); err != nil {
		return err
	}
	recordCPUPerWrite(r, k.prefix, cpu0, onCPUs(g, zones[0]), n)
	zoneCommits1, err := e.storeCommits(zones[0].api)
	if err != nil {
		return err
	}
	recordZoneCommits(r, k.prefix+"_zone", zoneCommits0, zoneCommits1)
	return nil
}

// simulated: N policies fanned out to many simulated zones (zonesim), one
// change to all of them, and the global's RSS and CPU per zone.
func simulated(bins binariesAndN, zones int, r results) error {
	callOpts := []grpc.CallOption{grpc.MaxCallRecvMsgSize(6 << 20)}
	if bins.simGzip {
		callOpts = append(callOpts, grpc.UseCompressor(gzip.Name)) // as zone-cp dials
	}
	e, g, err := withGlobal(bins)
	if err != nil {
		return err
	}
	defer e.close()
	tokens := map[string]string{}
	var mu sync.Mutex
	arrived := map[string]map[string]time.Time{} // marker -> zone -> time
	tlsCfg, err := auth.ClientTLS(auth.ClientTLSConfig{CAFile: filepath.Join(g.dataDir, "kds-server.crt")})
	if err != nil {
		return err
	}
	sim, err := zonesim.New(zonesim.Config{
		Zones: zones, Prefix: "sim-", Target: g.kds,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
			grpc.WithDefaultCallOptions(callOpts...)},
		Token: func(zone string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return tokens[zone], nil
		},
		// Each zone reports the status of the global's policies it holds,
		// as a zone-cp does: the global keeps every zone's report.
		ReportStatuses: true,
		OnApply: func(zone string, res *resource.Resource, at time.Time) {
			if res.Labels.Get(resource.LabelDisplayName) != "probe" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			marker := "round:" + res.Labels.Get(roundLabel)
			if arrived[marker] == nil {
				arrived[marker] = map[string]time.Time{}
			}
			arrived[marker][zone] = at
		},
	})
	if err != nil {
		return err
	}
	for _, name := range sim.Names() {
		t, err := e.zoneToken(g, name)
		if err != nil {
			return err
		}
		tokens[name] = t
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for t0 := time.Now(); sim.Connected() < zones; time.Sleep(10 * time.Millisecond) {
		if time.Since(t0) > 60*time.Second {
			return fmt.Errorf("only %d of %d simulated zones connected", sim.Connected(), zones)
		}
	}
	_, cpu0 := usage(g.proc.PID())
	if _, err := e.putAll(g.api, names("t-", bins.n), 8, func(name string) string { return timeoutBody(name, 1) }); err != nil {
		return err
	}
	last := time.Now()
	for sim.MinCount("MeshTimeout") < bins.n {
		if time.Since(last) > 120*time.Second {
			return fmt.Errorf("simulated zones hold at least %d of %d policies after 120 s", sim.MinCount("MeshTimeout"), bins.n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	r["sim_fanout_ms"] = msOf(time.Since(last))

	// The probe the rounds below update is created now: a new policy makes
	// every zone send a new status report (all its statuses), which the
	// rounds, updates that change no status, must not wait behind. Then
	// every zone's report must be in on the global.
	if err := e.do("PUT", g.api+"/meshes/default/meshtimeouts/probe", withRound(timeoutBody("probe", 5), 4999), nil); err != nil {
		return err
	}
	reportStart := time.Now()
	for _, name := range []string{"t-0", "probe"} {
		if err := awaitZoneReports(e, g, name, zones, reportStart); err != nil {
			return err
		}
	}
	r["sim_reports_ms"] = msOf(time.Since(reportStart))

	// This process holds every simulated zone's copy (100 × N resources,
	// about 1.1 GB of heap at 10,000). Left to itself, its collector started
	// during the rounds below: each cycle took about 2 s of CPU and 4 s of
	// wall time on the two cores the global needs. Collect it now, and start
	// the rounds once the global is quiet, as the fleet's rounds do, so they
	// measure the global's fan-out and not this process's collector.
	runtime.GC()
	quiesce([]*plane{g}, 500*time.Millisecond)

	// One change to every zone, 20 times: p99 over zones and changes.
	var profiles sync.WaitGroup
	if bins.profileDir != "" {
		profiles.Add(1)
		go func() { defer profiles.Done(); _ = e.profile(g, bins.profileDir, "sim-changes", 2*time.Second) }()
	}
	defer profiles.Wait()
	var lat []time.Duration
	for i := range 20 {
		body := withRound(timeoutBody("probe", 5), 5000+i)
		t0 := time.Now()
		if err := e.do("PUT", g.api+"/meshes/default/meshtimeouts/probe", body, nil); err != nil {
			return err
		}
		marker := fmt.Sprintf("round:%d", 5000+i)
		for {
			mu.Lock()
			got := arrived[marker]
			complete := len(got) == zones
			if complete {
				for _, at := range got {
					lat = append(lat, at.Sub(t0))
				}
			}
			mu.Unlock()
			if complete {
				break
			}
			if time.Since(t0) > 30*time.Second {
				return fmt.Errorf("a change reached %d of %d simulated zones", len(got), zones)
			}
			time.Sleep(time.Millisecond)
		}
	}
	slices.Sort(lat)
	r["sim_change_p99_ms"] = msOf(lat[(len(lat)*99+99)/100-1])
	// RSS once the global has settled, as the fleet scenario measures it
	// (its memory trimmer hands back the free heap after a burst), and its
	// peak over the scenario: 100 zones sending their status reports at
	// once is the global's largest burst. Quiet for 5 s, not 3: the
	// trimmer acts within about 3 s of the last allocation, and a 3 s
	// window that ended just before it measured the burst's heap (one run
	// of three gave 830 MiB, the peak, against 142 and 168).
	_, cpu := usage(g.proc.PID())
	quiesce([]*plane{g}, 5*time.Second)
	rss, _ := usage(g.proc.PID())
	r["sim_global_rss_mib"] = rss
	r["sim_global_peak_rss_mib"] = statusMiB(g.proc.PID())["VmHWM"]
	if bins.profileDir != "" {
		if err := e.heapProfile(g, bins.profileDir, "sim"); err != nil {
			return err
		}
	}
	r["sim_global_cpu_ms_per_zone"] = (cpu - cpu0) * 1000 / float64(zones)
	return nil
}

// awaitZoneReports waits until the global shows zones' statuses of the
// MeshTimeout name (status.zones, docs/policy.md#status), up to 120 s after start.
func awaitZoneReports(e *env, g *plane, name string, zones int, start time.Time) error {
	for {
		var got struct {
			Status struct {
				Zones []struct {
					Zone string `json:"zone"`
				} `json:"zones"`
			} `json:"status"`
		}
		if err := e.do("GET", g.api+"/meshes/default/meshtimeouts/"+name, "", &got); err != nil {
			return err
		}
		if len(got.Status.Zones) == zones {
			return nil
		}
		if time.Since(start) > 120*time.Second {
			return fmt.Errorf("the global shows %d of %d zones' statuses of %s after 120 s", len(got.Status.Zones), zones, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ms(d time.Duration, err error) (float64, error) { return msOf(d), err }

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// quiesce waits until no plane used CPU for quiet (no 10 ms tick charged),
// or 20 s passed (continuous activity then shows in what is measured next).
func quiesce(planes []*plane, quiet time.Duration) {
	cpuOf := func() (sum float64) {
		for _, p := range planes {
			_, c := usage(p.proc.PID())
			sum += c
		}
		return sum
	}
	for start := time.Now(); time.Since(start) < 20*time.Second; {
		c0 := cpuOf()
		time.Sleep(quiet)
		if cpuOf() == c0 {
			return
		}
	}
}
