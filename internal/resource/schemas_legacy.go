package resource

// Schemas of the legacy source/destination policies, following Kuma's
// api/mesh/v1alpha1 protobufs. Their spec is {sources, destinations, conf}
// or {selectors, conf}; conf is described per type below.

// legacySpec builds the whole spec schema of a legacy policy from its shape.
// A nil conf means the type has no conf (TrafficPermission).
func legacySpec(shape Shape, conf *Schema) *Schema {
	fields := []field{req("sources", selectors()), req("destinations", selectors())}
	if shape == ShapeLegacySelectors {
		fields = []field{req("selectors", selectors())}
	}
	if conf != nil {
		fields = append(fields, opt("conf", conf))
	}
	return object(fields...)
}

// selectors is a non-empty list of {match: tags}; every match names a
// service, as Kuma requires.
func selectors() *Schema {
	return nonEmptyList(object(req("match", tagMap().with(nonEmptyMap, requireTag(ServiceTag)))))
}

// ServiceTag is the tag naming a Dataplane's service.
const ServiceTag = "kuma.io/service"

func nonEmptyMap(path string, v any, errs *ValidationError) {
	if len(v.(map[string]any)) == 0 {
		errs.Add(path, "must have at least one tag")
	}
}

// trafficPermissionConf: TrafficPermission has no conf.
func trafficPermissionConf() *Schema { return nil }

func trafficRouteConf() *Schema {
	split := func() *Schema {
		return nonEmptyList(object(req("weight", uint32Value()), req("destination", tagMap().with(requireTag(ServiceTag)))))
	}
	return object(
		opt("split", split()),
		opt("destination", tagMap().with(requireTag(ServiceTag))),
		opt("loadBalancer", object(
			opt("roundRobin", object()),
			opt("leastRequest", object(opt("choiceCount", integer(2, 1<<32-1)))),
			opt("ringHash", object(
				opt("hashFunction", enum("XX_HASH", "MURMUR_HASH_2")),
				opt("minRingSize", integer(1, 8000000)),
				opt("maxRingSize", integer(1, 8000000)),
			)),
			opt("random", object()),
			opt("maglev", object()),
		).with(atMostOneOf("roundRobin", "leastRequest", "ringHash", "random", "maglev"))),
		// Per-request routing rules; Envoy-level details stay opaque.
		opt("http", listOf(openObject(
			opt("split", split()),
			opt("destination", tagMap()),
		))),
	).with(exactlyOneOf("split", "destination"))
}

func trafficLogConf() *Schema   { return object(opt("backend", str())) }
func trafficTraceConf() *Schema { return object(opt("backend", str())) }

func healthCheckConf() *Schema {
	return object(
		req("interval", positiveDuration()),
		req("timeout", positiveDuration()),
		req("unhealthyThreshold", integer(1, 1<<32-1)),
		req("healthyThreshold", integer(1, 1<<32-1)),
		opt("initialJitter", duration()),
		opt("intervalJitter", duration()),
		opt("intervalJitterPercent", integer(0, 100)),
		opt("healthyPanicThreshold", percent()),
		opt("failTrafficOnPanic", boolean()),
		opt("eventLogPath", str()),
		opt("alwaysLogHealthCheckFailures", boolean()),
		opt("noTrafficInterval", positiveDuration()),
		opt("reuseConnection", boolean()),
		opt("tcp", object(opt("send", str()), opt("receive", listOf(str())))),
		opt("http", object(
			req("path", nonEmptyStr()),
			opt("requestHeadersToAdd", listOf(anyValue())),
			opt("expectedStatuses", listOf(httpStatus())),
		)),
	)
}

