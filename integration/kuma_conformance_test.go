package integration

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The conformance suite: for each point where Meridian once computed a
// different configuration than Kuma 2.14.3 for the same resources, a case
// through real processes (a global and a Kubernetes zone) whose expected
// values are what Kuma 2.14 computes, read from its rules code
// (pkg/plugins/policies/core/rules, matchers, outbound/resourcerules) and
// its API schema. docs/coming-from-kuma.md lists them; the one deliberate
// difference (from-entry order) is pinned too.

// parity is a global and one Kubernetes zone; each case has its own mesh.
type parity struct {
	global, zone *node
}

func startParity(t *testing.T) *parity {
	t.Helper()
	kds := freeAddress(t)
	c := &cluster{kdsAddress: kds}
	c.global = startNode(t, "global", bins.Global, t.TempDir(), "--kds-address", kds)
	z := c.startZone(t, "zone-1", "kubernetes", c.token(t, "zone-1"))
	return &parity{global: c.global, zone: z}
}

// mesh creates a mesh on the global and waits for it in the zone.
func (p *parity) mesh(t *testing.T, name string) {
	t.Helper()
	if out, code := p.global.ctl("type: Mesh\nname: "+name+"\n", "apply", "-f", "-"); code != 0 {
		t.Fatalf("create mesh %s: %s", name, out)
	}
	waitPresent(t, p.zone, "/meshes/"+name)
}

// kube renders a Kubernetes-shaped resource of mesh.
func kube(kind, mesh, ns, name, labels, spec string) string {
	l := "    kuma.io/mesh: " + mesh + "\n"
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			l += "    " + k + ": " + v + "\n"
		}
	}
	return "---\napiVersion: kuma.io/v1alpha1\nkind: " + kind + "\nmetadata:\n  name: " + name + "\n  namespace: " + ns +
		"\n  labels:\n" + l + "spec:\n" + indent(spec, "  ") + "\n"
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = by + l
	}
	return strings.Join(lines, "\n")
}

// applied is one policy type's conf on a target, as the zone API shows it.
type applied struct {
	Conf   json.RawMessage `json:"conf"`
	Origin []struct {
		Name  string `json:"name"`
		Entry *int   `json:"entry"`
		Block string `json:"block"`
	} `json:"origin"`
	Routes []struct {
		Route struct {
			Name string `json:"name"`
		} `json:"route"`
		Conf   json.RawMessage `json:"conf"`
		Origin []struct {
			Name  string `json:"name"`
			Entry *int   `json:"entry"`
		} `json:"origin"`
	} `json:"routes"`
}

func (a applied) origins() []string {
	var out []string
	for _, o := range a.Origin {
		out = append(out, originName(o.Name, o.Entry))
	}
	return out
}

func originName(name string, entry *int) string {
	if entry == nil {
		return name
	}
	return fmt.Sprintf("%s[%d]", name, *entry)
}

// getJSON reads a zone API document, retrying until check accepts it (the
// zone's view follows its store within milliseconds).
func zoneJSON(t *testing.T, n *node, path string, v any, check func() error) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		status, body := n.request("GET", path, "")
		if status != 200 {
			return fmt.Errorf("GET %s: %d %s", path, status, body)
		}
		if err := json.Unmarshal(body, v); err != nil {
			return fmt.Errorf("GET %s: %v", path, err)
		}
		if err := check(); err != nil {
			return fmt.Errorf("GET %s: %v\n%s", path, err, body)
		}
		return nil
	})
}

// outbound evaluates a Dataplane's outbound to service.
func (p *parity) outbound(t *testing.T, mesh, ns, dp, service string, check func(map[string]applied) error) {
	t.Helper()
	var ev struct {
		Policies map[string]applied `json:"policies"`
	}
	path := "/meshes/" + mesh + "/dataplanes/" + dp + "/_evaluate?namespace=" + ns + "&outbound=" + service
	zoneJSON(t, p.zone, path, &ev, func() error { return check(ev.Policies) })
}

// inbound evaluates a Dataplane's inbound on port for a client.
func (p *parity) inbound(t *testing.T, mesh, ns, dp string, port int, client string, check func(map[string]applied) error) {
	t.Helper()
	var ev struct {
		Policies map[string]applied `json:"policies"`
	}
	path := fmt.Sprintf("/meshes/%s/dataplanes/%s/_evaluate?namespace=%s&inbound=%d&client=%s", mesh, dp, ns, port, client)
	zoneJSON(t, p.zone, path, &ev, func() error { return check(ev.Policies) })
}

