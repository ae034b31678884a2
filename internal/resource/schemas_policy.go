package resource

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Conf schemas of the targetRef policies, following Kuma's v1alpha1 APIs
// (pkg/plugins/policies/*/api/v1alpha1). Each describes one `default` or
// `override` block.

// Traffic permission actions: docs/policy.md#rbac spells them in upper
// snake case, Kuma's API in camel case. Both are accepted; the engine
// compares CanonicalTrafficAction values.
const (
	ActionAllow               = "ALLOW"
	ActionDeny                = "DENY"
	ActionAllowWithShadowDeny = "ALLOW_WITH_SHADOW_DENY"
	ActionDenyWithShadowAllow = "DENY_WITH_SHADOW_ALLOW"
)

// trafficActions maps every accepted spelling to its canonical form.
func trafficActions() map[string]string {
	return map[string]string{
		ActionAllow: ActionAllow, "Allow": ActionAllow,
		ActionDeny: ActionDeny, "Deny": ActionDeny,
		ActionAllowWithShadowDeny: ActionAllowWithShadowDeny, "AllowWithShadowDeny": ActionAllowWithShadowDeny,
		ActionDenyWithShadowAllow: ActionDenyWithShadowAllow, "DenyWithShadowAllow": ActionDenyWithShadowAllow,
	}
}

// CanonicalTrafficAction maps a MeshTrafficPermission action in either
// spelling ("AllowWithShadowDeny" or "ALLOW_WITH_SHADOW_DENY") to the upper
// snake case form; ok is false for anything else.
func CanonicalTrafficAction(action string) (canonical string, ok bool) {
	canonical, ok = trafficActions()[action]
	return canonical, ok
}

func meshTrafficPermissionConf() *Schema {
	return object(req("action", str().with(stringCheck(func(a string) string {
		if _, ok := CanonicalTrafficAction(a); ok {
			return ""
		}
		return fmt.Sprintf("invalid action %q: must be one of %s, %s, %s, %s (or Allow, Deny, AllowWithShadowDeny, DenyWithShadowAllow)",
			a, ActionAllow, ActionDeny, ActionAllowWithShadowDeny, ActionDenyWithShadowAllow)
	}))))
}

// mtpRuleLists are the lists of a MeshTrafficPermission rule: every rule of
// every policy on an inbound contributes to them (Kuma unions them: a deny
// anywhere wins over any allow), so they concatenate on merge.
func mtpRuleLists() []string { return []string{"allow", "allowWithShadowDeny", "deny"} }

// spiffeIDMatch is one match of a rule (Kuma's common Match): a SPIFFE ID,
// exact or by prefix. Kuma's SNI match is not supported yet.
func spiffeIDMatch() *Schema {
	return object(
		opt("spiffeID", object(
			req("type", enum("Exact", "Prefix")),
			req("value", nonEmptyStr().with(stringCheck(checkSpiffeID))),
		)),
		opt("sni", anyValue().with(func(path string, _ any, errs *ValidationError) {
			errs.Add(path, "SNI matches are not supported by Meridian yet: match by spiffeID")
		})),
	).with(func(path string, v any, errs *ValidationError) {
		if obj, _ := v.(map[string]any); obj["spiffeID"] == nil && obj["sni"] == nil {
			errs.Add(path, "must specify at least one of 'spiffeID' or 'sni'")
		}
	})
}

// meshTrafficPermissionRuleConf is a rules[].default of MeshTrafficPermission
// (Kuma 2.12+): SPIFFE ID matchers that are denied, allowed, or allowed with
// a shadow deny.
func meshTrafficPermissionRuleConf() *Schema {
	match := spiffeIDMatch()
	lists := make([]field, 0, 3)
	for _, l := range mtpRuleLists() {
		lists = append(lists, opt(l, listOf(match)))
	}
	return object(lists...).with(func(path string, v any, errs *ValidationError) {
		obj, _ := v.(map[string]any)
		for _, l := range mtpRuleLists() {
			if isNonEmpty(obj[l]) {
				return
			}
		}
		errs.Add(path, "at least one of 'allow', 'allowWithShadowDeny', 'deny' has to be defined")
	})
}

