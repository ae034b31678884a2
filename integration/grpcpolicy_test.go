package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Policies enforced by real gRPC clients (docs/dataplane.md#policies): a
// greeter that answers late, fails on purpose or is one of several
// instances, a client calling it under meridian-dp, and policies written on
// the global and in the zone.

// callerDataplane is a Universal Dataplane of service svc on port that
// declares an outbound to each of calls.
func callerDataplane(name, svc string, port int, calls ...string) string {
	dp := greeterDataplane(name, svc, port) + "  outbound:\n"
	for i, c := range calls {
		dp += fmt.Sprintf("    - port: %d\n      tags:\n        kuma.io/service: %s\n", 20001+i, c)
	}
	return dp
}

// callDuration reads "in D" at the end of a call line.
func callDuration(t *testing.T, line string) time.Duration {
	t.Helper()
	i := strings.LastIndex(line, " in ")
	if i < 0 {
		t.Fatalf("call line without a duration: %q", line)
	}
	d, err := time.ParseDuration(line[i+4:])
	if err != nil {
		t.Fatalf("call line %q: %v", line, err)
	}
	return d
}

// lastCall waits for a call line after mark with prefix and returns it.
func (w *workload) lastCall(mark int, prefix string, timeout time.Duration) string {
	w.t.Helper()
	w.waitCall(mark, prefix, timeout)
	lines := w.lines()
	for i := len(lines) - 1; i >= min(mark, len(lines)); i-- {
		if strings.HasPrefix(lines[i], prefix) {
			return lines[i]
		}
	}
	w.t.Fatalf("%s: call line %q gone", w.name, prefix)
	return ""
}

// TestGRPCTimeoutsAndRetries: MeshTimeout and MeshRetry from the global and
// from the zone reach a real gRPC client; a global override caps the zone's
// timeout in real traffic.
func TestGRPCTimeoutsAndRetries(t *testing.T) {
	c := startDPCluster(t)
	mtlsMesh(t, c.global, "24h")
	apply(t, c.global, allowAll)
	waitPresent(t, c.zone1, "/meshes/default/meshtrafficpermissions")
	slowPort, flakyPort := freePort(t), freePort(t)
	startWorkload(t, c.zone1, "slow-1", greeterDataplane("slow-1", "slow", slowPort),
		"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", slowPort), "--delay", "2s")
	flaky := startWorkload(t, c.zone1, "flaky-1", greeterDataplane("flaky-1", "flaky", flakyPort),
		"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", flakyPort), "--fail-first", "2")
	slowClient := startWorkload(t, c.zone1, "slow-client", callerDataplane("slow-client", "client", freePort(t), "slow"),
		"call", "--service", "slow", "--every", "100ms", "--timeout", "10s")
	flakyClient := startWorkload(t, c.zone1, "flaky-client", callerDataplane("flaky-client", "client", freePort(t), "flaky"),
		"call", "--service", "flaky", "--every", "100ms", "--timeout", "5s")

	// No policy: the slow call takes its 2 s, the flaky one fails.
	if d := callDuration(t, slowClient.lastCall(0, "ok ", 40*time.Second)); d < 2*time.Second {
		t.Fatalf("slow call answered in %s, want its 2 s delay", d)
	}
	flakyClient.waitCall(0, "error Unavailable", 40*time.Second)

	t.Run("MeshTimeout", func(t *testing.T) {
		// A zone policy gives the slow service 5 s: the call succeeds.
		apply(t, c.zone1, `type: MeshTimeout
mesh: default
name: slow-5s
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: slow}
      default: {http: {requestTimeout: 5s}}
`)
		// A global override caps every request timeout at 1 s: the zone
		// cannot undo it, and the call fails at 1 s, not before.
		apply(t, c.global, `type: MeshTimeout
mesh: default
name: request-cap
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: Mesh}
      override: {http: {requestTimeout: 1s}}
      when:
        override: "duration(self.http.requestTimeout) > duration('1s')"
`)
		mark := slowClient.mark()
		line := slowClient.lastCall(mark, "error DeadlineExceeded", 20*time.Second)
		if d := callDuration(t, line); d < 900*time.Millisecond || d > 1900*time.Millisecond {
			t.Errorf("capped call failed after %s, want about 1 s (%q)", d, line)
		}
		// The override removed: the zone's 5 s holds and the call succeeds.
		deleteOn(t, c.global, "/meshes/default/meshtimeouts/request-cap")
		slowClient.waitCall(slowClient.mark(), "ok ", 30*time.Second)
		// A global default of 300 ms where the zone says nothing.
		deleteOn(t, c.zone1, "/meshes/default/meshtimeouts/slow-5s")
		apply(t, c.global, `type: MeshTimeout
mesh: default
name: fast-fail
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: slow}
      default: {http: {requestTimeout: 300ms}}
`)
		line = slowClient.lastCall(slowClient.mark(), "error DeadlineExceeded", 20*time.Second)
		if d := callDuration(t, line); d < 250*time.Millisecond || d > 1200*time.Millisecond {
			t.Errorf("call failed after %s, want about 300 ms (%q)", d, line)
		}
	})

	t.Run("MeshRetry", func(t *testing.T) {
		// A global policy retries Unavailable twice: the third attempt,
		// counted on the server, succeeds.
		apply(t, c.global, `type: MeshRetry
mesh: default
name: retry-unavailable
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: flaky}
      default:
        grpc:
          numRetries: 2
          retryOn: [Unavailable]
          backOff: {baseInterval: 10ms, maxInterval: 50ms}
`)
		line := flakyClient.lastCall(flakyClient.mark(), "ok ", 30*time.Second)
		name := strings.Fields(line)[4] // ok ZONE INSTANCE hello NAME in D
		if !strings.HasPrefix(name, "call-") {
			t.Fatalf("cannot read the call's name from %q", line)
		}
		eventually(t, 5*time.Second, func() error {
			if !strings.Contains(flaky.log.String(), "attempt "+name+" 3\n") {
				return fmt.Errorf("server did not count 3 attempts of %s", name)
			}
			return nil
		})
		// The zone's own policy says numRetries 0: no retries, the error.
		apply(t, c.zone1, `type: MeshRetry
mesh: default
name: no-retries
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: flaky}
      default: {grpc: {numRetries: 0}}
`)
		flakyClient.waitCall(flakyClient.mark(), "error Unavailable", 30*time.Second)
	})

	t.Run("Programmed reported to the global", func(t *testing.T) {
		// A global MeshHealthCheck no gRPC client can carry: zone-1, whose
		// connected proxies leave it out, reports its Programmed condition
		// with the policy's status, and the global shows it under the
		// zone.
		apply(t, c.global, `type: MeshHealthCheck
mesh: default
name: global-health
spec:
  targetRef: {kind: MeshService, name: client}
  to:
    - targetRef: {kind: MeshService, name: slow}
      default: {interval: 10s, timeout: 2s, unhealthyThreshold: 3, healthyThreshold: 1}
`)
		eventually(t, 30*time.Second, func() error {
			_, body := c.global.request("GET", "/meshes/default/meshhealthchecks/global-health", "")
			var got struct {
				Status struct {
					Zones []struct {
						Zone       string                                           `json:"zone"`
						Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
					} `json:"zones"`
				} `json:"status"`
			}
			if err := json.Unmarshal(body, &got); err != nil {
				return err
			}
			for _, z := range got.Status.Zones {
				for _, cond := range z.Conditions {
					// Partially: flaky-client, of the same service, is
					// selected but calls no slow.
					if z.Zone == "zone-1" && cond.Type == "Programmed" && cond.Status == "False" && cond.Reason == "PartiallyProgrammed" &&
						strings.Contains(cond.Message, "slow-client: MeshHealthCheck on the outbound to slow") {
						return nil
					}
				}
			}
			return fmt.Errorf("no Programmed condition from zone-1 in %s", body)
		})
	})
}

