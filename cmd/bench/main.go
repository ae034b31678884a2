// Command bench measures Meridian end to end with real processes: it builds
// global-cp and zone-cp, starts them on loopback with fresh embedded stores,
// drives them over their APIs, and prints a table (min, median and max over
// the runs, with the machine's cores and CPU model) beside the product's bars:
// "core" bars at 10,000 policies and "scale" bars for ten zones, 100
// simulated zones and 100,000 policies (BENCHMARKS.md).
//
//	go run ./cmd/bench                 # 3 runs, 10,000 policies, 100 simulated zones
//	go run ./cmd/bench -runs 5 -n 10000 -sim-zones 100
//
// Scenarios per run: a global with two zone processes (PUT rate with 8
// clients, last write → every zone lists all, a cold zone, one change
// global → zone, zone → global and zone → global → zone, _rules of a proxy
// every policy matches, reconnect with no changes, RSS, CPU and page
// faults, idle CPU); a global with ten zone processes (PUT rate, last
// write → all ten); and a global with simulated zones (internal/zonesim:
// real KDS streams, in-memory zones) for the fan-out to many zones.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meridian-mesh/meridian/internal/kds"
	"github.com/meridian-mesh/meridian/internal/launcher"
)

type binariesAndN struct {
	bins launcher.Binaries
	n    int
	// profileDir, when set, receives CPU profiles of the global and a zone
	// taken during the PUT phase.
	profileDir string
	// simGzip: simulated zones ask for gzip, as zone-cp does.
	simGzip bool
	// logDir, when set, keeps each process's log at logLevel.
	logDir, logLevel string
	// store is the global's store: bolt, or etcd (a 3-member etcd cluster
	// on loopback, started per scenario beside the processes).
	store string
	// writesOnly ends the global + zones scenario after the write figures.
	writesOnly bool
}

// figure is one row of the table.
type figure struct {
	key, label, unit string
	// target is the bar; lower says whether a value below it passes.
	target float64
	lower  bool
	source string // where the bar comes from
}