// checkSpiffeID accepts spiffe://<trust domain>[/<path>] as the SPIFFE spec
// writes it: a lowercase trust domain, non-empty path segments.
func checkSpiffeID(s string) string {
	rest, ok := strings.CutPrefix(s, "spiffe://")
	if !ok {
		return fmt.Sprintf("invalid SPIFFE ID %q: must start with spiffe://", s)
	}
	td, path, _ := strings.Cut(rest, "/")
	if td == "" || strings.Trim(td, "abcdefghijklmnopqrstuvwxyz0123456789.-_") != "" {
		return fmt.Sprintf("invalid SPIFFE ID %q: the trust domain must be lowercase letters, digits, '.', '-' or '_'", s)
	}
	if path != "" {
		for _, seg := range strings.Split(path, "/") {
			if seg == "" || seg == "." || seg == ".." {
				return fmt.Sprintf("invalid SPIFFE ID %q: empty, '.' or '..' path segment", s)
			}
		}
	}
	return ""
}

// meshPassthroughConf is MeshPassthrough's proxy-wide default (Kuma 2.9+):
// which traffic leaving the mesh passes through.
func meshPassthroughConf() *Schema {
	return object(
		opt("passthroughMode", enum("All", "Matched", "None")),
		opt("appendMatch", listOf(object(
			req("type", enum("Domain", "IP", "CIDR")),
			req("value", nonEmptyStr()),
			opt("port", port()),
			opt("protocol", enum("tcp", "tls", "grpc", "http", "http2", "mysql").withDefault("tcp")),
		))),
	)
}

// meshTLSConf is MeshTLS's from/rules default (Kuma 2.9+).
func meshTLSConf() *Schema {
	versions := []string{"TLSAuto", "TLS10", "TLS11", "TLS12", "TLS13"}
	return object(
		opt("tlsVersion", object(opt("min", enum(versions...).withDefault("TLSAuto")), opt("max", enum(versions...).withDefault("TLSAuto")))),
		opt("tlsCiphers", listOf(enum("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
			"ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384",
			"ECDHE-RSA-CHACHA20-POLY1305"))),
		opt("mode", enum("Strict", "Permissive")),
	)
}

func meshTimeoutConf() *Schema {
	return object(
		opt("connectionTimeout", positiveDuration()),
		opt("idleTimeout", duration()),
		opt("http", object(
			opt("requestTimeout", duration()),
			opt("streamIdleTimeout", duration()),
			opt("maxStreamDuration", duration()),
			opt("maxConnectionDuration", duration()),
			opt("requestHeadersTimeout", duration()),
		)),
	)
}

func meshRetryConf() *Schema {
	return object(
		opt("tcp", object(opt("maxConnectAttempt", uint32Value()))),
		opt("http", object(
			opt("numRetries", uint32Value()),
			opt("perTryTimeout", duration()),
			opt("backOff", retryBackOff()),
			opt("rateLimitedBackOff", rateLimitedBackOff()),
			opt("retryOn", listOf(str().with(stringCheck(checkHTTPRetryOn)))),
			opt("retriableResponseHeaders", listOf(headerMatch())),
			opt("retriableRequestHeaders", listOf(headerMatch())),
			opt("hostSelection", listOf(object(
				req("predicate", enum("OmitPreviousHosts", "OmitHostsWithTags", "OmitPreviousPriorities")),
				opt("tags", tagMap()),
				opt("updateFrequency", integer(0, 1<<31-1).defaultInt("2")),
			))),
			opt("hostSelectionMaxAttempts", integer(0, 1<<63-1)),
		)),
		opt("grpc", object(
			opt("numRetries", uint32Value()),
			opt("perTryTimeout", duration()),
			opt("backOff", retryBackOff()),
			opt("rateLimitedBackOff", rateLimitedBackOff()),
			opt("retryOn", listOf(enum("Canceled", "DeadlineExceeded", "Internal", "ResourceExhausted", "Unavailable"))),
		)),
	)
}

func retryBackOff() *Schema {
	return object(opt("baseInterval", positiveDuration()), opt("maxInterval", positiveDuration()))
}

func rateLimitedBackOff() *Schema {
	return object(
		opt("resetHeaders", listOf(object(
			req("name", nonEmptyStr()),
			req("format", enum("Seconds", "UnixTimestamp")),
		))),
		opt("maxInterval", positiveDuration()),
	)
}