// deleteOn deletes path on n; it must have existed.
func deleteOn(t *testing.T, n *node, path string) {
	t.Helper()
	if status, body := n.request("DELETE", path, ""); status != 200 && status != 204 {
		t.Fatalf("DELETE %s: %d %s", path, status, body)
	}
}

// instancesAfter counts the instances that answered the ok lines after
// mark, and the errors.
func (w *workload) instancesAfter(mark int) (map[string]int, int) {
	ok, failed := w.callResults(mark)
	seen := map[string]int{}
	for _, l := range ok {
		if f := strings.Fields(l); len(f) > 2 {
			seen[f[2]]++
		}
	}
	return seen, len(failed)
}

// waitInstances waits until n instances answered the calls.
func (w *workload) waitInstances(n int, timeout time.Duration) {
	w.t.Helper()
	eventually(w.t, timeout, func() error {
		if seen, _ := w.instancesAfter(0); len(seen) < n {
			return fmt.Errorf("instances so far %v", seen)
		}
		return nil
	})
}

// TestGRPCBalancingAndBreakers: MeshLoadBalancingStrategy and
// MeshCircuitBreaker written in a zone, enforced by a real gRPC client.
func TestGRPCBalancingAndBreakers(t *testing.T) {
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), "--zone", "zone-1", "--environment", "universal")
	mtlsMesh(t, z, "24h")
	apply(t, z, allowAll)
	serve := func(name, svc string, args ...string) *workload {
		port := freePort(t)
		return startWorkload(t, z, name, greeterDataplane(name, svc, port),
			append([]string{"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port)}, args...)...)
	}

	t.Run("MeshLoadBalancingStrategy", func(t *testing.T) {
		serve("echo-1", "echo")
		serve("echo-2", "echo")
		client := startWorkload(t, z, "echo-client", callerDataplane("echo-client", "client", freePort(t), "echo"),
			"call", "--service", "echo", "--every", "20ms", "--header", "x-user=alice")
		// Round robin (no policy): both instances answer.
		client.waitInstances(2, 40*time.Second)
		apply(t, z, `type: MeshLoadBalancingStrategy
mesh: default
name: echo-by-user
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: echo}
      default:
        loadBalancer:
          type: RingHash
          ringHash:
            hashPolicies:
              - {type: Header, header: {name: x-user}}
`)
		// A ring hash on x-user keeps alice on one instance: 40 calls in a
		// row from one instance (after the change reached the client).
		eventually(t, 30*time.Second, func() error {
			mark := client.mark()
			time.Sleep(time.Second)
			seen, failed := client.instancesAfter(mark)
			total := failed
			for _, n := range seen {
				total += n
			}
			if len(seen) != 1 || failed > 0 || total < 40 {
				return fmt.Errorf("%d calls in a second: instances %v, %d failed", total, seen, failed)
			}
			return nil
		})
	})

	t.Run("MeshLoadBalancingStrategy affinity tags", func(t *testing.T) {
		// Two instances in racks r1 and r2; the client runs in r1.
		// Affinity on rack weighs r1's locality 99 and the rest 1.
		withRack := func(dp, rack string) string {
			return strings.Replace(dp, "kuma.io/service: ", "rack: "+rack+"\n        kuma.io/service: ", 1)
		}
		for _, rack := range []string{"r1", "r2"} {
			port := freePort(t)
			startWorkload(t, z, "rack-"+rack, withRack(greeterDataplane("rack-"+rack, "racked", port), rack),
				"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
		}
		client := startWorkload(t, z, "rack-client", withRack(callerDataplane("rack-client", "client", freePort(t), "racked"), "r1"),
			"call", "--service", "racked", "--every", "10ms")
		client.waitInstances(2, 40*time.Second)
		apply(t, z, `type: MeshLoadBalancingStrategy
mesh: default
name: racked-affinity
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: racked}
      default:
        localityAwareness:
          localZone:
            affinityTags:
              - {key: rack, weight: 99}
`)
		// 99 % of the calls stay in the client's rack: of 150 calls at
		// least 90 % reach rack-r1 (after the change reached the client).
		eventually(t, 30*time.Second, func() error {
			mark := client.mark()
			time.Sleep(2 * time.Second)
			seen, failed := client.instancesAfter(mark)
			total := failed
			for _, n := range seen {
				total += n
			}
			if total < 150 || failed > 0 || seen["default.rack-r1"]*10 < total*9 {
				return fmt.Errorf("%d calls: instances %v, %d failed", total, seen, failed)
			}
			return nil
		})
	})

	t.Run("MeshHTTPRoute", func(t *testing.T) {
		for _, v := range []string{"v1", "v2"} {
			port := freePort(t)
			dp := strings.Replace(greeterDataplane("split-"+v, "split", port), "kuma.io/service: split", "kuma.io/service: split\n        version: "+v, 1)
			startWorkload(t, z, "split-"+v, dp, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
		}
		apply(t, z, `type: MeshHTTPRoute
mesh: default
name: split-canary
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: split}
      rules:
        - matches:
            - headers: [{type: Exact, name: x-canary, value: "yes"}]
          default:
            backendRefs: [{kind: MeshServiceSubset, name: split, tags: {version: v2}}]
        - matches:
            - path: {type: PathPrefix, value: /}
          default:
            backendRefs:
              - {kind: MeshServiceSubset, name: split, tags: {version: v1}, weight: 90}
              - {kind: MeshServiceSubset, name: split, tags: {version: v2}, weight: 10}
`)
		client := startWorkload(t, z, "split-client", callerDataplane("split-client", "client", freePort(t), "split"),
			"call", "--service", "split", "--every", "2ms")
		canary := startWorkload(t, z, "split-canary", callerDataplane("split-canary", "client", freePort(t), "split"),
			"call", "--service", "split", "--every", "20ms", "--header", "x-canary=yes")
		client.waitCall(0, "ok ", 40*time.Second)
		canary.waitCall(0, "ok ", 40*time.Second)
		// 90/10 by weight, counted by the instances over 1,000 calls.
		mark, canaryMark := client.mark(), canary.mark()
		var seen map[string]int
		eventually(t, 60*time.Second, func() error {
			var failed int
			seen, failed = client.instancesAfter(mark)
			if failed > 0 {
				return fmt.Errorf("%d calls failed", failed)
			}
			if n := seen["default.split-v1"] + seen["default.split-v2"]; n < 1000 {
				return fmt.Errorf("%d calls so far", n)
			}
			return nil
		})
		n := seen["default.split-v1"] + seen["default.split-v2"]
		if share := float64(seen["default.split-v1"]) / float64(n); share < 0.85 || share > 0.95 {
			t.Errorf("v1 answered %d of %d calls, want 90%% ± 5%%", seen["default.split-v1"], n)
		}
		// The header match sends every canary call to v2.
		if got, _ := canary.instancesAfter(canaryMark); got["default.split-v1"] > 0 || got["default.split-v2"] == 0 {
			t.Errorf("canary calls answered by %v, want v2 only", got)
		}
	})

	t.Run("MeshFaultInjection", func(t *testing.T) {
		serve("faulty-1", "faulty")
		client := startWorkload(t, z, "faulty-client", callerDataplane("faulty-client", "client", freePort(t), "faulty"),
			"call", "--service", "faulty", "--every", "10ms")
		bystander := startWorkload(t, z, "faulty-bystander", callerDataplane("faulty-bystander", "bystander", freePort(t), "faulty"),
			"call", "--service", "faulty", "--every", "50ms")
		client.waitCall(0, "ok ", 40*time.Second)
		bystander.waitCall(0, "ok ", 40*time.Second)
		// The destination's inbound policy aborts half of client's calls;
		// the gRPC client injects it (a gRPC server has no fault filter).
		apply(t, z, `type: MeshFaultInjection
mesh: default
name: faulty-chaos
spec:
  targetRef: {kind: MeshService, name: faulty}
  from:
    - targetRef: {kind: MeshService, name: client}
      default:
        http:
          - abort: {httpStatus: 503, percentage: 50}
`)
		client.waitCall(client.mark(), "error Unavailable", 30*time.Second)
		mark, bystanderMark := client.mark(), bystander.mark()
		var ok, failed []string
		eventually(t, 30*time.Second, func() error {
			ok, failed = client.callResults(mark)
			if len(ok)+len(failed) < 300 {
				return fmt.Errorf("%d calls so far", len(ok)+len(failed))
			}
			return nil
		})
		if share := float64(len(failed)) / float64(len(ok)+len(failed)); share < 0.40 || share > 0.60 {
			t.Errorf("%d of %d calls aborted, want about half", len(failed), len(ok)+len(failed))
		}
		if _, failed := bystander.callResults(bystanderMark); len(failed) > 0 {
			t.Errorf("a client the policy does not name got faults: %q", failed[0])
		}
		// A delay for every call instead.
		apply(t, z, `type: MeshFaultInjection
mesh: default
name: faulty-chaos
spec:
  targetRef: {kind: MeshService, name: faulty}
  from:
    - targetRef: {kind: MeshService, name: client}
      default:
        http:
          - delay: {value: 300ms, percentage: 100}
`)
		eventually(t, 30*time.Second, func() error {
			mark := client.mark()
			line := client.lastCall(mark, "ok ", 10*time.Second)
			if d := callDuration(t, line); d < 300*time.Millisecond {
				return fmt.Errorf("a call took %s, want the 300 ms delay", d)
			}
			return nil
		})
	})

	t.Run("MeshCircuitBreaker maxRequests", func(t *testing.T) {
		serve("slow-1", "slow", "--delay", "500ms")
		client := startWorkload(t, z, "slow-client", callerDataplane("slow-client", "client", freePort(t), "slow"),
			"call", "--service", "slow", "--every", "100ms", "--parallel", "3", "--timeout", "5s")
		client.waitCall(0, "ok ", 40*time.Second)
		apply(t, z, `type: MeshCircuitBreaker
mesh: default
name: slow-one-at-a-time
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: slow}
      default:
        connectionLimits: {maxRequests: 1}
`)
		// Calls beyond the one in flight fail fast.
		line := client.lastCall(client.mark(), "error Unavailable", 30*time.Second)
		t.Logf("over the limit: %s", line)
		if d := callDuration(t, line); d > 200*time.Millisecond {
			t.Errorf("a call over the limit failed after %s, want at once (%q)", d, line)
		}
	})

	t.Run("Programmed", func(t *testing.T) {
		// prog-client calls prog: a retry it carries whole, a timeout it
		// carries in part, a health check it cannot carry.
		serve("prog-1", "prog")
		client := startWorkload(t, z, "prog-client", callerDataplane("prog-client", "client", freePort(t), "prog"),
			"call", "--service", "prog", "--every", "100ms")
		client.waitCall(0, "ok ", 40*time.Second)
		apply(t, z, `type: MeshTimeout
mesh: default
name: prog-timeouts
spec:
  targetRef: {kind: MeshService, name: client}
  to:
    - targetRef: {kind: MeshService, name: prog}
      default: {idleTimeout: 1h, http: {requestTimeout: 4s}}
`+"---\n"+`type: MeshRetry
mesh: default
name: prog-retries
spec:
  targetRef: {kind: MeshService, name: client}
  to:
    - targetRef: {kind: MeshService, name: prog}
      default: {grpc: {numRetries: 1}}
`+"---\n"+`type: MeshHealthCheck
mesh: default
name: prog-health
spec:
  targetRef: {kind: MeshService, name: client}
  to:
    - targetRef: {kind: MeshService, name: prog}
      default: {interval: 10s, timeout: 2s, unhealthyThreshold: 3, healthyThreshold: 1}
`)
		for _, tc := range []struct{ path, status, reason, mentions string }{
			{"/meshes/default/meshretries/prog-retries", "True", "Programmed", "given to"},
			{"/meshes/default/meshtimeouts/prog-timeouts", "False", "PartiallyProgrammed", "prog-client: MeshTimeout idleTimeout on the outbound to prog"},
			{"/meshes/default/meshhealthchecks/prog-health", "False", "NotProgrammed", "prog-client: MeshHealthCheck on the outbound to prog"},
		} {
			eventually(t, 20*time.Second, func() error {
				_, body := z.request("GET", tc.path, "")
				var got struct {
					Status struct {
						Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
					} `json:"status"`
				}
				if err := json.Unmarshal(body, &got); err != nil {
					return err
				}
				for _, c := range got.Status.Conditions {
					if c.Type == "Programmed" {
						if c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.mentions) {
							return fmt.Errorf("%s: Programmed %s %s %q, want %s %s naming %q", tc.path, c.Status, c.Reason, c.Message, tc.status, tc.reason, tc.mentions)
						}
						return nil
					}
				}
				return fmt.Errorf("%s: no Programmed condition in %s", tc.path, body)
			})
		}
		// _config of prog-client says what its proxy is not given.
		_, body := z.request("GET", "/meshes/default/dataplanes/prog-client/_config", "")
		for _, want := range []string{"not given to the proxy (grpc): MeshTimeout idleTimeout on the outbound to prog",
			"not given to the proxy (grpc): MeshHealthCheck on the outbound to prog"} {
			if !strings.Contains(string(body), want) {
				t.Errorf("_config warnings lack %q: %s", want, body)
			}
		}
		// The same Dataplane rendered for an Envoy sidecar, as Kuma lays it
		// out, through the API and meridianctl.
		status, body := z.request("GET", "/meshes/default/dataplanes/prog-client/_xds?proxy=envoy", "")
		for _, want := range []string{`"proxy":"envoy"`, `"outbound:127.0.0.1:20001"`, `"identity_cert:secret:default"`, `"envoy.filters.network.rbac"`} {
			if status != 200 || !strings.Contains(string(body), want) {
				t.Errorf("_xds?proxy=envoy: %d, lacks %s", status, want)
			}
		}
		if status, body := z.request("GET", "/meshes/default/dataplanes/prog-client/_xds?proxy=nginx", ""); status != 400 || !strings.Contains(string(body), "proxy") {
			t.Errorf("_xds?proxy=nginx: %d %s, want 400 naming proxy", status, body)
		}
		if out, code := z.ctl("", "inspect", "dataplane", "prog-client", "--xds", "--proxy", "envoy"); code != 0 || !strings.Contains(out, "outbound:127.0.0.1:20001") {
			t.Errorf("meridianctl inspect dataplane --xds --proxy envoy: %d %s", code, out)
		}

		// A shadow policy is not applied: the proxy keeps its 4 s deadline;
		// the shadow view shows the 150 ms it would give, and the diff.
		apply(t, z, `type: MeshTimeout
mesh: default
name: prog-shadow
labels: {kuma.io/effect: shadow}
spec:
  targetRef: {kind: MeshService, name: client}
  to:
    - targetRef: {kind: MeshService, name: prog}
      default: {http: {requestTimeout: 150ms}}
`)
		_, real := z.request("GET", "/meshes/default/dataplanes/prog-client/_xds", "")
		if !strings.Contains(string(real), `"max_stream_duration":"4s"`) || strings.Contains(string(real), "0.150s") {
			t.Errorf("the shadow policy reached the real configuration: %s", real)
		}
		status, body = z.request("GET", "/meshes/default/dataplanes/prog-client/_xds?shadow=true&include=diff", "")
		var sv struct {
			XDS  json.RawMessage `json:"xds"`
			Diff []struct {
				Op, Path string
				Value    any
			} `json:"diff"`
		}
		if err := json.Unmarshal(body, &sv); status != 200 || err != nil {
			t.Fatalf("shadow view: %d %v %s", status, err, body)
		}
		if !strings.Contains(string(sv.XDS), `"max_stream_duration":"0.150s"`) {
			t.Errorf("shadow xds lacks the shadow timeout: %s", sv.XDS)
		}
		found := false
		for _, op := range sv.Diff {
			if op.Op == "replace" && strings.HasSuffix(op.Path, "/max_stream_duration/max_stream_duration") && op.Value == "0.150s" {
				found = true
			}
		}
		if !found {
			t.Errorf("diff has no replace of max_stream_duration by 0.150s: %+v", sv.Diff)
		}
		if status, _ := z.request("GET", "/meshes/default/dataplanes/prog-client/_xds?include=diff", ""); status != 400 {
			t.Errorf("include=diff without shadow: %d, want 400", status)
		}
	})

	t.Run("MeshCircuitBreaker outlier detection", func(t *testing.T) {
		serve("mixed-1", "mixed")
		serve("mixed-2", "mixed", "--fail")
		client := startWorkload(t, z, "mixed-client", callerDataplane("mixed-client", "client", freePort(t), "mixed"),
			"call", "--service", "mixed", "--every", "20ms")
		client.waitCall(0, "error Unavailable", 40*time.Second)
		apply(t, z, `type: MeshCircuitBreaker
mesh: default
name: eject-failing
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: MeshService, name: mixed}
      default:
        outlierDetection:
          interval: 1s
          baseEjectionTime: 30s
          maxEjectionPercent: 50
          detectors:
            failurePercentage: {minimumHosts: 2, requestVolume: 5, threshold: 50}
`)
		// The failing instance is ejected: a second of calls, all answered
		// by the healthy one.
		eventually(t, 30*time.Second, func() error {
			mark := client.mark()
			time.Sleep(time.Second)
			seen, failed := client.instancesAfter(mark)
			if failed > 0 || len(seen) != 1 || seen["default.mixed-1"] < 20 {
				return fmt.Errorf("instances %v, %d failed", seen, failed)
			}
			return nil
		})
	})
}
