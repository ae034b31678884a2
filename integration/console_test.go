package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/meridian-mesh/meridian/internal/auth"
)

// The console's end-to-end tests drive a real headless Chromium (Debian's
// chromium package; .ci/run installs it) through chromedp against real
// control plane processes. Screenshots of every page go to one folder per
// run, named in the test log.

var screenshotDir string

// chromiumPath finds the browser, or skips the test saying how to get one.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MERIDIAN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium on this machine: install Debian's chromium package (apt-get install chromium; .ci/run does) " +
		"or set MERIDIAN_CHROMIUM to run the console's browser tests"
	if os.Getenv("MERIDIAN_REQUIRE_CHROMIUM") != "" {
		t.Fatal(msg) // CI: the browser tests must run
	}
	t.Skip(msg)
	return ""
}

// browser starts a headless Chromium for the test with the flags this
// closed network needs (no background networking, no component updates).
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser; no timeout here (it would stop the browser)
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// do runs steps with a bound, so a page that never shows what a test waits
// for fails the test instead of hanging it.
//
// A live page may replace its main section between the lookup of a node and
// the action on it ("No node with given id"); the action did not happen, so
// the steps are run again.
func do(ctx context.Context, steps ...chromedp.Action[chromedp.Void]) error {
	for attempt := 0; ; attempt++ {
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := chromedp.Do(c, steps...)
		cancel()
		if err == nil || attempt == 2 || !strings.Contains(err.Error(), "node with given id") {
			return err
		}
	}
}