// checkHTTPRetryOn accepts Kuma's named conditions and HTTP status codes.
func checkHTTPRetryOn(s string) string {
	named := []string{"5xx", "5XX", "GatewayError", "Reset", "Retriable4xx", "ConnectFailure",
		"EnvoyRatelimited", "RefusedStream", "Http3PostConnectFailure", "HttpMethodConnect",
		"HttpMethodDelete", "HttpMethodGet", "HttpMethodHead", "HttpMethodOptions",
		"HttpMethodPatch", "HttpMethodPost", "HttpMethodPut", "HttpMethodTrace"}
	if contains(named, s) {
		return ""
	}
	if code, err := strconv.Atoi(s); err == nil && code >= 100 && code <= 599 {
		return ""
	}
	return "invalid value " + strconv.Quote(s) + ": must be an HTTP status code or one of " + strings.Join(named[1:], ", ")
}

func meshCircuitBreakerConf() *Schema {
	consecutive := func() *Schema { return object(opt("consecutive", uint32Value())) }
	return object(
		opt("connectionLimits", object(
			opt("maxConnections", uint32Value()),
			opt("maxConnectionPools", uint32Value()),
			opt("maxPendingRequests", uint32Value()),
			opt("maxRetries", uint32Value()),
			opt("maxRequests", uint32Value()),
		)),
		opt("outlierDetection", object(
			opt("disabled", boolean()),
			opt("interval", positiveDuration()),
			opt("baseEjectionTime", positiveDuration()),
			opt("maxEjectionPercent", integer(0, 100)),
			opt("splitExternalAndLocalErrors", boolean()),
			opt("healthyPanicThreshold", percent()),
			opt("detectors", object(
				opt("totalFailures", consecutive()),
				opt("gatewayFailures", consecutive()),
				opt("localOriginFailures", consecutive()),
				opt("successRate", object(
					opt("minimumHosts", uint32Value()),
					opt("requestVolume", uint32Value()),
					opt("standardDeviationFactor", decimal()),
				)),
				opt("failurePercentage", object(
					opt("minimumHosts", uint32Value()),
					opt("requestVolume", uint32Value()),
					opt("threshold", integer(0, 100)),
				)),
			)),
		)),
	)
}

func meshHealthCheckConf() *Schema {
	return object(
		opt("interval", positiveDuration()),
		opt("unhealthyInterval", positiveDuration()),
		opt("timeout", positiveDuration()),
		opt("unhealthyThreshold", integer(1, 1<<31-1)),
		opt("healthyThreshold", integer(1, 1<<31-1)),
		opt("initialJitter", duration()),
		opt("intervalJitter", duration()),
		opt("intervalJitterPercent", integer(0, 100)),
		opt("healthyPanicThreshold", percent()),
		opt("failTrafficOnPanic", boolean()),
		opt("eventLogPath", str()),
		opt("alwaysLogHealthCheckFailures", boolean()),
		opt("noTrafficInterval", positiveDuration()),
		opt("reuseConnection", boolean()),
		opt("tcp", object(
			opt("disabled", boolean()),
			opt("send", str()),
			opt("receive", listOf(str())),
		)),
		opt("http", object(
			opt("disabled", boolean()),
			opt("path", str()),
			opt("requestHeadersToAdd", object(opt("set", listOf(headerKV())), opt("add", listOf(headerKV())))),
			opt("expectedStatuses", listOf(httpStatus())),
		)),
		opt("grpc", object(
			opt("disabled", boolean()),
			opt("serviceName", str()),
			opt("authority", str()),
		)),
	)
}

func meshRateLimitConf() *Schema {
	rate := func(count string, minInterval time.Duration) *Schema {
		return object(req(count, uint32Value()), req("interval", positiveDuration().with(minDuration(minInterval))))
	}
	return object(opt("local", object(
		opt("http", object(
			opt("disabled", boolean()),
			opt("requestRate", rate("num", 0)),
			opt("onRateLimit", object(
				opt("status", httpStatus()),
				opt("headers", headerModifier()),
			)),
		)),
		// Envoy's local TCP rate limiter refills its bucket at most every 50ms.
		opt("tcp", object(
			opt("disabled", boolean()),
			opt("connectionRate", rate("num", 50*time.Millisecond)),
		)),
	).with(atLeastOneOf("http", "tcp"))))
}

// minDuration rejects durations shorter than lo (a valid duration string is
// already guaranteed unless the walker reported it).
func minDuration(lo time.Duration) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		if d, err := time.ParseDuration(v.(string)); err == nil && d > 0 && d < lo {
			errs.Add(path, "must be at least %s", lo)
		}
	}
}

