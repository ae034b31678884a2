package resource

import (
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// specCase validates one spec of one type and lists the exact causes.
type specCase struct {
	name      string
	typ       string
	namespace string
	spec      string
	want      []string // "field: message"; nil means valid
}

func validateSpecCase(t *testing.T, reg *Registry, tc specCase) []string {
	t.Helper()
	r := &Resource{Type: tc.typ, Mesh: "default", Name: "p", Namespace: tc.namespace, Spec: []byte(tc.spec)}
	if d, _ := reg.Lookup(tc.typ); d.Scope == ScopeGlobal {
		r.Mesh = ""
	}
	err := reg.Validate(r, kubernetesZone())
	if err == nil {
		return nil
	}
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("want *ValidationError, got %T %v", err, err)
	}
	return renderCauses(verr.Causes)
}

// TestUnknownKeysInKeyOrder: the key checks of a spec and of an entry, and
// a schema's object walk, skip sorting when every key is allowed; when some
// are not, the causes still come in key order, every run, nested objects'
// causes together under their key.
func TestUnknownKeysInKeyOrder(t *testing.T) {
	reg := NewDefaultRegistry()
	tc := specCase{typ: "MeshTimeout",
		spec: `{"zz":1,"to":[{"zeta":1,"targetRef":{"kind":"Mesh"},"alpha":2,"mid":3}],"default":{},"aa":1}`}
	want := []string{"spec.aa: unknown field", "spec.default: MeshTimeout does not support default", "spec.zz: unknown field",
		"spec.to[0].alpha: unknown field", "spec.to[0].mid: unknown field", "spec.to[0].zeta: unknown field"}
	conf := specCase{typ: "MeshTimeout",
		spec: `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"zz":1,"idleTimeout":5,"aa":1,"http":{"zq":1,"requestTimeout":"x"}}}]}`}
	confWant := []string{"spec.to[0].default.aa: unknown field", `spec.to[0].default.http.requestTimeout: invalid duration "x"`,
		"spec.to[0].default.http.zq: unknown field", `spec.to[0].default.idleTimeout: must be a duration string like "5s", got number`,
		"spec.to[0].default.zz: unknown field"}
	for range 20 { // map iteration order varies between runs
		if got := validateSpecCase(t, reg, tc); !reflect.DeepEqual(got, want) {
			t.Fatalf("got  %q\nwant %q", got, want)
		}
		if got := validateSpecCase(t, reg, conf); !reflect.DeepEqual(got, confWant) {
			t.Fatalf("conf: got  %q\nwant %q", got, confWant)
		}
	}
}