// sameConf compares a conf with the JSON Kuma computes.
func sameConf(got json.RawMessage, want string) error {
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		return fmt.Errorf("conf %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		return fmt.Errorf("want %s: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		return fmt.Errorf("conf %s, Kuma computes %s", got, want)
	}
	return nil
}

func sameList(what string, got, want []string) error {
	if strings.Join(got, " ") != strings.Join(want, " ") {
		return fmt.Errorf("%s %v, Kuma computes %v", what, got, want)
	}
	return nil
}

// expect checks one type's conf and origin on a target.
func expect(typ, conf string, origin ...string) func(map[string]applied) error {
	return func(ps map[string]applied) error {
		a, ok := ps[typ]
		if !ok {
			return fmt.Errorf("no %s", typ)
		}
		if err := sameConf(a.Conf, conf); err != nil {
			return err
		}
		return sameList("origin", a.origins(), origin)
	}
}

func absent(typ string) func(map[string]applied) error {
	return func(ps map[string]applied) error {
		if a, ok := ps[typ]; ok {
			return fmt.Errorf("%s applies: %s", typ, a.Conf)
		}
		return nil
	}
}

const webDataplane = `networking:
  address: 10.0.0.1
  inbound:
    - port: 8080
      name: http
      tags: {kuma.io/service: web_kuma-demo_svc_8080}
    - port: 9901
      name: admin
      tags: {kuma.io/service: web-admin_kuma-demo_svc_9901}
  outbound:
    - port: 10001
      tags: {kuma.io/service: backend}
    - port: 10002
      tags: {kuma.io/service: other}`