func meshFaultInjectionConf() *Schema {
	return object(opt("http", listOf(object(
		opt("abort", object(req("httpStatus", httpStatus()), req("percentage", percent()))),
		opt("delay", object(req("value", positiveDuration()), req("percentage", percent()))),
		opt("responseBandwidth", object(
			req("limit", str().with(stringCheck(checkBandwidth))),
			req("percentage", percent()),
		)),
	).with(atLeastOneOf("abort", "delay", "responseBandwidth")))))
}

// checkBandwidth accepts Kuma's bandwidth limits: an integer and a unit,
// e.g. "10kbps", "1 Mbps", "2Gbps".
func checkBandwidth(s string) string {
	for _, unit := range []string{"kbps", "Mbps", "Gbps"} {
		num, ok := strings.CutSuffix(s, unit)
		if !ok {
			continue
		}
		if _, err := strconv.ParseUint(strings.TrimSpace(num), 10, 32); err == nil {
			return ""
		}
	}
	return "invalid bandwidth " + strconv.Quote(s) + ": must be a number followed by kbps, Mbps or Gbps"
}

func meshAccessLogConf() *Schema {
	blocks := union{typeField: "type", blocks: map[string]string{"Tcp": "tcp", "File": "file", "OpenTelemetry": "openTelemetry"}, required: true}
	backend := object(
		opt("type", enum(blocks.types()...)),
		opt("tcp", object(opt("format", accessLogFormat()), req("address", nonEmptyStr()))),
		opt("file", object(opt("format", accessLogFormat()), req("path", nonEmptyStr()))),
		opt("openTelemetry", object(
			opt("endpoint", str().withDefault("")),
			opt("attributes", listOf(object(req("key", nonEmptyStr()), req("value", str())))),
			opt("body", anyValue()),
			opt("backendRef", otelBackendRef()),
		).with(otelEndpointOrBackendRef(nil))),
	).with(exactlyOneOf("tcp", "file", "openTelemetry"), blocks.check)
	return object(opt("backends", listOf(backend)))
}

// otelBackendRef points an OpenTelemetry backend at a
// MeshOpenTelemetryBackend of the mesh by labels (Kuma 2.14's
// BackendResourceRef).
func otelBackendRef() *Schema {
	return object(req("kind", enum("MeshOpenTelemetryBackend")), opt("labels", stringMap())).
		with(func(path string, v any, errs *ValidationError) {
			if labels, _ := v.(map[string]any)["labels"].(map[string]any); len(labels) == 0 {
				errs.Add(path, "labels must be set: a MeshOpenTelemetryBackend is referenced by labels")
			}
		})
}

// otelEndpointOrBackendRef: an OpenTelemetry backend names its collector
// either inline (endpoint, host:port; Kuma 2.14 deprecates it) or by
// backendRef, exactly one. extra, when set, further checks an endpoint.
func otelEndpointOrBackendRef(extra func(string) string) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		obj := v.(map[string]any)
		endpoint, _ := obj["endpoint"].(string)
		_, hasRef := obj["backendRef"].(map[string]any)
		switch {
		case endpoint != "" && hasRef:
			errs.Add(path, "only one of endpoint, backendRef may be set")
		case endpoint == "" && !hasRef:
			errs.Add(path, "exactly one of endpoint, backendRef must be set")
		case hasRef:
		case strings.ContainsAny(endpoint, "/?#"):
			errs.Add(joinPath(path, "endpoint"), "invalid endpoint %q: must be host:port, not a URL", endpoint)
		case extra != nil:
			if msg := extra(endpoint); msg != "" {
				errs.Add(joinPath(path, "endpoint"), "%s", msg)
			}
		}
	}
}

// checkHostPortForm: MeshMetric's OpenTelemetry endpoint is host:port.
func checkHostPortForm(s string) string {
	if _, _, err := net.SplitHostPort(s); err != nil {
		return fmt.Sprintf("invalid endpoint %q: must be host:port", s)
	}
	return ""
}

// accessLogFormat: type Plain or Json with its block; Kuma's docs also
// leave type out and give only the block, which then says the type.
func accessLogFormat() *Schema {
	blocks := union{typeField: "type", blocks: map[string]string{"Plain": "plain", "Json": "json"}, required: true}
	return object(
		opt("type", enum(blocks.types()...)),
		opt("plain", str()),
		opt("json", listOf(object(req("key", nonEmptyStr()), req("value", str())))),
		opt("omitEmptyValues", boolean().withDefault(false)),
	).with(blocks.check).with(func(path string, v any, errs *ValidationError) {
		obj := v.(map[string]any)
		if obj["type"] != nil {
			return
		}
		switch set := present(obj, "plain", "json"); len(set) {
		case 0:
			errs.Add(path, "one of plain or json must be set (with type Plain or Json)")
		case 2:
			errs.Add(path, "only one of plain or json may be set")
		}
	})
}