// figures lists the table's rows. The core bars are set at 10,000
// policies: at another -n those rows carry a scale bar where there is one
// (cold zone, _rules at 100,000), else none.
func figures(n, simZones, proxies int) []figure {
	spec := func(bar10k float64) (float64, string) {
		if n == 10000 {
			return bar10k, "core"
		}
		return 0, ""
	}
	lastWrite, lastWriteSrc := spec(50)
	cold, coldSrc := spec(500)
	if n != 10000 {
		cold, coldSrc = 2000, "scale"
	}
	g2z, g2zSrc := spec(20)
	rules, rulesSrc := spec(50)
	if n != 10000 {
		rules, rulesSrc = 100, "scale"
	}
	globalRSS, globalRSSSrc := spec(100)
	zoneRSS, zoneRSSSrc := spec(80)
	// The scale bar for a zone is at 100,000 policies, after inspecting a
	// proxy; at 10,000 the core zone bar applies to the inspected zone too.
	inspected, inspectedSrc := spec(80)
	if n == 100000 {
		inspected, inspectedSrc = 150, "scale"
	}
	return []figure{
		{"put_rate_1zone", "PUT rate, 8 clients, 2 zones connected", "/s", 5000, false, "core"},
		{"put_rate_10zones", "PUT rate, 8 clients, 10 zone processes", "/s", 2500, false, "scale"},
		{"put_commit_writes", "global store, 2-zone PUT phase: writes per commit", "", 0, true, ""},
		{"put_commit_ms", "global store, 2-zone PUT phase: mean commit", "ms", 0, true, ""},
		{"put10_commit_writes", "global store, 10-zone PUT phase: writes per commit", "", 0, true, ""},
		{"put10_commit_ms", "global store, 10-zone PUT phase: mean commit", "ms", 0, true, ""},
		{"put_global_cpu_us", "global CPU per PUT, 2-zone phase", "µs", 0, true, ""},
		{"put_zone_cpu_us", "zone-1 CPU per PUT, 2-zone phase", "µs", 0, true, ""},
		{"put_zone_commits", "zone-1 store, 2-zone PUT phase: commits", "", 0, true, ""},
		{"put_zone_commit_ms", "zone-1 store, 2-zone PUT phase: mean commit", "ms", 0, true, ""},
		{"put10_global_cpu_us", "global CPU per PUT, 10-zone phase", "µs", 0, true, ""},
		{"put10_zone_cpu_us", "zone-1 CPU per PUT, 10-zone phase", "µs", 0, true, ""},
		{"put10_zone_commits", "zone-1 store, 10-zone PUT phase: commits", "", 0, true, ""},
		{"put10_zone_commit_ms", "zone-1 store, 10-zone PUT phase: mean commit", "ms", 0, true, ""},
		{"last_write_to_zones_ms", fmt.Sprintf("last write → 2 zones list all %d", n), "ms", lastWrite, true, lastWriteSrc},
		{"last_write_to_10zones_ms", fmt.Sprintf("last write → 10 zones list all %d", n), "ms", 2000, true, "scale"},
		{"cold_zone_ms", fmt.Sprintf("cold zone (process start) → lists all %d", n), "ms", cold, true, coldSrc},
		{"cold_zone_faults", "cold zone page faults (process start → lists all)", "", 0, true, ""},
		{"cold_zone_receive_ms", "cold zone: snapshot's first chunk → last chunk", "ms", 0, true, ""},
		{"cold_zone_apply_ms", "cold zone: snapshot's last chunk → committed", "ms", 0, true, ""},
		{"cold_zone_cpu_ms", "cold zone CPU (process start → lists all)", "ms", 0, true, ""},
		{"cold_zone_global_cpu_ms", "global CPU meanwhile (cold zone start → lists all)", "ms", 0, true, ""},
		{"global_to_zone_p50_ms", "one change global → zone, p50", "ms", 0, true, ""},
		{"global_to_zone_p99_ms", "one change global → zone, p99", "ms", g2z, true, g2zSrc},
		{"zone_to_global_p50_ms", "one change zone → global, p50", "ms", 0, true, ""},
		{"zone_to_global_p99_ms", "one change zone → global, p99", "ms", 0, true, ""},
		{"zone_to_zone_p50_ms", "one change zone A → global → zone B (relayed), p50", "ms", 0, true, ""},
		{"zone_to_zone_p99_ms", "one change zone A → global → zone B (relayed), p99", "ms", 0, true, ""},
		{"rules_first_ms", fmt.Sprintf("_rules of a proxy matched by %d policies, first after a change", n), "ms", rules, true, rulesSrc},
		{"rules_warm_ms", fmt.Sprintf("_rules of a proxy matched by %d policies, warm", n), "ms", 0, true, ""},
		{"inspected_rss_mib", fmt.Sprintf("zone RSS after _rules of a proxy matched by %d policies, settled", n), "MiB", inspected, true, inspectedSrc},
		{"inspected_rss_anon_mib", "inspected zone RSS: anonymous (Go heap and runtime)", "MiB", 0, true, ""},
		{"inspected_rss_file_mib", "inspected zone RSS: file-backed (store map, binary)", "MiB", 0, true, ""},
		{"reconnect_resent", "zone restart with no changes: resources resent", "", 0, true, "core"},
		{"reconnect_ms", "zone restart with no changes: process start → connected", "ms", 0, true, ""},
		{"global_rss_mib", fmt.Sprintf("global RSS with %d policies, 3 zones, settled", n), "MiB", globalRSS, true, globalRSSSrc},
		{"global_rss_anon_mib", "global RSS: anonymous (Go heap and runtime)", "MiB", 0, true, ""},
		{"global_rss_file_mib", "global RSS: file-backed (store map, binary)", "MiB", 0, true, ""},
		{"global_cpu_s", "global CPU seconds (whole run)", "s", 0, true, ""},
		{"global_faults", "global page faults (whole run)", "", 0, true, ""},
		{"zone-1_rss_mib", fmt.Sprintf("zone RSS with %d policies, settled", n), "MiB", zoneRSS, true, zoneRSSSrc},
		{"zone-1_rss_anon_mib", "zone RSS: anonymous (Go heap and runtime)", "MiB", 0, true, ""},
		{"zone-1_rss_file_mib", "zone RSS: file-backed (store map, binary)", "MiB", 0, true, ""},
		{"zone-1_cpu_s", "zone CPU seconds (whole run)", "s", 0, true, ""},
		{"zone-1_faults", "zone page faults (whole run)", "", 0, true, ""},
		{"idle_cpu_pct", "idle CPU, global + 3 zones", "%", 1, true, "core"},
		{"sim_fanout_ms", fmt.Sprintf("last write → %d simulated zones hold all %d", simZones, n), "ms", 2000, true, "scale"},
		{"sim_reports_ms", fmt.Sprintf("new policy → the global holds all %d simulated zones' status reports", simZones), "ms", 0, true, ""},
		{"sim_change_p99_ms", fmt.Sprintf("one change → all %d simulated zones, p99", simZones), "ms", 50, true, "scale"},
		{"sim_global_rss_mib", fmt.Sprintf("global RSS, %d simulated zones, %d policies, settled", simZones, n), "MiB", 200, true, "scale"},
		{"sim_global_peak_rss_mib", "global peak RSS (VmHWM), simulated zones scenario", "MiB", 0, true, ""},
		{"sim_global_cpu_ms_per_zone", "global CPU per simulated zone (writes + fan-out)", "ms", 0, true, ""},
		{"enforce_p50_ms", "global write → enforced in a gRPC client in zone-2, p50", "ms", 0, true, ""},
		{"enforce_p99_ms", "global write → enforced in a gRPC client in zone-2, p99", "ms", 100, true, "data plane"},
		{"proxies_joined_ms", fmt.Sprintf("%d proxies join a zone, 16 at a time → every one has its first listeners", proxies), "ms", 0, true, ""},
		{"proxies_join_cpu_ms", "zone CPU per joining proxy (TLS, join, certificates, first configuration)", "ms", 0, true, ""},
		{"proxies_acked_ms", fmt.Sprintf("mesh-wide change → all %d proxies of a zone ACKed", proxies), "ms", dpBar(proxies, 1000), true, dpSrc(proxies)},
		{"proxy_rss_kib", fmt.Sprintf("zone RSS per connected proxy (%d proxies)", proxies), "KiB", dpBar(proxies, 100), true, dpSrc(proxies)},
		{"proxies_idle_cpu_pct", fmt.Sprintf("zone idle CPU with %d connected proxies", proxies), "%", dpBar(proxies, 1), true, dpSrc(proxies)},
		{"render_full_grpc_p50_ms", fmt.Sprintf("a proxy's config and gRPC resources rendered whole, %d policies, %d outbounds, p50", n, renderServices), "ms", 0, true, ""},
		{"render_full_envoy_p50_ms", fmt.Sprintf("a proxy's config and Envoy resources rendered whole, %d policies, %d outbounds, p50", n, renderServices), "ms", 0, true, ""},
		{"render_grpc_p50_ms", fmt.Sprintf("one change → a proxy's config and gRPC resources, from its last, %d policies, %d outbounds, p50", n, renderServices), "ms", 0, true, ""},
		{"render_envoy_p50_ms", fmt.Sprintf("one change → a proxy's config and Envoy resources, from its last, %d policies, %d outbounds, p50", n, renderServices), "ms", 0, true, ""},
		{"render_full_grpc_p99_ms", fmt.Sprintf("a proxy's config and gRPC resources rendered whole, %d policies, %d outbounds, p99", n, renderServices), "ms", renderBar(n, 5), true, renderSrc(n)},
		{"render_full_envoy_p99_ms", fmt.Sprintf("a proxy's config and Envoy resources rendered whole, %d policies, %d outbounds, p99", n, renderServices), "ms", renderBar(n, 5), true, renderSrc(n)},
		{"render_grpc_p99_ms", fmt.Sprintf("one change → a proxy's config and gRPC resources, from its last, %d policies, %d outbounds, p99", n, renderServices), "ms", renderBar(n, 1), true, renderSrc(n)},
		{"render_envoy_p99_ms", fmt.Sprintf("one change → a proxy's config and Envoy resources, from its last, %d policies, %d outbounds, p99", n, renderServices), "ms", renderBar(n, 1), true, renderSrc(n)},
		{"render_envoy_kib", fmt.Sprintf("Envoy resources of a proxy with %d outbounds, encoded", renderServices), "KiB", 1024, true, "data plane"},
	}
}