// waitJS evaluates js until it is true, across navigations (a submitted
// form replaces the page under the evaluation).
func waitJS(ctx context.Context, js string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := run(ctx, chromedp.Evaluate[bool](js))
		if err == nil && ok {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not true after %s: %s (last error: %v)", timeout, js, last)
}

// run is do for one action with a value.
func run[T any](ctx context.Context, a chromedp.Action[T]) (T, error) {
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return chromedp.Run(c, a)
}

// shot saves a full-page screenshot as NAME.png in the run's folder.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if screenshotDir == "" {
		dir, err := os.MkdirTemp("", "meridian-console-screenshots-")
		if err != nil {
			t.Fatal(err)
		}
		screenshotDir = dir
	}
	png, err := run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(screenshotDir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// firstPaint is the page's first contentful paint in ms (navigation start
// to the first text or image drawn), from the browser's Paint Timing API.
func firstPaint(t *testing.T, ctx context.Context) float64 {
	t.Helper()
	js := `(performance.getEntriesByName('first-contentful-paint')[0] || {startTime: -1}).startTime`
	if _, err := run(ctx, chromedp.Poll[bool](js+` >= 0`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("first paint: %v", err)
	}
	ms, err := run(ctx, chromedp.Evaluate[float64](js))
	if err != nil {
		t.Fatalf("first paint: %v", err)
	}
	return ms
}

// text reads an element's text in one evaluation: a live page may replace
// its main section (server-sent "changed") between a node lookup and a
// read, so node ids are not held across calls.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.innerText : null; })()`, sel)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := run(ctx, chromedp.Evaluate[*string](js))
		if err == nil && s != nil {
			return *s
		}
		if time.Now().After(deadline) {
			t.Fatalf("text of %s: not found (%v)", sel, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestConsoleZonesLive: the global's zones page lists both zones online and
// flips one to offline when its process is killed, without a reload.
func TestConsoleZonesLive(t *testing.T) {
	ctx := browser(t)
	c := startCluster(t)
	for _, z := range []string{"zone-1", "zone-2"} {
		eventually(t, 20*time.Second, func() error {
			if !zoneConnected(t, c.global, z) {
				return fmt.Errorf("%s not connected", z)
			}
			return nil
		})
	}
	// A proxy in zone-2 (Kubernetes) shaped by a global policy and a zone one: each field
	// names the policy that set it and where that policy comes from.
	apply(t, c.global, mustRead(t, examplePath(t, "global-policies.yaml")))
	apply(t, c.zone2, mustRead(t, examplePath(t, "zone-1-resources.yaml"))) // written for a Kubernetes zone: zone-2 is one
	page := c.zone2.api + "/gui/meshes/default/dataplanes/web-1?namespace=web-ns"
	eventually(t, 20*time.Second, func() error {
		if err := do(ctx, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("h1"))); err != nil {
			return err
		}
		got := text(t, ctx, "main")
		for _, want := range []string{"default-timeout-global", "[global]", "backend-timeouts", "[zone zone-2]"} {
			if !strings.Contains(got, want) {
				return fmt.Errorf("web-1's page lacks %q yet", want)
			}
		}
		return nil
	})
	shot(t, ctx, "zone-dataplane-multizone")

	if err := do(ctx, chromedp.Navigate(c.global.api+"/gui/"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-zone="zone-1"] [data-state="online"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-zone="zone-2"] [data-state="online"]`))); err != nil {
		t.Fatalf("zones page: %v", err)
	}
	t.Logf("zones page first paint: %.0f ms", firstPaint(t, ctx))
	shot(t, ctx, "global-zones")
	loaded, err := run(ctx, chromedp.Evaluate[float64](`performance.timeOrigin`))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.zone2.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := do(ctx, chromedp.WaitVisible(chromedp.CSS(`tr[data-zone="zone-2"] [data-state="offline"]`))); err != nil {
		t.Fatalf("zone-2 never shown offline: %v", err)
	}
	after, err := run(ctx, chromedp.Evaluate[float64](`performance.timeOrigin`))
	if err != nil {
		t.Fatal(err)
	}
	if after != loaded {
		t.Errorf("the page was reloaded (time origin %f -> %f); it should update in place", loaded, after)
	}
	if got := text(t, ctx, `tr[data-zone="zone-2"]`); !strings.Contains(got, "connection closed") {
		t.Errorf("zone-2's row does not say why it is offline: %q", got)
	}
	if got := text(t, ctx, `tr[data-zone="zone-1"] [data-state]`); got != "online" {
		t.Errorf("zone-1 shows %q after zone-2 was killed", got)
	}
	t.Logf("zone-2 shown offline %s after kill -9, without reload", time.Since(start).Round(time.Millisecond))
	shot(t, ctx, "global-zones-one-offline")
	if err := do(ctx, chromedp.Navigate(c.global.api+"/gui/zones/zone-1"), chromedp.WaitVisible(chromedp.CSS(`h1`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "main"); !strings.Contains(got, "Global → zone") || !strings.Contains(got, "MeshTimeout") && !strings.Contains(got, "Mesh") {
		t.Errorf("zone page lacks its sync flows: %s", got)
	}
	shot(t, ctx, "global-zone-detail")
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestConsoleDataplaneSeed001: a zone's Dataplane page shows the example
// policies' effective configuration with who set each field, and the what-if
// form answers their MeshTrafficPermission cases, typed with the keyboard.
func TestConsoleDataplaneSeed001(t *testing.T) {
	ctx := browser(t)
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal")
	if out, code := z.ctl("", "apply", "-f", examplePath(t, "global-policies.yaml")); code != 0 {
		t.Fatalf("apply: %s", out)
	}
	if out, code := z.ctl(backendDataplane, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply dataplane: %s", out)
	}
	if err := do(ctx, chromedp.Navigate(z.api+"/gui/"),
		chromedp.WaitVisible(chromedp.CSS(`#dataplanes a[href*="backend-1"]`))); err != nil {
		t.Fatalf("dataplanes page: %v", err)
	}
	t.Logf("dataplanes page first paint: %.0f ms", firstPaint(t, ctx))
	shot(t, ctx, "zone-dataplanes")
	if err := do(ctx, chromedp.Click(chromedp.CSS(`#dataplanes a[href*="backend-1"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#out-10001`))); err != nil {
		t.Fatalf("dataplane page: %v", err)
	}
	outbound := text(t, ctx, `section[aria-labelledby="out-10001"]`)
	for _, want := range []string{"MeshTimeout", "idleTimeout", "default-timeout-global"} {
		if !strings.Contains(outbound, want) {
			t.Errorf("outbound section lacks %q: %s", want, outbound)
		}
	}
	mtp := text(t, ctx, `table.mtp`)
	for _, want := range []string{"kuma.io/service = web, version = v1", "denied", "allowed", "backend-permissions"} {
		if !strings.Contains(mtp, want) {
			t.Errorf("MeshTrafficPermission table lacks %q: %s", want, mtp)
		}
	}
	shot(t, ctx, "zone-dataplane")

	cases := []struct{ client, decision string }{
		{"kuma.io/service:web, version:v1", "deny"},
		{"kuma.io/service:web, version:v2", "allow"},
		{"kuma.io/service:infra-logger", "allow"},
	}
	for i, tc := range cases {
		// Keyboard only: focus the field, replace its text, press Enter.
		_, err := run(ctx, chromedp.Evaluate[bool](`(() => { const f = document.querySelector('#wi-client'); f.value = ''; f.focus(); return true; })()`))
		if err == nil {
			err = do(ctx, chromedp.SendKeys(chromedp.CSS(`#wi-client`), tc.client+"\r"))
		}
		if err == nil {
			// The answer for this client (not the previous page's).
			js := fmt.Sprintf(`(() => { const d = document.querySelector('#whatif-result [data-decision]');
				const p = document.querySelector('#whatif-result .decision');
				return !!d && p.textContent.includes(%q) && d.dataset.decision === %q; })()`, tc.client, tc.decision)
			err = waitJS(ctx, js, 20*time.Second)
		}
		if err != nil {
			t.Fatalf("what-if %s: %v (page: %s)", tc.client, err, text(t, ctx, "main"))
		}
		got := text(t, ctx, `#whatif-result .decision`)
		if !strings.Contains(got, "backend-permissions") {
			t.Errorf("what-if %s: the decision does not name its policy: %s", tc.client, got)
		}
		t.Logf("what-if %s: %s", tc.client, got)
		shot(t, ctx, fmt.Sprintf("zone-whatif-%d", i+1))
	}
	if err := do(ctx, chromedp.Click(chromedp.CSS(`#whatif-result a[href*="explain"]`)),
		chromedp.WaitVisible(chromedp.CSS(`table.fields`))); err != nil {
		t.Fatalf("explain page: %v", err)
	}
	if got := text(t, ctx, "main"); !strings.Contains(got, "Every contribution") || !strings.Contains(got, "backend-permissions") {
		t.Errorf("explain page: %s", got)
	}
	shot(t, ctx, "zone-explain")
	if err := do(ctx, chromedp.Navigate(z.api+"/gui/policies?type=MeshTrafficPermission"),
		chromedp.WaitVisible(chromedp.CSS(`#policies`))); err != nil {
		t.Fatalf("policies page: %v", err)
	}
	if got := text(t, ctx, "#policies"); !strings.Contains(got, "backend-permissions") || !strings.Contains(got, "yes") {
		t.Errorf("policies page lacks backend-permissions accepted: %s", got)
	}
	shot(t, ctx, "zone-policies")
}

// TestConsoleViewerSeesNoAdminActions: without localhost-is-admin the
// console asks for a token; a viewer reads every page but sees no token
// actions (and the API would refuse them anyway); an admin sees them.
func TestConsoleViewerSeesNoAdminActions(t *testing.T) {
	ctx := browser(t)
	g := startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", freeAddress(t), "--api-localhost-is-admin=false")
	admin := readTokenFile(t, filepath.Join(g.dataDir, auth.AdminTokenFileName))
	viewer := g.ctlToken("--token", admin, "generate", "user-token", "--name", "ro", "--group", "mesh-system:viewer", "--valid-for", "1h")
	login := func(token string) {
		t.Helper()
		err := do(ctx, chromedp.Navigate(g.api+"/gui/tokens"),
			chromedp.WaitVisible(chromedp.CSS(`#token`)),
			chromedp.SetValue(chromedp.CSS(`#token`), strings.TrimSpace(token)),
			chromedp.Submit(chromedp.CSS(`#token`)),
			chromedp.WaitVisible(chromedp.CSS(`h1`)))
		if err != nil {
			t.Fatalf("sign in: %v", err)
		}
	}
	if err := do(ctx, chromedp.Navigate(g.api+"/gui/"), chromedp.WaitVisible(chromedp.CSS(`#token`))); err != nil {
		t.Fatalf("no login form for an anonymous remote-less browser: %v", err)
	}
	shot(t, ctx, "login")
	login(viewer)
	main := text(t, ctx, "main")
	if !strings.Contains(main, "needs an admin") {
		t.Errorf("viewer on the tokens page: %s", main)
	}
	forms, err1 := run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#issue-token, #revoke-token').length`))
	navTokens, err2 := run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('nav a[href="/gui/tokens"]').length`))
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if forms != 0 || navTokens != 0 {
		t.Errorf("a viewer sees %d token forms and %d token links", forms, navTokens)
	}
	shot(t, ctx, "viewer-tokens")
	if err := do(ctx, chromedp.Navigate(g.api+"/gui/policies?type=MeshTimeout"), chromedp.WaitVisible(chromedp.CSS(`h1`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "main"); !strings.Contains(got, "MeshTimeout in mesh default") {
		t.Errorf("viewer cannot read policies: %s", got)
	}
	if err := do(ctx, chromedp.Click(chromedp.CSS(`header form.user button`)), chromedp.WaitVisible(chromedp.CSS(`#token`))); err != nil {
		t.Fatalf("sign out: %v", err)
	}
	login(admin)
	if err := do(ctx, chromedp.WaitVisible(chromedp.CSS(`#issue-token`)),
		chromedp.SetValue(chromedp.CSS(`#zone`), "zone-7"), chromedp.Submit(chromedp.CSS(`#zone`)),
		chromedp.WaitVisible(chromedp.CSS(`#issued-token`))); err != nil {
		t.Fatalf("admin issues a zone token: %v", err)
	}
	shot(t, ctx, "admin-token-issued")
}

// TestConsoleFirstPaint measures (does not assert: figures go to
// BENCHMARKS.md) the first contentful paint of the console's pages on a
// zone holding 10,000 MeshTimeouts and 1,000 Dataplanes. Each page is
// loaded once to warm the zone's snapshot, then measured on a second load.
// Run: MERIDIAN_CONSOLE_PERF=1 go test -run TestConsoleFirstPaint -v ./integration/
func TestConsoleFirstPaint(t *testing.T) {
	if os.Getenv("MERIDIAN_CONSOLE_PERF") == "" {
		t.Skip("a measurement; set MERIDIAN_CONSOLE_PERF=1")
	}
	ctx := browser(t)
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal")
	if out, code := z.ctl("", "apply", "-f", examplePath(t, "global-policies.yaml")); code != 0 {
		t.Fatalf("apply: %s", out)
	}
	putTimeouts(t, z, seq("t", 0, 10000), func(i int) int { return 1 + i%50 })
	putDataplanes(t, z, 1000)
	pages := []string{"/gui/dataplanes", "/gui/dataplanes?q=dp-0999", "/gui/policies?type=MeshTimeout",
		"/gui/policies?type=MeshTimeout&offset=9950", "/gui/meshes/default/dataplanes/dp-0500",
		"/gui/meshes/default/dataplanes/dp-0500?inbound=8080&client=kuma.io%2Fservice%3Aweb",
		"/gui/meshes/default/dataplanes/dp-0500/explain?type=MeshTimeout&outbound=svc-1"}
	for _, p := range pages {
		var ms []float64
		for range 2 {
			if err := do(ctx, chromedp.Navigate(z.api+p), chromedp.WaitVisible(chromedp.CSS("h1"))); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			ms = append(ms, firstPaint(t, ctx))
		}
		t.Logf("first paint %-80s first load %4.0f ms, warm %4.0f ms", p, ms[0], ms[1])
	}
}

// putDataplanes writes n Dataplanes dp-0000.. with one inbound (service
// svc-i%20) and one outbound, 8 at a time.
func putDataplanes(t *testing.T, n *node, count int) {
	t.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				name := fmt.Sprintf("dp-%04d", i)
				body := fmt.Sprintf(`{"type":"Dataplane","mesh":"default","name":%q,"networking":{"address":"10.1.%d.%d",`+
					`"inbound":[{"port":8080,"tags":{"kuma.io/service":"svc-%d","version":"v1"}}],`+
					`"outbound":[{"port":10001,"tags":{"kuma.io/service":"svc-%d"}}]}}`, name, i/250, i%250, i%20, (i+1)%20)
				req, _ := http.NewRequest("PUT", n.api+"/meshes/default/dataplanes/"+name, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := bulkClient.Do(req)
				if err != nil {
					t.Error(err)
					continue
				}
				resp.Body.Close()
				if resp.StatusCode/100 != 2 {
					t.Errorf("PUT %s: %d", name, resp.StatusCode)
				}
			}
		}()
	}
	for i := range count {
		next <- i
	}
	close(next)
	wg.Wait()
}