func meshLoadBalancingStrategyConf() *Schema {
	return object(
		opt("localityAwareness", object(
			opt("disabled", boolean()),
			opt("localZone", object(opt("affinityTags", listOf(object(
				req("key", nonEmptyStr()),
				opt("weight", uint32Value()),
			))))),
			opt("crossZone", object(
				opt("failover", listOf(object(
					opt("from", object(req("zones", listOf(nonEmptyStr())))),
					req("to", object(
						req("type", enum("None", "Only", "Any", "AnyExcept")),
						opt("zones", listOf(nonEmptyStr())),
					)),
				))),
				opt("failoverThreshold", object(req("percentage", percent()))),
			)),
		)),
		opt("loadBalancer", loadBalancer()),
	)
}

func loadBalancer() *Schema {
	blocks := union{typeField: "type", blocks: map[string]string{
		"RoundRobin": "roundRobin", "LeastRequest": "leastRequest", "RingHash": "ringHash",
		"Random": "random", "Maglev": "maglev",
	}}
	return object(
		req("type", enum(blocks.types()...)),
		opt("roundRobin", object()),
		opt("leastRequest", object(opt("choiceCount", integer(2, 1<<32-1)))),
		opt("ringHash", object(
			opt("hashFunction", enum("XXHash", "MurmurHash2")),
			opt("minRingSize", integer(1, 8000000)),
			opt("maxRingSize", integer(1, 8000000)),
			opt("hashPolicies", listOf(hashPolicy())),
		)),
		opt("random", object()),
		opt("maglev", object(
			opt("tableSize", integer(1, 5000011)),
			opt("hashPolicies", listOf(hashPolicy())),
		)),
	).with(blocks.check)
}

func hashPolicy() *Schema {
	blocks := union{typeField: "type", blocks: map[string]string{
		"Header": "header", "Cookie": "cookie", "Connection": "connection",
		"SourceIP": "connection", "QueryParameter": "queryParameter", "FilterState": "filterState",
	}, required: true}
	return object(
		req("type", enum(blocks.types()...)),
		opt("terminal", boolean()),
		opt("header", object(req("name", nonEmptyStr()))),
		opt("cookie", object(req("name", nonEmptyStr()), opt("ttl", duration()), opt("path", str()))),
		opt("connection", object(opt("sourceIP", boolean()))),
		opt("queryParameter", object(req("name", nonEmptyStr()))),
		opt("filterState", object(req("key", nonEmptyStr()))),
	).with(blocks.check)
}

func meshTraceConf() *Schema {
	blocks := union{typeField: "type", blocks: map[string]string{"Zipkin": "zipkin", "Datadog": "datadog", "OpenTelemetry": "openTelemetry"}, required: true}
	backend := object(
		opt("type", enum(blocks.types()...)),
		opt("zipkin", object(
			req("url", nonEmptyStr()),
			opt("traceId128bit", boolean().withDefault(false)),
			opt("apiVersion", enum("httpJson", "httpProto").withDefault("httpJson")),
			opt("sharedSpanContext", boolean().withDefault(true)),
		)),
		opt("datadog", object(req("url", nonEmptyStr()), opt("splitService", boolean().withDefault(false)))),
		opt("openTelemetry", object(opt("endpoint", str()), opt("backendRef", otelBackendRef())).with(otelEndpointOrBackendRef(nil))),
	).with(exactlyOneOf("zipkin", "datadog", "openTelemetry"), blocks.check)
	backends := listOf(backend).with(func(path string, v any, errs *ValidationError) {
		// Envoy takes one tracing provider; Kuma keeps a list for the future.
		if len(v.([]any)) > 1 {
			errs.Add(path, "must have at most one backend")
		}
	})
	return object(
		opt("backends", backends),
		opt("sampling", object(opt("overall", percent()), opt("client", percent()), opt("random", percent()))),
		opt("tags", listOf(object(
			req("name", nonEmptyStr()),
			opt("literal", str()),
			opt("header", object(req("name", nonEmptyStr()), opt("default", str()))),
		).with(exactlyOneOf("literal", "header")))),
	)
}