func runSpecCases(t *testing.T, cases []specCase) {
	reg := NewDefaultRegistry()
	for _, tc := range cases {
		t.Run(tc.typ+"/"+tc.name, func(t *testing.T) {
			// Causes come in a deterministic order; the tables list them in
			// reading order, so compare as sets.
			got := sorted(validateSpecCase(t, reg, tc))
			if !reflect.DeepEqual(got, sorted(tc.want)) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func sorted(s []string) []string {
	if s == nil {
		return nil
	}
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func TestTargetRefPolicyStructure(t *testing.T) {
	runSpecCases(t, []specCase{
		{name: "minimal", typ: "MeshTimeout", spec: `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}`},
		{name: "empty spec", typ: "MeshTimeout", spec: `{}`,
			want: []string{"spec: at least one of to, from, rules must be defined"}},
		{name: "null spec", typ: "MeshRetry", spec: `null`,
			want: []string{"spec.to: must be set"}},
		{name: "spec not an object", typ: "MeshRetry", spec: `[]`,
			want: []string{"spec: must be an object, got list"}},
		{name: "invalid JSON", typ: "MeshRetry", spec: `{"to":`,
			want: []string{"spec: invalid JSON: unexpected EOF"}},
		{name: "unsupported array", typ: "MeshRetry", spec: `{"from":[{"default":{}}],"to":[{"targetRef":{"kind":"Mesh"}}]}`,
			want: []string{"spec.from: MeshRetry does not support from"}},
		{name: "unknown key", typ: "MeshTimeout", spec: `{"targetref":{},"to":[{"targetRef":{"kind":"Mesh"}}]}`,
			want: []string{"spec.targetref: unknown field"}},
		{name: "proxy-wide keys only on proxy-wide types", typ: "MeshTimeout", spec: `{"default":{},"to":[{"targetRef":{"kind":"Mesh"}}]}`,
			want: []string{"spec.default: MeshTimeout does not support default"}},
		{name: "to is a list", typ: "MeshTimeout", spec: `{"to":{"targetRef":{"kind":"Mesh"}}}`,
			want: []string{"spec.to: must be a list, got object"}},
		{name: "entry is an object", typ: "MeshTimeout", spec: `{"to":["Mesh"]}`,
			want: []string{"spec.to[0]: must be an object, got string"}},
		{name: "to needs targetRef", typ: "MeshTimeout", spec: `{"to":[{"default":{}}]}`,
			want: []string{"spec.to[0].targetRef: must be set"}},
		{name: "from targetRef defaults to Mesh", typ: "MeshTimeout", spec: `{"from":[{"default":{"idleTimeout":"1s"}}]}`},
		{name: "unknown entry key", typ: "MeshTimeout", spec: `{"to":[{"targetRef":{"kind":"Mesh"},"defaults":{}}]}`,
			want: []string{"spec.to[0].defaults: unknown field"}},
		{name: "top-level kind", typ: "MeshRetry", spec: `{"targetRef":{"kind":"MeshExternalService","name":"x"},"to":[{"targetRef":{"kind":"Mesh"}}]}`,
			want: []string{`spec.targetRef.kind: invalid value "MeshExternalService": must be one of Mesh, Dataplane, MeshSubset, MeshService, MeshServiceSubset, MeshGateway, MeshHTTPRoute`}},
		{name: "to kind", typ: "MeshHealthCheck", spec: `{"to":[{"targetRef":{"kind":"MeshHTTPRoute","name":"r"}}]}`,
			want: []string{`spec.to[0].targetRef.kind: invalid value "MeshHTTPRoute": must be one of Mesh, MeshService, MeshExternalService, MeshMultiZoneService`}},
		{name: "from kind", typ: "MeshTrafficPermission", spec: `{"from":[{"targetRef":{"kind":"MeshGateway","name":"g"},"default":{"action":"Allow"}}]}`,
			want: []string{`spec.from[0].targetRef.kind: invalid value "MeshGateway": must be one of Mesh, MeshSubset, MeshService, MeshServiceSubset`}},
		{name: "missing kind", typ: "MeshTrafficPermission", spec: `{"targetRef":{},"from":[{"default":{"action":"Allow"}}]}`,
			want: []string{"spec.targetRef.kind: must be set"}},
	})
}

func TestTargetRefKinds(t *testing.T) {
	mtp := func(ref string) string {
		return `{"targetRef":` + ref + `,"from":[{"default":{"action":"ALLOW"}}]}`
	}
	to := func(ref string) string { return `{"to":[{"targetRef":` + ref + `}]}` }
	runSpecCases(t, []specCase{
		{name: "Mesh", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"Mesh","proxyTypes":["Sidecar"]}`)},
		{name: "Mesh with name and tags", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"Mesh","name":"x","tags":{"a":"b"}}`),
			want: []string{"spec.targetRef.name: must not be set with kind Mesh", "spec.targetRef.tags: must not be set with kind Mesh"}},
		{name: "MeshSubset", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshSubset","tags":{"kuma.io/zone":"east"}}`)},
		{name: "MeshSubset without tags", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshSubset","name":"x"}`),
			want: []string{"spec.targetRef.name: must not be set with kind MeshSubset"}},
		{name: "MeshSubset with only proxyTypes", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshSubset","proxyTypes":["Sidecar"]}`)},
		{name: "MeshService", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshService","name":"web","namespace":"web-ns","sectionName":"http"}`)},
		{name: "MeshService without name", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshService"}`),
			want: []string{"spec.targetRef.name: must be set with kind MeshService (or use labels)"}},
		{name: "MeshService with tags", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshService","name":"a","tags":{"v":"1"}}`),
			want: []string{"spec.targetRef.tags: must not be set with kind MeshService"}},
		{name: "MeshService bad namespace", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshService","name":"a","namespace":"Bad_NS"}`),
			want: []string{`spec.targetRef.namespace: invalid namespace "Bad_NS": must be a lowercase RFC 1123 label`}},
		{name: "MeshServiceSubset", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshServiceSubset","name":"a","tags":{"v":"1"}}`)},
		{name: "MeshServiceSubset without name and tags", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshServiceSubset"}`),
			want: []string{"spec.targetRef.name: must be set with kind MeshServiceSubset", "spec.targetRef.tags: must be set with kind MeshServiceSubset"}},
		{name: "MeshGateway", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshGateway","name":"edge","tags":{"port":"80"}}`)},
		{name: "MeshGateway without name", typ: "MeshTrafficPermission", spec: mtp(`{"kind":"MeshGateway"}`),
			want: []string{"spec.targetRef.name: must be set with kind MeshGateway"}},
		{name: "MeshHTTPRoute", typ: "MeshTimeout", spec: `{"targetRef":{"kind":"MeshHTTPRoute","name":"r"},"to":[{"targetRef":{"kind":"Mesh"}}]}`},
		{name: "MeshHTTPRoute by labels", typ: "MeshTimeout", spec: to(`{"kind":"MeshHTTPRoute","labels":{"kuma.io/display-name":"r"}}`)},
		{name: "name and labels", typ: "MeshTimeout", spec: to(`{"kind":"MeshService","name":"a","labels":{"x":"y"}}`),
			want: []string{"spec.to[0].targetRef.labels: must not be set together with name"}},
		{name: "labels and namespace", typ: "MeshTimeout", spec: to(`{"kind":"MeshService","namespace":"a","labels":{"x":"y"}}`),
			want: []string{"spec.to[0].targetRef.namespace: must not be set together with labels"}},
		{name: "MeshExternalService", typ: "MeshTimeout", spec: to(`{"kind":"MeshExternalService","name":"httpbin"}`)},
		{name: "unknown targetRef field", typ: "MeshTimeout", spec: to(`{"kind":"Mesh","zone":"east"}`),
			want: []string{"spec.to[0].targetRef.zone: unknown field"}},
		{name: "bad proxy type", typ: "MeshTimeout", spec: to(`{"kind":"Mesh","proxyTypes":["Ingress"]}`),
			want: []string{`spec.to[0].targetRef.proxyTypes[0]: invalid value "Ingress": must be one of Sidecar, Gateway`}},
	})
}

func TestDefaultsAndOverrides(t *testing.T) {
	entry := func(extra string) string {
		return `{"to":[{"targetRef":{"kind":"Mesh"},` + extra + `}]}`
	}
	runSpecCases(t, []specCase{
		{name: "all qualifiers", typ: "MeshTimeout", spec: entry(`"default":{"idleTimeout":"1s"},"override":{"connectionTimeout":"2s"},
			"strategy":{"default":"atomic","override":"merge"},"when":{"override":"self.idleTimeout > duration('1s')"},
			"unset":["http.requestTimeout","idleTimeout"]`)},
		{name: "override conf checked", typ: "MeshTimeout", spec: entry(`"override":{"connectionTimeout":"fast"}`),
			want: []string{`spec.to[0].override.connectionTimeout: invalid duration "fast"`}},
		{name: "strategy enum", typ: "MeshTimeout", spec: entry(`"default":{},"strategy":{"default":"replace","overide":"merge"}`),
			want: []string{`spec.to[0].strategy.default: invalid value "replace": must be one of merge, atomic`,
				"spec.to[0].strategy.overide: unknown field"}},
		{name: "when must be non-empty", typ: "MeshTimeout", spec: entry(`"default":{},"when":{"default":""}`),
			want: []string{"spec.to[0].when.default: must not be empty"}},
		{name: "when must compile", typ: "MeshTimeout", spec: entry(`"override":{},"when":{"override":"self.http.requestTimeout >"}`),
			want: []string{"spec.to[0].when.override: invalid when expression: ERROR: <input>:1:27: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n | self.http.requestTimeout >\n | ..........................^"}},
		{name: "when must be boolean", typ: "MeshTimeout", spec: entry(`"override":{},"when":{"override":"'30s'"}`),
			want: []string{"spec.to[0].when.override: invalid when expression: must evaluate to a boolean, it evaluates to string"}},
		{name: "when names only self", typ: "MeshTimeout", spec: entry(`"default":{},"when":{"default":"conf.idleTimeout == '1s'"}`),
			want: []string{"spec.to[0].when.default: invalid when expression: ERROR: <input>:1:1: undeclared reference to 'conf'\n | conf.idleTimeout == '1s'\n | ^"}},
		{name: "when needs its block", typ: "MeshTimeout", spec: entry(`"default":{},"when":{"override":"true"}`),
			want: []string{"spec.to[0].when.override: is set but there is no override block to apply it to"}},
		{name: "strategy needs its block", typ: "MeshTimeout", spec: entry(`"override":{},"strategy":{"default":"atomic","override":"atomic"}`),
			want: []string{"spec.to[0].strategy.default: is set but there is no default block to apply it to"}},
		{name: "unset paths exist", typ: "MeshTimeout", spec: entry(`"unset":["http.requestTimeout","http.timeout","","nope"]`),
			want: []string{`spec.to[0].unset[1]: unknown field path "http.timeout"`,
				"spec.to[0].unset[2]: must not be empty", `spec.to[0].unset[3]: unknown field path "nope"`}},
		{name: "unset is a list", typ: "MeshTimeout", spec: entry(`"unset":"idleTimeout"`),
			want: []string{"spec.to[0].unset: must be a list, got string"}},
		{name: "proxy-wide", typ: "MeshTrace", spec: `{"default":{"sampling":{"overall":10}},"override":{"tags":[]},"strategy":{"override":"atomic"},"unset":["sampling.random"]}`},
		{name: "proxy-wide needs a conf", typ: "MeshMetric", spec: `{"targetRef":{"kind":"Mesh"}}`,
			want: []string{"spec: at least one of default, override must be defined"}},
		{name: "proxy-wide does not take to", typ: "MeshProxyPatch", spec: `{"default":{},"to":[]}`,
			want: []string{"spec.to: MeshProxyPatch does not support to"}},
	})
}

func TestNamespacedPolicies(t *testing.T) {
	svc := func(name, ns string) string {
		s := `{"targetRef":{"kind":"MeshService","name":"` + name + `"`
		if ns != "" {
			s += `,"namespace":"` + ns + `"`
		}
		return s + `},"default":{"idleTimeout":"1s"}}`
	}
	runSpecCases(t, []specCase{
		{name: "producer", typ: "MeshTimeout", namespace: "backend-ns", spec: `{"to":[` + svc("backend", "") + `,` + svc("api", "backend-ns") + `]}`},
		{name: "consumer", typ: "MeshTimeout", namespace: "web-ns", spec: `{"to":[` + svc("backend", "backend-ns") + `]}`},
		{name: "mixed", typ: "MeshTimeout", namespace: "web-ns", spec: `{"to":[` + svc("web", "") + `,` + svc("backend", "backend-ns") + `]}`,
			want: []string{`spec.to: must not mix targets in the policy's namespace "web-ns" with targets in other namespaces`}},
		{name: "system namespace may mix", typ: "MeshTimeout", namespace: "kuma-system", spec: `{"to":[` + svc("web", "") + `,` + svc("backend", "backend-ns") + `]}`},
		{name: "from and to", typ: "MeshAccessLog", namespace: "web-ns", spec: `{"to":[{"targetRef":{"kind":"Mesh"}}],"from":[{}]}`,
			want: []string{`spec: a policy in namespace "web-ns" must not define both from and to`}},
		{name: "producer override allowed", typ: "MeshTimeout", namespace: "backend-ns",
			spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"override":{"idleTimeout":"1s"}}]}`},
		{name: "consumer override", typ: "MeshTimeout", namespace: "web-ns",
			spec: `{"to":[{"targetRef":{"kind":"Mesh"},"override":{"idleTimeout":"1s"}}]}`,
			want: []string{"spec.to[0].override: a consumer policy must not define override: only system and producer policies may"}},
		{name: "workload-owner override", typ: "MeshTrace", namespace: "web-ns", spec: `{"override":{}}`,
			want: []string{"spec.override: a workload-owner policy must not define override: only system and producer policies may"}},
		{name: "workload-owner from override", typ: "MeshRateLimit", namespace: "web-ns",
			spec: `{"from":[{"override":{"local":{"tcp":{"disabled":true}}}}]}`,
			want: []string{"spec.from[0].override: a workload-owner policy must not define override: only system and producer policies may"}},
		{name: "consumer on a gateway", typ: "MeshCircuitBreaker", namespace: "web-ns",
			spec: `{"targetRef":{"kind":"MeshGateway","name":"edge"},"to":[{"targetRef":{"kind":"MeshService","name":"b","namespace":"b-ns"}}]}`,
			want: []string{"spec.targetRef.kind: a consumer policy must not target a MeshGateway: MeshGateway is cluster-scoped"}},
		{name: "producer on a gateway", typ: "MeshCircuitBreaker", namespace: "web-ns",
			spec: `{"targetRef":{"kind":"MeshGateway","name":"edge"},"to":[{"targetRef":{"kind":"MeshService","name":"web"}}]}`},
	})
}

func TestRoutes(t *testing.T) {
	rule := `{"matches":[{"path":{"type":"PathPrefix","value":"/"}}],"default":{"backendRefs":[{"kind":"MeshService","name":"b","port":80,"weight":1}]}}`
	runSpecCases(t, []specCase{
		{name: "valid", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[` + rule + `]}]}`},
		{name: "rules required", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"}}]}`,
			want: []string{"spec.to[0].rules: must be set"}},
		{name: "http rules not empty", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[]}]}`,
			want: []string{"spec.to[0].rules: must have at least one item"}},
		{name: "tcp rules may be left out", typ: "MeshTCPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"}}]}`},
		{name: "tcp rules hold one rule", typ: "MeshTCPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[
			{"default":{"backendRefs":[{"kind":"MeshService","name":"b"}]}},{"default":{"backendRefs":[{"kind":"MeshService","name":"c"}]}}]}]}`,
			want: []string{"spec.to[0].rules: must have at most one item"}},
		{name: "tcp rule sends somewhere", typ: "MeshTCPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[{"default":{}}]}]}`,
			want: []string{"spec.to[0].rules[0].default.backendRefs: must be set"}},
		{name: "no default on a route entry", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"default":{},"rules":[` + rule + `]}]}`,
			want: []string{"spec.to[0].default: unknown field"}},
		{name: "Mesh only under a gateway", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"Mesh"},"rules":[` + rule + `]}]}`,
			want: []string{"spec.to[0].targetRef.kind: Mesh is only allowed when the top-level targetRef is a MeshGateway"}},
		{name: "gateway route", typ: "MeshHTTPRoute", spec: `{"targetRef":{"kind":"MeshGateway","name":"edge"},"to":[{"targetRef":{"kind":"Mesh"},"hostnames":["*.example.com"],"rules":[` + rule + `]}]}`},
		{name: "bad hostname", typ: "MeshHTTPRoute", spec: `{"targetRef":{"kind":"MeshGateway","name":"edge"},"to":[{"targetRef":{"kind":"Mesh"},"hostnames":["Not_A_Host"],"rules":[` + rule + `]}]}`,
			want: []string{`spec.to[0].hostnames[0]: invalid hostname "Not_A_Host": must be a lowercase RFC 1123 hostname`}},
		{name: "rule problems", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[
			{"matches":[{"path":{"type":"Exact","value":"v1"},"method":"FETCH"}],
			 "default":{"filters":[{"type":"RequestRedirect"},{"type":"URLRewrite","requestMirror":{}}],
			            "backendRefs":[{"kind":"MeshServiceSubset","name":"b"},{"kind":"MeshService"}]}}]}]}`,
			want: []string{
				`spec.to[0].rules[0].default.backendRefs[0].tags: must be set with kind MeshServiceSubset`,
				`spec.to[0].rules[0].default.backendRefs[1]: exactly one of name, labels must be set`,
				`spec.to[0].rules[0].default.filters[0].requestRedirect: must be set when type is RequestRedirect`,
				`spec.to[0].rules[0].default.filters[1].requestMirror.backendRef: must be set`,
				`spec.to[0].rules[0].default.filters[1].requestMirror: must not be set when type is URLRewrite`,
				`spec.to[0].rules[0].default.filters[1].urlRewrite: must be set when type is URLRewrite`,
				`spec.to[0].rules[0].matches[0].method: invalid value "FETCH": must be one of CONNECT, DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT, TRACE`,
				`spec.to[0].rules[0].matches[0].path.value: must be an absolute path (start with /)`,
			}},
		{name: "http rule needs matches", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[{"default":{}}]}]}`,
			want: []string{"spec.to[0].rules[0].matches: must be set"}},
		{name: "http rule needs a match", typ: "MeshHTTPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[{"matches":[],"default":{}}]}]}`,
			want: []string{"spec.to[0].rules[0].matches: must have at least one item"}},
		{name: "tcp rule has no matches", typ: "MeshTCPRoute", spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b"},"rules":[{"matches":[],"default":{"backendRefs":[{"kind":"MeshService","name":"b"}]}}]}]}`,
			want: []string{"spec.to[0].rules[0].matches: unknown field"}},
		{name: "cross-namespace gateway backend", typ: "MeshTCPRoute", namespace: "pay-ns",
			spec: `{"targetRef":{"kind":"MeshGateway","name":"edge"},"to":[{"targetRef":{"kind":"MeshService","name":"pay"},"rules":[{"default":{"backendRefs":[{"kind":"MeshService","name":"x","namespace":"other-ns"}]}}]}]}`,
			want: []string{`spec.to[0].rules[0].default.backendRefs[0].namespace: a gateway route in namespace "pay-ns" must not send traffic to namespace "other-ns"`}},
	})
}