// renderBar and renderSrc: the rendering bars are set at 10,000 policies.
func renderBar(n int, bar float64) float64 {
	if n != 10000 {
		return 0
	}
	return bar
}

func renderSrc(n int) string {
	if n != 10000 {
		return ""
	}
	return "data plane"
}

// dpBar and dpSrc: the data plane bars are set at 1,000 proxies.
func dpBar(proxies int, bar float64) float64 {
	if proxies != 1000 {
		return 0
	}
	return bar
}

func dpSrc(proxies int) string {
	if proxies != 1000 {
		return ""
	}
	return "data plane"
}

func main() {
	kds.RegisterGzip() // the simulated zones compress as zone-cp does
	runs := flag.Int("runs", 3, "runs of every scenario")
	n := flag.Int("n", 10000, "policies per scenario")
	simZones := flag.Int("sim-zones", 100, "simulated zones (0: skip)")
	skipTen := flag.Bool("skip-ten", false, "skip the ten-zone-process scenario")
	skipFleet := flag.Bool("skip-fleet", false, "skip the global + zones scenario")
	skipDataPlane := flag.Bool("skip-dataplane", false, "skip the data plane scenario (gRPC workloads, simulated proxies)")
	proxies := flag.Int("proxies", 1000, "simulated proxies of the data plane scenario (0: only the workloads)")
	profileDir := flag.String("profile", "", "write CPU profiles to this directory: the global and zone-1 during the PUT phase, the global and the cold zone over the cold zone's first 5 s, the global and one of ten zones during the ten-zone PUT phase, every plane during the idle window, zone-2 during the first _rules after a change, the global during the simulated zones' changes; and the heap profiles (with /metrics and smaps) of zone-2 once quiet after the _rules calls, of the global and zone-1 once settled and of the global after the simulated zones' changes; the data plane zone during the first 5 s of its proxies' join (CPU), once they joined (heap) and during their mesh-wide change (CPU)")
	logDir := flag.String("logs", "", "append each process's log to DIR/<name>.log")
	logLevel := flag.String("log-level", "warn", "the processes' --log-level (info shows, e.g., when a full snapshot was sent and applied)")
	simGzip := flag.Bool("sim-gzip", true, "simulated zones ask for gzip as zone-cp does (false: uncompressed streams)")
	writesOnly := flag.Bool("writes-only", false, "end the global + zones scenario after its PUT rate and last-write figures (quick A/B runs of the write path)")
	store := flag.String("store", "bolt", "the global's store: bolt, or etcd (a 3-member etcd cluster on loopback, built from tools/etcd)")
	flag.Parse()
	if *store != "bolt" && *store != "etcd" {
		fmt.Fprintln(os.Stderr, "bench: -store must be bolt or etcd")
		os.Exit(2)
	}
	b := binariesAndN{n: *n, profileDir: *profileDir, simGzip: *simGzip, logDir: *logDir, logLevel: *logLevel, store: *store, writesOnly: *writesOnly}
	for _, dir := range []string{*profileDir, *logDir} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	if *skipDataPlane {
		*proxies = -1
	}
	if err := run(*runs, *simZones, *proxies, *skipTen, *skipFleet, b); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run runs every scenario runs times; proxies < 0 skips the data plane.
func run(runs, simZones, proxies int, skipTen, skipFleet bool, b binariesAndN) error {
	wd, _ := os.Getwd()
	root, err := launcher.ModuleRoot(wd)
	if err != nil {
		return err
	}
	binDir, err := os.MkdirTemp("", "meridian-bench-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	fmt.Fprintln(os.Stderr, "building global-cp, zone-cp, meridian-dp and the greeter ...")
	bins, err := launcher.Build(context.Background(), root, filepath.Join(binDir, "bin"))
	if err != nil {
		return err
	}
	b.bins = bins
	all := make([]results, 0, runs)
	for i := range runs {
		r := results{}
		steps := []struct {
			name string
			fn   func() error
		}{
			{"global + zones", func() error {
				if skipFleet {
					return nil
				}
				return fleet(b, r)
			}},
			{"ten zone processes", func() error {
				if skipTen {
					return nil
				}
				return tenZones(b, r)
			}},
			{"simulated zones", func() error {
				if simZones == 0 {
					return nil
				}
				return simulated(b, simZones, r)
			}},
			// Rendering runs in this process: before the data plane
			// scenario, whose thousand simulated proxies live here too.
			{"rendering", func() error {
				if proxies < 0 {
					return nil
				}
				return renderScenario(b.n, b.profileDir, r)
			}},
			{"data plane", func() error {
				if proxies < 0 {
					return nil
				}
				return dataPlane(b, proxies, r)
			}},
		}
		for _, s := range steps {
			t0 := time.Now()
			if err := s.fn(); err != nil {
				return fmt.Errorf("run %d, %s: %w", i+1, s.name, err)
			}
			fmt.Fprintf(os.Stderr, "run %d/%d: %s done in %s\n", i+1, runs, s.name, time.Since(t0).Round(100*time.Millisecond))
		}
		all = append(all, r)
	}
	printTable(figures(b.n, simZones, proxies), all, runs, b.store)
	return nil
}

func printTable(figs []figure, all []results, runs int, store string) {
	fmt.Printf("Meridian %s — %d runs — global store %s — %d cores, %s — %s\n\n", "bench", runs, store, runtime.NumCPU(), cpuModel(), time.Now().UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tmin\tmedian\tmax\tbar\tresult")
	for _, f := range figs {
		var vals []float64
		for _, r := range all {
			if v, ok := r[f.key]; ok {
				vals = append(vals, v)
			}
		}
		if len(vals) == 0 {
			continue
		}
		slices.Sort(vals)
		med := vals[len(vals)/2]
		bar, verdict := "-", "-"
		if f.source != "" {
			cmp := "≥"
			pass := med >= f.target
			if f.lower {
				cmp, pass = "≤", med <= f.target
			}
			bar = fmt.Sprintf("%s %s%s (%s)", cmp, num(f.target), f.unit, f.source)
			verdict = "pass"
			if !pass {
				verdict = "FAIL"
			}
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s%s\t%s%s\t%s\t%s\n", f.label, num(vals[0]), f.unit, num(med), f.unit, num(vals[len(vals)-1]), f.unit, bar, verdict)
	}
	_ = tw.Flush()
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