func meshMetricConf() *Schema {
	blocks := union{typeField: "type", blocks: map[string]string{"Prometheus": "prometheus", "OpenTelemetry": "openTelemetry"}, required: true}
	return object(
		opt("sidecar", object(
			opt("regex", str()),
			opt("includeUnused", boolean()),
			opt("profiles", anyValue()),
		)),
		opt("applications", listOf(object(
			opt("name", str()),
			opt("path", str().withDefault("/metrics")),
			opt("address", str()),
			req("port", port()),
		))),
		opt("backends", listOf(object(
			req("type", enum(blocks.types()...)),
			opt("prometheus", object(
				opt("clientId", str()),
				opt("port", port().defaultInt("5670")),
				opt("path", str().withDefault("/metrics")),
				opt("tls", object(opt("mode", enum("Disabled", "ProvidedTLS", "ActiveMTLSBackend").withDefault("Disabled")))),
			)),
			opt("openTelemetry", object(opt("endpoint", str()), opt("backendRef", otelBackendRef()), opt("refreshInterval", positiveDuration())).
				with(otelEndpointOrBackendRef(checkHostPortForm))),
		).with(blocks.check))),
	)
}

func meshProxyPatchConf() *Schema {
	resourceOps := []string{"Add", "Remove", "Patch"}
	filterOps := []string{"Remove", "Patch", "AddFirst", "AddBefore", "AddAfter", "AddLast"}
	listenerTags := func() []field {
		return []field{opt("origin", str()), opt("name", str()), opt("listenerName", str()), opt("listenerTags", stringMap())}
	}
	return object(opt("appendModifications", listOf(object(
		opt("cluster", proxyPatchMod(resourceOps, opt("origin", str()), opt("name", str()))),
		opt("listener", proxyPatchMod(resourceOps, opt("origin", str()), opt("name", str()), opt("tags", stringMap()))),
		opt("networkFilter", proxyPatchMod(filterOps, listenerTags()...)),
		opt("httpFilter", proxyPatchMod(filterOps, listenerTags()...)),
		opt("virtualHost", proxyPatchMod(resourceOps, opt("origin", str()), opt("name", str()), opt("routeConfigurationName", str()))),
	).with(exactlyOneOf("cluster", "listener", "networkFilter", "httpFilter", "virtualHost")))))
}

// proxyPatchMod is one MeshProxyPatch modification. The Envoy value is an
// opaque YAML string and JSON patch values are opaque: Envoy validates them.
func proxyPatchMod(ops []string, match ...field) *Schema {
	return object(
		req("operation", enum(ops...)),
		opt("match", object(match...)),
		opt("value", str()),
		opt("jsonPatches", listOf(object(
			req("op", enum("add", "remove", "replace", "move", "copy", "test")),
			req("path", nonEmptyStr()),
			opt("value", anyValue()),
			opt("from", str()),
		))),
	).with(func(path string, v any, errs *ValidationError) {
		obj := v.(map[string]any)
		op, _ := obj["operation"].(string)
		switch {
		case op == "Patch" && len(present(obj, "value", "jsonPatches")) != 1:
			errs.Add(path, "exactly one of value, jsonPatches must be set when operation is Patch")
		case strings.HasPrefix(op, "Add") && obj["value"] == nil:
			errs.Add(joinPath(path, "value"), "must be set when operation is %s", op)
		case op == "Remove" && len(present(obj, "value", "jsonPatches")) > 0:
			errs.Add(path, "value and jsonPatches must not be set when operation is Remove")
		}
	})
}

// meshHTTPRouteRule is one entry of MeshHTTPRoute's to[].rules. Kuma's
// schema requires at least one match (a catch-all is a PathPrefix "/").
func meshHTTPRouteRule() *Schema {
	return object(
		req("matches", nonEmptyList(httpRouteMatch())),
		req("default", object(
			opt("filters", listOf(httpRouteFilter())),
			opt("backendRefs", listOf(backendRef())),
		)),
	)
}

// meshTCPRouteRule is the one entry MeshTCPRoute's to[].rules may hold.
func meshTCPRouteRule() *Schema {
	return object(req("default", object(req("backendRefs", nonEmptyList(backendRef())))))
}