// TestInvalidConfs has at least one invalid spec per policy type, with the
// exact causes.
func TestInvalidConfs(t *testing.T) {
	to := func(conf string) string { return `{"to":[{"targetRef":{"kind":"Mesh"},"default":` + conf + `}]}` }
	from := func(conf string) string { return `{"from":[{"targetRef":{"kind":"Mesh"},"default":` + conf + `}]}` }
	top := func(conf string) string { return `{"targetRef":{"kind":"Mesh"},"default":` + conf + `}` }
	runSpecCases(t, []specCase{
		{name: "action required", typ: "MeshTrafficPermission", spec: from(`{}`),
			want: []string{"spec.from[0].default.action: must be set"}},
		{name: "both action spellings", typ: "MeshTrafficPermission", spec: `{"from":[{"default":{"action":"DenyWithShadowAllow"}},{"default":{"action":"ALLOW_WITH_SHADOW_DENY"}}]}`},
		{name: "timeouts", typ: "MeshTimeout", spec: to(`{"connectionTimeout":"0s","http":{"requestTimeout":"1x","maxStreamDuration":10}}`),
			want: []string{"spec.to[0].default.connectionTimeout: must be greater than 0",
				`spec.to[0].default.http.maxStreamDuration: must be a duration string like "5s", got number`,
				`spec.to[0].default.http.requestTimeout: invalid duration "1x"`}},
		{name: "retry", typ: "MeshRetry", spec: to(`{"http":{"numRetries":-1,"retryOn":["5xx","teapot","418"],"backOff":{"baseInterval":"0s"}},"grpc":{"retryOn":["Cancelled"]},"udp":{}}`),
			want: []string{"spec.to[0].default.udp: unknown field",
				`spec.to[0].default.grpc.retryOn[0]: invalid value "Cancelled": must be one of Canceled, DeadlineExceeded, Internal, ResourceExhausted, Unavailable`,
				"spec.to[0].default.http.backOff.baseInterval: must be greater than 0",
				"spec.to[0].default.http.numRetries: must be between 0 and 4294967295",
				`spec.to[0].default.http.retryOn[1]: invalid value "teapot": must be an HTTP status code or one of 5XX, GatewayError, Reset, Retriable4xx, ConnectFailure, EnvoyRatelimited, RefusedStream, Http3PostConnectFailure, HttpMethodConnect, HttpMethodDelete, HttpMethodGet, HttpMethodHead, HttpMethodOptions, HttpMethodPatch, HttpMethodPost, HttpMethodPut, HttpMethodTrace`}},
		{name: "circuit breaker", typ: "MeshCircuitBreaker", spec: to(`{"outlierDetection":{"maxEjectionPercent":150,"healthyPanicThreshold":"half","detectors":{"totalFailures":{"consecutive":"5"}}}}`),
			want: []string{"spec.to[0].default.outlierDetection.detectors.totalFailures.consecutive: must be an integer, got string",
				"spec.to[0].default.outlierDetection.healthyPanicThreshold: must be a number or a numeric string, got string",
				"spec.to[0].default.outlierDetection.maxEjectionPercent: must be between 0 and 100"}},
		{name: "health check", typ: "MeshHealthCheck", spec: to(`{"interval":"10","healthyThreshold":0,"http":{"expectedStatuses":[200,700]}}`),
			want: []string{"spec.to[0].default.healthyThreshold: must be between 1 and 2147483647",
				"spec.to[0].default.http.expectedStatuses[1]: must be between 100 and 599",
				`spec.to[0].default.interval: invalid duration "10"`}},
		{name: "rate limit", typ: "MeshRateLimit", spec: from(`{"local":{"http":{"requestRate":{"num":10}},"tcp":{"connectionRate":{"num":1,"interval":"10ms"}}}}`),
			want: []string{"spec.from[0].default.local.http.requestRate.interval: must be set",
				"spec.from[0].default.local.tcp.connectionRate.interval: must be at least 50ms"}},
		{name: "rate limit empty local", typ: "MeshRateLimit", spec: from(`{"local":{}}`),
			want: []string{"spec.from[0].default.local: at least one of http, tcp must be set"}},
		{name: "fault injection", typ: "MeshFaultInjection", spec: from(`{"http":[{},{"abort":{"httpStatus":42,"percentage":"x"}},{"responseBandwidth":{"limit":"fast","percentage":200}}]}`),
			want: []string{"spec.from[0].default.http[0]: at least one of abort, delay, responseBandwidth must be set",
				"spec.from[0].default.http[1].abort.httpStatus: must be between 100 and 599",
				"spec.from[0].default.http[1].abort.percentage: must be a number or a numeric string, got string",
				`spec.from[0].default.http[2].responseBandwidth.limit: invalid bandwidth "fast": must be a number followed by kbps, Mbps or Gbps`,
				"spec.from[0].default.http[2].responseBandwidth.percentage: must be between 0 and 100"}},
		{name: "access log", typ: "MeshAccessLog", spec: to(`{"backends":[{"type":"Tcp","file":{"path":"/x"}},{"tcp":{"address":""},"file":{"path":"/y"}},{"type":"File","file":{"path":"/z","format":{"type":"Json","plain":"x"}}}]}`),
			want: []string{"spec.to[0].default.backends[0].file: must not be set when type is Tcp",
				"spec.to[0].default.backends[0].tcp: must be set when type is Tcp",
				"spec.to[0].default.backends[1].tcp.address: must not be empty",
				"spec.to[0].default.backends[1]: exactly one of tcp, file, openTelemetry must be set",
				"spec.to[0].default.backends[2].file.format.plain: must not be set when type is Json",
				"spec.to[0].default.backends[2].file.format.json: must be set when type is Json"}},
		{name: "load balancing", typ: "MeshLoadBalancingStrategy", spec: to(`{"loadBalancer":{"type":"LeastRequest","leastRequest":{"choiceCount":1},"maglev":{}},"localityAwareness":{"crossZone":{"failover":[{"to":{"type":"Some"}}]}}}`),
			want: []string{`spec.to[0].default.localityAwareness.crossZone.failover[0].to.type: invalid value "Some": must be one of None, Only, Any, AnyExcept`,
				"spec.to[0].default.loadBalancer.leastRequest.choiceCount: must be between 2 and 4294967295",
				"spec.to[0].default.loadBalancer.maglev: must not be set when type is LeastRequest"}},
		{name: "trace", typ: "MeshTrace", spec: top(`{"backends":[{"zipkin":{"url":"http://a"}},{"datadog":{}}],"sampling":{"overall":120},"tags":[{"name":"a"}]}`),
			want: []string{"spec.default.backends[1].datadog.url: must be set",
				"spec.default.backends: must have at most one backend",
				"spec.default.sampling.overall: must be between 0 and 100",
				"spec.default.tags[0]: exactly one of literal, header must be set"}},
		{name: "metric", typ: "MeshMetric", spec: top(`{"applications":[{"name":"a"}],"backends":[{"type":"Graphite"},{"type":"Prometheus","prometheus":{"tls":{"mode":"On"}}}]}`),
			want: []string{"spec.default.applications[0].port: must be set",
				`spec.default.backends[0].type: invalid value "Graphite": must be one of OpenTelemetry, Prometheus`,
				`spec.default.backends[1].prometheus.tls.mode: invalid value "On": must be one of Disabled, ProvidedTLS, ActiveMTLSBackend`}},
		{name: "proxy patch", typ: "MeshProxyPatch", spec: top(`{"appendModifications":[{"cluster":{"operation":"Add"}},{"listener":{"operation":"AddFirst","value":"x"}},{"cluster":{"operation":"Patch"},"listener":{"operation":"Remove"}},{"httpFilter":{"operation":"Patch","value":"a","jsonPatches":[{"op":"upsert","path":"/a"}]}}]}`),
			want: []string{"spec.default.appendModifications[0].cluster.value: must be set when operation is Add",
				`spec.default.appendModifications[1].listener.operation: invalid value "AddFirst": must be one of Add, Remove, Patch`,
				"spec.default.appendModifications[2].cluster: exactly one of value, jsonPatches must be set when operation is Patch",
				"spec.default.appendModifications[2]: exactly one of cluster, listener, networkFilter, httpFilter, virtualHost must be set",
				`spec.default.appendModifications[3].httpFilter.jsonPatches[0].op: invalid value "upsert": must be one of add, remove, replace, move, copy, test`,
				"spec.default.appendModifications[3].httpFilter: exactly one of value, jsonPatches must be set when operation is Patch"}},
	})
}