func TestKumaConformance(t *testing.T) {
	p := startParity(t)

	t.Run("1 origin lists every matched entry", func(t *testing.T) {
		m := "parity-1"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshTimeout", m, "kuma-system", "mesh-defaults", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: Mesh}
    default: {idleTimeout: 1h, connectionTimeout: 5s}`)+
			kube("MeshTimeout", m, "kuma-system", "backend-timeouts", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend}
    default: {idleTimeout: 30m}`)+
			kube("MeshTimeout", m, "kuma-system", "web-timeouts", "", `targetRef: {kind: MeshService, name: web_kuma-demo_svc_8080}
to:
  - targetRef: {kind: MeshService, name: backend}
    default: {idleTimeout: 10m}`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", webDataplane))
		// Kuma: Origins(relevant) lists all three; web-timeouts wins idleTimeout.
		p.outbound(t, m, "kuma-demo", "web-1", "backend", expect("MeshTimeout", `{"idleTimeout":"10m","connectionTimeout":"5s"}`,
			"mesh-defaults[0]", "backend-timeouts[0]", "web-timeouts[0]"))
	})

	t.Run("2 a route-targeted policy shapes that route only", func(t *testing.T) {
		m := "parity-2"
		p.mesh(t, m)
		apply(t, p.zone, routeAPI(m)+
			kube("MeshTimeout", m, "kuma-system", "on-route", "", `targetRef: {kind: MeshHTTPRoute, name: api}
to:
  - targetRef: {kind: Mesh}
    default: {http: {requestTimeout: 3s}}`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", webDataplane))
		p.outbound(t, m, "kuma-demo", "web-1", "backend", func(ps map[string]applied) error {
			a, ok := ps["MeshTimeout"]
			if !ok || len(a.Routes) != 1 || a.Routes[0].Route.Name != "api" {
				return fmt.Errorf("want one route conf for api, got %+v", a)
			}
			if string(a.Conf) != "null" {
				return fmt.Errorf("the outbound itself gets %s", a.Conf)
			}
			return sameConf(a.Routes[0].Conf, `{"http":{"requestTimeout":"3s"}}`)
		})
		p.outbound(t, m, "kuma-demo", "web-1", "other", absent("MeshTimeout"))
	})

	t.Run("3 a route's conf has no service-level entries", func(t *testing.T) {
		m := "parity-3"
		p.mesh(t, m)
		apply(t, p.zone, routeAPI(m)+
			kube("MeshTimeout", m, "kuma-system", "mesh-wide", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: Mesh}
    default: {connectionTimeout: 2s}`)+
			kube("MeshTimeout", m, "kuma-system", "backend-idle", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend}
    default: {idleTimeout: 30s}`)+
			kube("MeshTimeout", m, "kuma-system", "route-timeout", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshHTTPRoute, name: api}
    default: {http: {requestTimeout: 1s}}`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", webDataplane))
		p.outbound(t, m, "kuma-demo", "web-1", "backend", func(ps map[string]applied) error {
			a := ps["MeshTimeout"]
			if err := sameConf(a.Conf, `{"connectionTimeout":"2s","idleTimeout":"30s"}`); err != nil {
				return err
			}
			if len(a.Routes) != 1 {
				return fmt.Errorf("%d route confs, want 1", len(a.Routes))
			}
			var origin []string
			for _, o := range a.Routes[0].Origin {
				origin = append(origin, originName(o.Name, o.Entry))
			}
			if err := sameConf(a.Routes[0].Conf, `{"connectionTimeout":"2s","http":{"requestTimeout":"1s"}}`); err != nil {
				return err
			}
			return sameList("route origin", origin, []string{"mesh-wide[0]", "route-timeout[0]"})
		})
	})

	t.Run("4 sectionName names a port", func(t *testing.T) {
		m := "parity-4"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshService", m, "kuma-demo", "backend", "", `ports:
  - {port: 8080, name: http, targetPort: 8080}
  - {port: 9090, name: grpc, targetPort: 9090}`)+
			kube("MeshTimeout", m, "kuma-system", "ports", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend, namespace: kuma-demo, sectionName: http}
    default: {idleTimeout: 1s}
  - targetRef: {kind: MeshService, name: backend, namespace: kuma-demo}
    default: {idleTimeout: 5s}
  - targetRef: {kind: MeshService, name: backend, namespace: kuma-demo, sectionName: nope}
    default: {connectionTimeout: 9s}`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", `networking:
  address: 10.0.0.1
  inbound:
    - port: 8080
      tags: {kuma.io/service: web_kuma-demo_svc_8080}
  outbound:
    - port: 8080
      backendRef: {kind: MeshService, name: backend, port: 8080}
    - port: 9090
      backendRef: {kind: MeshService, name: backend, port: 9090}`))
		var cfg struct {
			Outbounds []struct {
				Port     int                `json:"port"`
				Policies map[string]applied `json:"policies"`
			} `json:"outbounds"`
		}
		want := map[int][2]string{8080: {`{"idleTimeout":"1s"}`, "ports[1] ports[0]"}, 9090: {`{"idleTimeout":"5s"}`, "ports[1]"}}
		zoneJSON(t, p.zone, "/meshes/"+m+"/dataplanes/web-1/_config?namespace=kuma-demo", &cfg, func() error {
			if len(cfg.Outbounds) != 2 {
				return fmt.Errorf("%d outbounds", len(cfg.Outbounds))
			}
			for _, o := range cfg.Outbounds {
				a, ok := o.Policies["MeshTimeout"]
				if !ok {
					return fmt.Errorf("outbound %d: no MeshTimeout", o.Port)
				}
				if err := sameConf(a.Conf, want[o.Port][0]); err != nil {
					return fmt.Errorf("outbound %d: %v", o.Port, err)
				}
				if err := sameList("origin", a.origins(), strings.Fields(want[o.Port][1])); err != nil {
					return fmt.Errorf("outbound %d: %v", o.Port, err)
				}
			}
			return nil
		})
	})

	t.Run("5 MeshTCPRoute rules replace", func(t *testing.T) {
		m := "parity-5"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshTCPRoute", m, "kuma-system", "split-all", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend}
    rules:
      - default:
          backendRefs:
            - {kind: MeshService, name: backend-v1, weight: 90}
            - {kind: MeshService, name: backend-v2, weight: 10}`)+
			kube("MeshTCPRoute", m, "kuma-system", "web-canary", "", `targetRef: {kind: MeshService, name: web_kuma-demo_svc_8080}
to:
  - targetRef: {kind: MeshService, name: backend}
    rules:
      - default:
          backendRefs: [{kind: MeshService, name: backend-canary}]`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", webDataplane))
		p.outbound(t, m, "kuma-demo", "web-1", "backend", expect("MeshTCPRoute",
			`{"rules":[{"default":{"backendRefs":[{"kind":"MeshService","name":"backend-canary","weight":1}]}}]}`,
			"split-all[0]", "web-canary[0]"))
	})

	t.Run("6 sectionName of a Dataplane with from", func(t *testing.T) {
		m := "parity-6"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshTimeout", m, "kuma-demo", "by-section", "", `targetRef: {kind: Dataplane, name: web-1, sectionName: http}
from:
  - targetRef: {kind: Mesh}
    default: {idleTimeout: 9s}`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", webDataplane))
		p.inbound(t, m, "kuma-demo", "web-1", 8080, "", expect("MeshTimeout", `{"idleTimeout":"9s"}`, "by-section[0]"))
		p.inbound(t, m, "kuma-demo", "web-1", 9901, "", absent("MeshTimeout"))
	})

	t.Run("7 a Dataplane name is taken in the policy's zone", func(t *testing.T) {
		m := "parity-7"
		p.mesh(t, m)
		apply(t, p.global, "type: MeshTimeout\nmesh: "+m+`
name: global-by-name
spec:
  targetRef: {kind: Dataplane, name: web-1, namespace: kuma-demo}
  to:
    - targetRef: {kind: Mesh}
      default: {idleTimeout: 11s}
`)
		waitPresent(t, p.zone, "/meshes/"+m+"/meshtimeouts")
		apply(t, p.zone, kube("MeshTimeout", m, "kuma-demo", "zone-by-name", "", `targetRef: {kind: Dataplane, name: web-1}
to:
  - targetRef: {kind: Mesh}
    default: {connectionTimeout: 1s}`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", webDataplane))
		var list struct {
			Total int `json:"total"`
		}
		zoneJSON(t, p.zone, "/meshes/"+m+"/meshtimeouts", &list, func() error {
			if list.Total != 2 {
				return fmt.Errorf("%d MeshTimeouts in the zone, want the global's and the zone's", list.Total)
			}
			return nil
		})
		// Kuma: kri.From(web-1) has zone zone-1; the global policy's
		// reference has no zone, so it names no Dataplane of zone-1.
		p.outbound(t, m, "kuma-demo", "web-1", "backend", expect("MeshTimeout", `{"connectionTimeout":"1s"}`, "zone-by-name[0]"))
	})

	t.Run("8 labels select a delegated gateway", func(t *testing.T) {
		m := "parity-8"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshTimeout", m, "kuma-system", "edge-labels", "", `targetRef: {kind: Dataplane, labels: {app: edge}}
to:
  - targetRef: {kind: Mesh}
    default: {connectionTimeout: 3s}`)+
			kube("Dataplane", m, "kuma-demo", "edge-1", "app=edge", `networking:
  address: 10.0.0.2
  gateway:
    tags: {kuma.io/service: edge_kuma-demo_svc_80}
  outbound:
    - port: 10001
      tags: {kuma.io/service: backend}`)+
			kube("Dataplane", m, "kuma-demo", "builtin-1", "app=edge", `networking:
  address: 10.0.0.3
  gateway:
    type: BUILTIN
    tags: {kuma.io/service: builtin_kuma-demo_svc_80}`))
		p.outbound(t, m, "kuma-demo", "edge-1", "backend", expect("MeshTimeout", `{"connectionTimeout":"3s"}`, "edge-labels[0]"))
		var matched struct {
			Items []struct {
				Name string `json:"name"`
			} `json:"items"`
		}
		zoneJSON(t, p.zone, "/meshes/"+m+"/meshtimeouts/edge-labels/_resources/dataplanes?namespace=kuma-system", &matched, func() error {
			if len(matched.Items) != 1 || matched.Items[0].Name != "edge-1" {
				return fmt.Errorf("matched %+v, want edge-1 only", matched.Items)
			}
			return nil
		})
	})

	t.Run("9 old-style service names resolve", func(t *testing.T) {
		m := "parity-9"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshService", m, "kuma-demo", "backend", "", `ports:
  - {port: 8080, name: http, targetPort: 8080}
  - {port: 9090, targetPort: 9090}`)+
			kube("MeshRetry", m, "kuma-system", "kube-style", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend_kuma-demo_svc_8080}
    default: {tcp: {maxConnectAttempt: 4}}`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", `networking:
  address: 10.0.0.1
  inbound:
    - port: 8080
      tags: {kuma.io/service: web_kuma-demo_svc_8080}
  outbound:
    - port: 8080
      backendRef: {kind: MeshService, name: backend, port: 8080}
    - port: 9090
      backendRef: {kind: MeshService, name: backend, port: 9090}`))
		var cfg struct {
			Outbounds []struct {
				Port     int                `json:"port"`
				Policies map[string]applied `json:"policies"`
			} `json:"outbounds"`
		}
		zoneJSON(t, p.zone, "/meshes/"+m+"/dataplanes/web-1/_config?namespace=kuma-demo", &cfg, func() error {
			for _, o := range cfg.Outbounds {
				a, ok := o.Policies["MeshRetry"]
				switch {
				case o.Port == 8080 && !ok:
					return fmt.Errorf("backend_kuma-demo_svc_8080 does not reach backend:8080")
				case o.Port == 8080:
					if err := sameConf(a.Conf, `{"tcp":{"maxConnectAttempt":4}}`); err != nil {
						return err
					}
				case ok:
					return fmt.Errorf("backend_kuma-demo_svc_8080 reaches port %d: %s", o.Port, a.Conf)
				}
			}
			return nil
		})
	})

	t.Run("10 schema defaults are in the conf", func(t *testing.T) {
		m := "parity-10"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshTrace", m, "kuma-system", "trace", "", `targetRef: {kind: Mesh}
default:
  backends: [{type: Zipkin, zipkin: {url: "http://zipkin:9411/api/v2/spans"}}]`)+
			kube("MeshHTTPRoute", m, "kuma-system", "route", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend}
    rules:
      - matches: [{path: {type: PathPrefix, value: /v2}}]
        default:
          backendRefs: [{kind: MeshService, name: backend-v2}]`)+
			kube("Dataplane", m, "kuma-demo", "web-1", "", webDataplane))
		var cfg struct {
			Proxy map[string]applied `json:"proxy"`
		}
		zoneJSON(t, p.zone, "/meshes/"+m+"/dataplanes/web-1/_config?namespace=kuma-demo", &cfg, func() error {
			return sameConf(cfg.Proxy["MeshTrace"].Conf, `{"backends":[{"type":"Zipkin","zipkin":{"url":"http://zipkin:9411/api/v2/spans",`+
				`"apiVersion":"httpJson","sharedSpanContext":true,"traceId128bit":false}}]}`)
		})
		p.outbound(t, m, "kuma-demo", "web-1", "backend", func(ps map[string]applied) error {
			return sameConf(ps["MeshHTTPRoute"].Conf, `{"rules":[{"matches":[{"path":{"type":"PathPrefix","value":"/v2"}}],`+
				`"default":{"backendRefs":[{"kind":"MeshService","name":"backend-v2","weight":1}]}}]}`)
		})
	})

	t.Run("11 a MeshHTTPRoute rule needs matches", func(t *testing.T) {
		m := "parity-11"
		p.mesh(t, m)
		out, code := p.zone.ctl(kube("MeshHTTPRoute", m, "kuma-system", "no-matches", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend}
    rules:
      - default:
          backendRefs: [{kind: MeshService, name: backend-v2}]`), "apply", "-f", "-")
		if code == 0 || !strings.Contains(out, "spec.to[0].rules[0].matches") {
			t.Errorf("a rule without matches: exit %d\n%s", code, out)
		}
	})

	t.Run("deliberate: from entries sort by their own kind", func(t *testing.T) {
		// docs/coming-from-kuma.md#from-entry-order: Kuma allows web here
		// (kumahq/kuma#8484); Meridian applies the more specific entry last.
		m := "parity-order"
		p.mesh(t, m)
		apply(t, p.zone, kube("MeshTrafficPermission", m, "kuma-system", "a", "", `targetRef: {kind: Mesh}
from:
  - targetRef: {kind: Mesh}
    default: {action: Allow}`)+
			kube("MeshTrafficPermission", m, "kuma-system", "b", "", `targetRef: {kind: Mesh}
from:
  - targetRef: {kind: MeshService, name: web}
    default: {action: Deny}`)+
			kube("Dataplane", m, "kuma-demo", "backend-1", "", `networking:
  address: 10.0.0.4
  inbound:
    - port: 8080
      tags: {kuma.io/service: backend_kuma-demo_svc_8080}`))
		p.inbound(t, m, "kuma-demo", "backend-1", 8080, "kuma.io/service:web", expect("MeshTrafficPermission", `{"action":"DENY"}`, "a[0]", "b[0]"))
	})
}

// routeAPI is a MeshHTTPRoute api sending backend's /api traffic to backend.
func routeAPI(mesh string) string {
	return kube("MeshHTTPRoute", mesh, "kuma-system", "api", "", `targetRef: {kind: Mesh}
to:
  - targetRef: {kind: MeshService, name: backend}
    rules:
      - matches: [{path: {type: PathPrefix, value: /api}}]
        default:
          backendRefs: [{kind: MeshService, name: backend}]`)
}