func circuitBreakerConf() *Schema {
	consecutive := func() *Schema { return object(opt("consecutive", uint32Value())) }
	return object(
		opt("interval", positiveDuration()),
		opt("baseEjectionTime", positiveDuration()),
		opt("maxEjectionPercent", integer(0, 100)),
		opt("splitExternalAndLocalErrors", boolean()),
		opt("detectors", object(
			opt("totalErrors", consecutive()),
			opt("gatewayErrors", consecutive()),
			opt("localErrors", consecutive()),
			opt("standardDeviation", object(
				opt("requestVolume", uint32Value()),
				opt("minimumHosts", uint32Value()),
				opt("factor", number()),
			)),
			opt("failure", object(
				opt("requestVolume", uint32Value()),
				opt("minimumHosts", uint32Value()),
				opt("threshold", integer(0, 100)),
			)),
		)),
		opt("thresholds", object(
			opt("maxConnections", uint32Value()),
			opt("maxPendingRequests", uint32Value()),
			opt("maxRetries", uint32Value()),
			opt("maxRequests", uint32Value()),
		)),
	)
}

func faultInjectionConf() *Schema {
	return object(
		opt("abort", object(req("httpStatus", httpStatus()), req("percentage", percent()))),
		opt("delay", object(req("value", positiveDuration()), req("percentage", percent()))),
		opt("responseBandwidth", object(
			req("limit", str().with(stringCheck(checkBandwidth))),
			req("percentage", percent()),
		)),
	).with(atLeastOneOf("abort", "delay", "responseBandwidth"))
}

func retryConf() *Schema {
	backOff := func() *Schema {
		return object(req("baseInterval", positiveDuration()), opt("maxInterval", positiveDuration()))
	}
	return object(
		opt("http", object(
			opt("numRetries", uint32Value()),
			opt("perTryTimeout", duration()),
			opt("backOff", backOff()),
			opt("retriableStatusCodes", listOf(httpStatus())),
			opt("retriableMethods", listOf(enum("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"))),
			opt("retryOn", listOf(enum("all_5xx", "gateway_error", "reset", "connect_failure", "envoy_ratelimited",
				"retriable_4xx", "refused_stream", "retriable_status_codes", "retriable_headers", "http3_post_connect_failure"))),
		)),
		opt("grpc", object(
			opt("retryOn", listOf(enum("cancelled", "deadline_exceeded", "internal", "resource_exhausted", "unavailable"))),
			opt("numRetries", uint32Value()),
			opt("perTryTimeout", duration()),
			opt("backOff", backOff()),
		)),
		opt("tcp", object(opt("maxConnectAttempts", uint32Value()))),
	).with(atLeastOneOf("http", "grpc", "tcp"))
}

func timeoutConf() *Schema {
	return object(
		opt("connectTimeout", positiveDuration()),
		opt("tcp", object(opt("idleTimeout", duration()))),
		opt("http", object(
			opt("requestTimeout", duration()),
			opt("idleTimeout", duration()),
			opt("streamIdleTimeout", duration()),
			opt("maxStreamDuration", duration()),
		)),
		opt("grpc", object(
			opt("streamIdleTimeout", duration()),
			opt("maxStreamDuration", duration()),
		)),
	)
}

func rateLimitConf() *Schema {
	return object(req("http", object(
		req("requests", integer(1, 1<<32-1)),
		req("interval", positiveDuration()),
		opt("onRateLimit", object(
			opt("status", httpStatus()),
			opt("headers", listOf(object(req("key", nonEmptyStr()), req("value", str()), opt("append", boolean())))),
		)),
	)))
}

func proxyTemplateConf() *Schema {
	ops := []string{"add", "remove", "patch", "addFirst", "addBefore", "addAfter", "addLast"}
	mod := func() *Schema {
		// Modifications carry Envoy resources; only the operation is ours.
		return openObject(req("operation", enum(ops...)), opt("value", str()), opt("match", anyValue()))
	}
	return object(
		opt("imports", listOf(nonEmptyStr())),
		opt("resources", listOf(object(
			req("name", nonEmptyStr()),
			req("version", str()),
			req("resource", nonEmptyStr()),
		))),
		opt("modifications", listOf(object(
			opt("cluster", mod()),
			opt("listener", mod()),
			opt("networkFilter", mod()),
			opt("httpFilter", mod()),
			opt("virtualHost", mod()),
		).with(exactlyOneOf("cluster", "listener", "networkFilter", "httpFilter", "virtualHost")))),
	)
}