func TestPolicyRole(t *testing.T) {
	reg := NewDefaultRegistry()
	cases := []struct {
		typ, ns, spec string
		want          string
		wantErr       string
	}{
		{"MeshTimeout", "", `{"to":[{"targetRef":{"kind":"MeshService","name":"a","namespace":"x"}}]}`, RoleSystem, ""},
		{"MeshTimeout", "kuma-system", `{"to":[]}`, RoleSystem, ""},
		{"MeshTimeout", "a-ns", `{"from":[{}]}`, RoleWorkloadOwner, ""},
		{"MeshTrace", "a-ns", `{"default":{}}`, RoleWorkloadOwner, ""},
		{"MeshTimeout", "a-ns", `{"to":[]}`, RoleWorkloadOwner, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"MeshService","name":"a"}}]}`, RoleProducer, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"MeshHTTPRoute","name":"r","namespace":"a-ns"}}]}`, RoleProducer, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"MeshService","labels":{"k8s.kuma.io/namespace":"a-ns"}}}]}`, RoleProducer, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"MeshService","labels":{"kuma.io/display-name":"a"}}}]}`, RoleConsumer, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"MeshService","name":"b","namespace":"b-ns"}}]}`, RoleConsumer, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"Mesh"}}]}`, RoleConsumer, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"MeshExternalService","name":"e"}}]}`, RoleConsumer, ""},
		{"MeshTimeout", "a-ns", `{"to":[{"targetRef":{"kind":"Mesh"}},{"targetRef":{"kind":"MeshService","name":"a"}}]}`, "",
			`invalid resource: spec.to: must not mix targets in the policy's namespace "a-ns" with targets in other namespaces`},
		{"TrafficPermission", "", `{}`, RoleSystem, ""},
		{"MeshTimeout", "a-ns", `{"to":`, "", "invalid JSON"},
		{"Dataplane", "", `{}`, "", "not a policy type"},
	}
	for _, tc := range cases {
		d, _ := reg.Lookup(tc.typ)
		r := &Resource{Type: tc.typ, Mesh: "default", Name: "p", Namespace: tc.ns, Spec: []byte(tc.spec)}
		got, err := PolicyRole(r, d, "kuma-system")
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s %s %s: err = %v, want %q", tc.typ, tc.ns, tc.spec, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("%s %s %s: = %q, %v; want %q", tc.typ, tc.ns, tc.spec, got, err, tc.want)
		}
	}
	var verr *ValidationError
	d, _ := reg.Lookup("MeshTimeout")
	_, err := PolicyRole(&Resource{Type: "MeshTimeout", Namespace: "a", Spec: []byte(`{"to":[{"targetRef":{"kind":"Mesh"}},{"targetRef":{"kind":"MeshService","name":"a"}}]}`)}, d, "")
	if !errors.As(err, &verr) {
		t.Errorf("mixed roles: want a *ValidationError, got %T", err)
	}
}