func httpRouteMatch() *Schema {
	return object(
		opt("path", object(
			req("type", enum("Exact", "PathPrefix", "RegularExpression")),
			req("value", nonEmptyStr()),
		).with(checkRoutePath)),
		opt("method", enum("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE")),
		opt("queryParams", listOf(object(
			req("type", enum("Exact", "RegularExpression")),
			req("name", nonEmptyStr()),
			req("value", str()),
		))),
		opt("headers", listOf(headerMatch())),
	)
}

// checkRoutePath: Exact and PathPrefix values are absolute paths.
func checkRoutePath(path string, v any, errs *ValidationError) {
	obj := v.(map[string]any)
	typ, _ := obj["type"].(string)
	value, _ := obj["value"].(string)
	if (typ == "Exact" || typ == "PathPrefix") && value != "" && !strings.HasPrefix(value, "/") {
		errs.Add(joinPath(path, "value"), "must be an absolute path (start with /)")
	}
}

func httpRouteFilter() *Schema {
	blocks := union{typeField: "type", blocks: map[string]string{
		"RequestHeaderModifier": "requestHeaderModifier", "ResponseHeaderModifier": "responseHeaderModifier",
		"RequestRedirect": "requestRedirect", "URLRewrite": "urlRewrite", "RequestMirror": "requestMirror",
	}, required: true}
	pathRewrite := func() *Schema {
		rw := union{typeField: "type", blocks: map[string]string{
			"ReplaceFullPath": "replaceFullPath", "ReplacePrefixMatch": "replacePrefixMatch",
		}, required: true}
		return object(
			req("type", enum(rw.types()...)),
			opt("replaceFullPath", str()),
			opt("replacePrefixMatch", str()),
		).with(rw.check)
	}
	return object(
		req("type", enum(blocks.types()...)),
		opt("requestHeaderModifier", headerModifier()),
		opt("responseHeaderModifier", headerModifier()),
		opt("requestRedirect", object(
			opt("scheme", enum("http", "https")),
			opt("hostname", str().with(stringCheck(checkHostname))),
			opt("path", pathRewrite()),
			opt("port", port()),
			opt("statusCode", integer(300, 399).with(intIn(301, 302, 303, 307, 308)).defaultInt("302")),
		)),
		opt("urlRewrite", object(
			opt("hostname", str().with(stringCheck(checkHostname))),
			opt("path", pathRewrite()),
			opt("hostToBackendHostname", boolean()),
		)),
		opt("requestMirror", object(
			opt("percentage", percent()),
			req("backendRef", backendRef()),
		)),
	).with(blocks.check)
}

func checkHostname(s string) string {
	if !isDNSSubdomain(s) {
		return "invalid hostname " + strconv.Quote(s) + ": must be a lowercase RFC 1123 hostname"
	}
	return ""
}

// backendRef is where a route sends traffic (Kuma's common BackendRef).
func backendRef() *Schema {
	return object(
		req("kind", enum(KindMeshService, KindMeshServiceSubset, KindMeshExternalService, "MeshMultiZoneService")),
		opt("name", nonEmptyStr()),
		opt("namespace", str()),
		opt("labels", stringMap()),
		opt("tags", tagMap()),
		opt("mesh", str()),
		opt("sectionName", str()),
		opt("port", port()),
		opt("weight", uint32Value().defaultInt("1")),
	).with(checkBackendRef)
}

func checkBackendRef(path string, v any, errs *ValidationError) {
	obj := v.(map[string]any)
	kind, _ := obj["kind"].(string)
	if len(present(obj, "name", "labels")) != 1 {
		errs.Add(path, "exactly one of name, labels must be set")
	}
	if kind == KindMeshServiceSubset && obj["tags"] == nil {
		errs.Add(joinPath(path, "tags"), "must be set with kind %s", kind)
	}
	if kind != KindMeshServiceSubset && obj["tags"] != nil {
		errs.Add(joinPath(path, "tags"), "must not be set with kind %s", kind)
	}
}

func headerMatch() *Schema {
	return object(
		opt("type", enum("Exact", "Present", "RegularExpression", "Absent", "Prefix").withDefault("Exact")),
		req("name", nonEmptyStr()),
		opt("value", str()),
	)
}

func headerKV() *Schema { return object(req("name", nonEmptyStr()), req("value", str())) }

func headerModifier() *Schema {
	return object(
		opt("set", listOf(headerKV())),
		opt("add", listOf(headerKV())),
		opt("remove", listOf(nonEmptyStr())),
	)
}