func TestCanonicalTrafficAction(t *testing.T) {
	for in, want := range map[string]string{
		"Allow": ActionAllow, "ALLOW": ActionAllow, "Deny": ActionDeny, "DENY": ActionDeny,
		"AllowWithShadowDeny": ActionAllowWithShadowDeny, "DENY_WITH_SHADOW_ALLOW": ActionDenyWithShadowAllow,
	} {
		if got, ok := CanonicalTrafficAction(in); !ok || got != want {
			t.Errorf("CanonicalTrafficAction(%q) = %q, %v", in, got, ok)
		}
	}
	if _, ok := CanonicalTrafficAction("allow"); ok {
		t.Error("lower case accepted")
	}
}

// TestKuma214PolicyAPI: the Kuma 2.10+ shapes — a top-level Dataplane
// (by name, labels, or all; sectionName only with rules), spec.rules on
// inbound policies (MeshTrafficPermission's SPIFFE ID matchers), and
// MeshRateLimit's to on gateways — with Kuma's errors for what it refuses.
func TestKuma214PolicyAPI(t *testing.T) {
	timeoutRules := func(ref string) string {
		return `{"targetRef":` + ref + `,"rules":[{"default":{"idleTimeout":"20s"}}]}`
	}
	runSpecCases(t, []specCase{
		{name: "Dataplane by name with rules", typ: "MeshTimeout", spec: timeoutRules(`{"kind":"Dataplane","name":"web-01","sectionName":"http"}`)},
		{name: "Dataplane by labels", typ: "MeshTimeout", spec: timeoutRules(`{"kind":"Dataplane","labels":{"app":"web"}}`)},
		{name: "every Dataplane", typ: "MeshTimeout", spec: timeoutRules(`{"kind":"Dataplane"}`)},
		{name: "Dataplane labels with name", typ: "MeshTimeout", spec: timeoutRules(`{"kind":"Dataplane","labels":{"app":"web"},"name":"x"}`),
			want: []string{"spec.targetRef.labels: either labels or name and namespace must be specified"}},
		{name: "Dataplane with tags", typ: "MeshTimeout", spec: timeoutRules(`{"kind":"Dataplane","tags":{"a":"b"}}`),
			want: []string{"spec.targetRef.tags: must not be set with kind Dataplane"}},
		{name: "sectionName with from", typ: "MeshTimeout",
			spec: `{"targetRef":{"kind":"Dataplane","name":"web","sectionName":"http"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"2s"}}]}`},
		{name: "sectionName of an outbound policy", typ: "MeshTimeout",
			spec: `{"targetRef":{"kind":"Dataplane","name":"web","sectionName":"http"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"2s"}}]}`,
			want: []string{"spec.targetRef.sectionName: can only be used with inbound policies (spec.from or spec.rules)"}},
		{name: "sectionName names no port of a route", typ: "MeshTimeout",
			spec: `{"to":[{"targetRef":{"kind":"MeshHTTPRoute","name":"r","sectionName":"http"},"default":{"idleTimeout":"2s"}}]}`,
			want: []string{"spec.to[0].targetRef.sectionName: must not be set with kind MeshHTTPRoute"}},
		{name: "sectionName names a port of a service", typ: "MeshTimeout",
			spec: `{"to":[{"targetRef":{"kind":"MeshService","name":"b","sectionName":"http"},"default":{"idleTimeout":"2s"}}]}`},
		{name: "rules with from", typ: "MeshTimeout",
			spec: `{"targetRef":{"kind":"Mesh"},"rules":[{"default":{"idleTimeout":"2s"}}],"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"2s"}}]}`,
			want: []string{"spec: fields 'to' and 'from' must be empty when 'rules' is defined"}},
		{name: "rule without default", typ: "MeshTimeout", spec: `{"rules":[{}]}`,
			want: []string{"spec.rules[0].default: must be set"}},
		{name: "rule with invalid conf", typ: "MeshTimeout", spec: `{"rules":[{"default":{"idleTimeout":"soon"}}]}`,
			want: []string{`spec.rules[0].default.idleTimeout: invalid duration "soon"`}},
		{name: "rule matches", typ: "MeshTimeout", spec: `{"rules":[{"matches":[{"spiffeID":{"type":"Exact","value":"spiffe://a/b"}}],"default":{"idleTimeout":"2s"}}]}`},
		{name: "rule matches by SNI", typ: "MeshTimeout", spec: `{"rules":[{"matches":[{"sni":{"type":"Exact","value":"a.b"}}],"default":{"idleTimeout":"2s"}}]}`,
			want: []string{"spec.rules[0].matches[0].sni: SNI matches are not supported by Meridian yet: match by spiffeID"}},
		{name: "rule matches without a matcher", typ: "MeshTimeout", spec: `{"rules":[{"matches":[{}],"default":{"idleTimeout":"2s"}}]}`,
			want: []string{"spec.rules[0].matches[0]: must specify at least one of 'spiffeID' or 'sni'"}},
		{name: "rules on a type without them", typ: "MeshRetry", spec: `{"rules":[{"default":{}}],"to":[{"targetRef":{"kind":"Mesh"},"default":{}}]}`,
			want: []string{"spec.rules: MeshRetry does not support rules"}},
		{name: "MTP rules", typ: "MeshTrafficPermission",
			spec: `{"targetRef":{"kind":"Dataplane","labels":{"app":"db"}},"rules":[{"default":{"allow":[{"spiffeID":{"type":"Prefix","value":"spiffe://default.zone-1.mesh.local/ns/web"}}],"deny":[{"spiffeID":{"type":"Exact","value":"spiffe://default.zone-1.mesh.local/ns/web/sa/legacy"}}]}}]}`},
		{name: "MTP rule empty", typ: "MeshTrafficPermission", spec: `{"rules":[{"default":{}}]}`,
			want: []string{"spec.rules[0].default: at least one of 'allow', 'allowWithShadowDeny', 'deny' has to be defined"}},
		{name: "MTP rule bad spiffe", typ: "MeshTrafficPermission", spec: `{"rules":[{"default":{"allow":[{"spiffeID":{"type":"Exact","value":"web"}}]}}]}`,
			want: []string{`spec.rules[0].default.allow[0].spiffeID.value: invalid SPIFFE ID "web": must start with spiffe://`}},
		{name: "MTP rules with from", typ: "MeshTrafficPermission",
			spec: `{"rules":[{"default":{"allow":[{"spiffeID":{"type":"Exact","value":"spiffe://a/b"}}]}}],"from":[{"targetRef":{"kind":"Mesh"},"default":{"action":"Allow"}}]}`,
			want: []string{"spec: field 'from' must be empty when 'rules' is defined"}},
		{name: "MeshRateLimit to on gateways", typ: "MeshRateLimit",
			spec: `{"targetRef":{"kind":"MeshGateway","name":"edge"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"local":{"http":{"requestRate":{"num":5,"interval":"10s"}}}}}]}`},
		{name: "MeshRateLimit to on a service", typ: "MeshRateLimit",
			spec: `{"targetRef":{"kind":"MeshService","name":"web"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"local":{"http":{"requestRate":{"num":5,"interval":"10s"}}}}}]}`,
			want: []string{"spec.to: must not be defined: MeshRateLimit to applies to gateways only (a top-level MeshGateway, or Mesh/MeshSubset including Gateway proxies)"}},
		{name: "MeshMultiZoneService as a to target", typ: "MeshTimeout",
			spec: `{"to":[{"targetRef":{"kind":"MeshMultiZoneService","name":"backend"},"default":{"idleTimeout":"5s"}}]}`},
	})
}
