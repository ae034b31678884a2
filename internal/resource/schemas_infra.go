package resource

import (
	"encoding/base64"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Spec schemas of the infrastructure types. Where Kuma's structure is deep
// and only plugins read it (CA backend confs, constraints, Envoy probes), the
// block is opaque: its keys are not ours to check.

// openSpec accepts any spec (ZoneInsight is written by the control plane).
func openSpec() *Schema { return anyValue() }

func zoneSpec() *Schema { return object(opt("enabled", boolean())) }

// MaxSecretBytes bounds a Secret's decoded data.
const MaxSecretBytes = 64 << 10

// secretSpec is Kuma's Secret and GlobalSecret: base64 data.
func secretSpec() *Schema {
	return object(req("data", nonEmptyStr().with(stringCheck(checkSecretData))))
}

func checkSecretData(s string) string {
	b, err := base64.StdEncoding.DecodeString(s)
	switch {
	case err != nil:
		return "must be base64 (standard encoding, padded)"
	case len(b) > MaxSecretBytes:
		return fmt.Sprintf("%d bytes decoded, at most %d", len(b), MaxSecretBytes)
	}
	return ""
}

func meshSpec() *Schema {
	backends := func(extra ...field) *Schema {
		fields := append([]field{req("name", nonEmptyStr()), opt("type", nonEmptyStr()), opt("conf", anyValue())}, extra...)
		return listOf(object(fields...))
	}
	return object(
		opt("mtls", object(
			opt("enabledBackend", str()),
			opt("backends", backends(
				opt("dpCert", object(
					opt("rotation", object(opt("expiration", positiveDuration()))),
					opt("requestTimeout", positiveDuration()),
				)),
				opt("mode", enum("STRICT", "PERMISSIVE")),
				opt("rootChain", anyValue()),
			)),
			opt("skipValidation", boolean()),
		).with(backendNamed("enabledBackend"))),
		opt("logging", object(
			opt("defaultBackend", str()),
			opt("backends", backends(opt("format", str()))),
		).with(backendNamed("defaultBackend"))),
		opt("tracing", object(
			opt("defaultBackend", str()),
			opt("backends", backends(opt("sampling", percent()))),
		).with(backendNamed("defaultBackend"))),
		opt("metrics", object(
			opt("enabledBackend", str()),
			opt("backends", backends()),
		).with(backendNamed("enabledBackend"))),
		opt("networking", object(opt("outbound", object(opt("passthrough", boolean()))))),
		opt("routing", object(
			opt("localityAwareLoadBalancing", boolean()),
			opt("zoneEgress", boolean()),
			opt("defaultForbidMeshExternalServiceAccess", boolean()),
		)),
		opt("constraints", anyValue()),
		opt("meshServices", object(opt("mode", enum("Disabled", "Everywhere", "ReachableBackends", "Exclusive")))),
		opt("skipCreatingInitialPolicies", listOf(str())),
	)
}

// backendNamed checks that a Mesh section's enabled/default backend names
// one of its backends, so a typo does not silently disable mTLS or metrics.
func backendNamed(key string) checkFunc {
	return func(path string, v any, errs *ValidationError) {
		obj := v.(map[string]any)
		want, _ := obj[key].(string)
		if want == "" {
			return
		}
		list, _ := obj["backends"].([]any)
		for _, b := range list {
			if m, ok := b.(map[string]any); ok && m["name"] == want {
				return
			}
		}
		errs.Add(joinPath(path, key), "no backend named %q", want)
	}
}

func dataplaneSpec() *Schema {
	serviceTags := func() *Schema { return tagMap().with(requireTag(ServiceTag)) }
	inbound := object(
		req("port", port()),
		opt("servicePort", port()),
		opt("serviceAddress", str().with(stringCheck(checkAddress))),
		opt("address", str().with(stringCheck(checkAddress))),
		req("tags", serviceTags()),
		opt("name", str()),
		opt("state", enum("Ready", "NotReady", "Ignored")),
		opt("health", object(opt("ready", boolean()))),
		opt("serviceProbe", object(
			opt("interval", positiveDuration()),
			opt("timeout", positiveDuration()),
			opt("unhealthyThreshold", uint32Value()),
			opt("healthyThreshold", uint32Value()),
			opt("tcp", object()),
		)),
	)
	outbound := object(
		req("port", port()),
		opt("address", str().with(stringCheck(checkAddress))),
		opt("tags", tagMap()),
		opt("service", nonEmptyStr()), // deprecated spelling of tags[kuma.io/service]
		opt("backendRef", object(
			req("kind", enum(KindMeshService, KindMeshExternalService, "MeshMultiZoneService")),
			req("name", nonEmptyStr()),
			opt("port", port()),
			opt("labels", stringMap()),
		)),
	).with(checkOutboundTarget)
	listener := object(
		req("type", enum("ZoneIngress", "ZoneEgress")),
		opt("address", str().with(stringCheck(checkAddress))),
		req("port", port()),
		opt("name", str()),
		opt("state", enum("Ready", "NotReady")),
	)
	networking := object(
		req("address", nonEmptyStr().with(stringCheck(checkAddress))),
		opt("listeners", listOf(listener)),
		opt("advertisedAddress", str().with(stringCheck(checkAddress))),
		opt("advertisedPort", port()),
		opt("inbound", listOf(inbound)),
		opt("outbound", listOf(outbound)),
		opt("gateway", object(req("tags", serviceTags()), opt("type", enum("DELEGATED", "BUILTIN")))),
		opt("admin", object(opt("port", port()))),
		opt("transparentProxying", openObject(
			opt("redirectPortInbound", port()),
			opt("redirectPortOutbound", port()),
			opt("directAccessServices", listOf(str())),
			opt("reachableServices", listOf(str())),
			opt("ipFamilyMode", enum("DualStack", "IPv4", "IPv6")),
		)),
	).with(checkDataplaneRole)
	return object(req("networking", networking), opt("metrics", anyValue()), opt("probes", anyValue()))
}

// checkOutboundTarget: an outbound names its service by tag, by the
// deprecated service field, or by a backendRef.
func checkOutboundTarget(path string, v any, errs *ValidationError) {
	obj := v.(map[string]any)
	tags, _ := obj["tags"].(map[string]any)
	if tags[ServiceTag] == nil && obj["service"] == nil && obj["backendRef"] == nil {
		errs.Add(path, "must name its service: tags[%q], service or backendRef", ServiceTag)
	}
}

// checkDataplaneRole: a Dataplane is either a gateway or serves inbounds.
func checkDataplaneRole(path string, v any, errs *ValidationError) {
	obj := v.(map[string]any)
	inbounds, _ := obj["inbound"].([]any)
	switch _, gw := obj["gateway"].(map[string]any); {
	case gw && len(inbounds) > 0:
		errs.Add(joinPath(path, "inbound"), "must not be set together with gateway")
	case !gw && len(inbounds) == 0 && obj["listeners"] == nil:
		errs.Add(path, "must have at least one inbound, a listener or a gateway")
	}
}

// checkAddress accepts an IP address or a DNS name.
func checkAddress(s string) string {
	if net.ParseIP(s) != nil || isDNSSubdomain(s) {
		return ""
	}
	return "invalid address " + strconv.Quote(s) + ": must be an IP address or a hostname"
}

func meshServiceSpec() *Schema {
	return object(
		opt("selector", object(
			opt("dataplaneTags", tagMap()),
			opt("dataplaneRef", object(req("name", nonEmptyStr()))),
		).with(atMostOneOf("dataplaneTags", "dataplaneRef"))),
		opt("ports", listOf(object(
			req("port", port()),
			opt("targetPort", anyValue().with(checkPortOrName)),
			opt("appProtocol", nonEmptyStr()),
			opt("name", str()),
		))),
		opt("identities", listOf(object(
			req("type", enum("ServiceTag", "SpiffeID")),
			req("value", nonEmptyStr()),
		))),
		opt("state", enum("Available", "Unavailable")),
	)
}

// meshMultiZoneServiceSpec: Kuma's MeshMultiZoneService, a service made of
// the MeshServices of several zones, selected by labels.
func meshMultiZoneServiceSpec() *Schema {
	return object(
		req("selector", object(req("meshService", object(req("matchLabels", stringMap()))))),
		req("ports", nonEmptyList(object(
			req("port", port()),
			opt("name", str()),
			opt("appProtocol", nonEmptyStr()),
		))),
	)
}

// labelSelector is Kubernetes' LabelSelector.
func labelSelector() *Schema {
	return object(
		opt("matchLabels", stringMap()),
		opt("matchExpressions", listOf(object(
			req("key", nonEmptyStr()),
			req("operator", enum("In", "NotIn", "Exists", "DoesNotExist")),
			opt("values", listOf(str())),
		))),
	)
}

// meshIdentitySpec: Kuma 2.12+'s MeshIdentity, which Dataplanes get which
// SPIFFE identity from which provider. The providers' blocks are theirs to
// check (opaque here).
func meshIdentitySpec() *Schema {
	return object(
		opt("selector", object(opt("dataplane", labelSelector()))),
		opt("spiffeID", object(opt("trustDomain", nonEmptyStr()), opt("path", nonEmptyStr()))),
		opt("provider", object(
			req("type", enum("Bundled", "Spire", "Extension")),
			opt("bundled", anyValue()),
			opt("spire", anyValue()),
			opt("extension", anyValue()),
		)),
	)
}

// meshTrustSpec: Kuma 2.12+'s MeshTrust, the CA bundles of a trust domain.
func meshTrustSpec() *Schema {
	return object(
		opt("origin", object(opt("kri", nonEmptyStr()))),
		req("trustDomain", nonEmptyStr()),
		req("caBundles", listOf(object(
			req("type", enum("Pem")),
			opt("pem", object(req("value", nonEmptyStr()))),
		))),
	)
}

// meshOpenTelemetryBackendSpec: Kuma 2.14's shared OpenTelemetry collector,
// which MeshAccessLog, MeshTrace and MeshMetric backends reference by
// labels. Everything is optional: an empty spec is the node-local default
// (port 4317, gRPC). A path is for an HTTP collector only.
func meshOpenTelemetryBackendSpec() *Schema {
	return object(
		opt("endpoint", object(
			opt("address", nonEmptyStr().with(stringCheck(checkAddress))),
			opt("port", port()),
			opt("path", str()),
		)),
		opt("protocol", enum("grpc", "http")),
		opt("env", object(
			opt("mode", enum("Disabled", "Optional", "Required")),
			opt("precedence", enum("ExplicitFirst", "EnvFirst")),
			opt("allowSignalOverrides", boolean()),
		)),
	).with(checkCollectorPath)
}

// checkCollectorPath: endpoint.path prefixes an HTTP collector's signal
// paths (/v1/traces, ...): it starts with "/", has no query or fragment,
// and is not set for gRPC (the default protocol).
func checkCollectorPath(path string, v any, errs *ValidationError) {
	obj := v.(map[string]any)
	endpoint, _ := obj["endpoint"].(map[string]any)
	p, _ := endpoint["path"].(string)
	if p == "" {
		return
	}
	at := joinPath(joinPath(path, "endpoint"), "path")
	switch protocol, _ := obj["protocol"].(string); {
	case protocol != "http":
		errs.Add(at, "must not be set when protocol is grpc")
	case !strings.HasPrefix(p, "/"):
		errs.Add(at, "invalid path %q: must start with /", p)
	case strings.ContainsAny(p, "?#"):
		errs.Add(at, "invalid path %q: must not contain a query or fragment", p)
	}
}

// externalServiceSpec: Kuma's legacy ExternalService (Universal shape:
// networking and tags at the top level).
func externalServiceSpec() *Schema {
	dataSource := func() *Schema {
		return object(opt("secret", nonEmptyStr()), opt("file", nonEmptyStr()), opt("inline", nonEmptyStr()),
			opt("inlineString", nonEmptyStr())).with(atMostOneOf("secret", "file", "inline", "inlineString"))
	}
	return object(
		req("networking", object(
			req("address", nonEmptyStr().with(stringCheck(checkHostPort))),
			opt("tls", object(
				opt("enabled", boolean()),
				opt("caCert", dataSource()),
				opt("clientCert", dataSource()),
				opt("clientKey", dataSource()),
				opt("allowRenegotiation", boolean()),
				opt("serverName", nonEmptyStr()),
				opt("skipHostnameVerification", boolean()),
			)),
			opt("disableHostDNSEntry", boolean()),
		)),
		req("tags", tagMap().with(requireTag(ServiceTag))),
	)
}

// checkHostPort: an ExternalService address is host:port.
func checkHostPort(s string) string {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Sprintf("invalid address %q: must be host:port", s)
	}
	if p, err := strconv.Atoi(portStr); err != nil || p < 1 || p > 65535 {
		return fmt.Sprintf("invalid address %q: port must be 1-65535", s)
	}
	return checkAddress(host)
}

// checkPortOrName: Kubernetes' IntOrString target port.
func checkPortOrName(path string, v any, errs *ValidationError) {
	switch x := v.(type) {
	case string:
		if x == "" {
			errs.Add(path, "must not be empty")
		}
	default:
		port().validate(path, v, errs)
	}
}

func meshExternalServiceSpec() *Schema {
	return object(
		req("match", object(
			opt("type", enum("HostnameGenerator")),
			req("port", port()),
			opt("protocol", enum("tcp", "grpc", "http", "http2")),
		)),
		opt("endpoints", listOf(object(
			req("address", nonEmptyStr().with(stringCheck(checkEndpointAddress))),
			opt("port", port()),
		))),
		opt("extension", object(req("type", nonEmptyStr()), opt("config", anyValue()))),
		opt("tls", object(
			opt("enabled", boolean()),
			opt("allowRenegotiation", boolean()),
			opt("version", object(opt("min", tlsVersion()), opt("max", tlsVersion()))),
			opt("verification", object(
				opt("mode", enum("SkipSAN", "SkipCA", "Secured", "SkipAll")),
				opt("serverName", str()),
				opt("subjectAltNames", listOf(object(
					opt("type", enum("Exact", "Prefix")),
					req("value", nonEmptyStr()),
				))),
				opt("caCert", anyValue()),
				opt("clientCert", anyValue()),
				opt("clientKey", anyValue()),
			)),
		)),
	)
}

func tlsVersion() *Schema { return enum("TLSAuto", "TLS10", "TLS11", "TLS12", "TLS13") }

// checkEndpointAddress also allows a unix socket path, as Kuma does.
func checkEndpointAddress(s string) string {
	if len(s) > len("unix://") && s[:len("unix://")] == "unix://" {
		return ""
	}
	return checkAddress(s)
}

func meshGatewaySpec() *Schema {
	listener := object(
		opt("hostname", str()),
		req("port", port()),
		req("protocol", enum("HTTP", "HTTPS", "TCP", "TLS")),
		opt("tls", object(
			opt("mode", enum("TERMINATE", "PASSTHROUGH")),
			opt("certificates", listOf(anyValue())),
			opt("options", anyValue()),
		)),
		opt("tags", tagMap()),
		opt("crossMesh", boolean()),
		opt("resources", object(opt("connectionLimit", uint32Value()))),
	)
	return object(
		req("selectors", selectors()),
		req("conf", object(req("listeners", nonEmptyList(listener)))),
		opt("tags", tagMap()),
	)
}

// zoneCertificateRequestSpec: a zone's CSR for its intermediate CA of a
// mesh's CA backend (the key stays in the zone).
func zoneCertificateRequestSpec() *Schema {
	return object(req("backend", nonEmptyStr()), req("csr", nonEmptyStr()))
}

// zoneCertificateSpec: the global's answer, the zone's intermediate and the
// mesh's root.
func zoneCertificateSpec() *Schema {
	return object(req("backend", nonEmptyStr()), req("certificate", nonEmptyStr()), req("root", nonEmptyStr()))
}

// MaxZoneEndpoints bounds the endpoints one summary lists.
const MaxZoneEndpoints = 10000

// zoneEndpointsSpec: the endpoints of one service in one zone, as the other
// zones' proxies reach them: address, port, health and the inbound's tags.
func zoneEndpointsSpec() *Schema {
	endpoint := object(
		req("address", nonEmptyStr().with(stringCheck(checkAddress))),
		req("port", port()),
		opt("healthy", boolean()),
		opt("tags", tagMap()),
	)
	return object(
		req("service", nonEmptyStr()),
		opt("endpoints", listOf(endpoint).with(func(path string, v any, errs *ValidationError) {
			if len(v.([]any)) > MaxZoneEndpoints {
				errs.Add(path, "must have at most %d items", MaxZoneEndpoints)
			}
		})),
	)
}

// meshCASpec: a mesh CA backend's root certificate and key.
func meshCASpec() *Schema {
	return object(req("certificate", nonEmptyStr()), req("key", nonEmptyStr()))
}

// zoneCASpec: a zone's key for its intermediate of a mesh CA backend, and
// the CSR it sent.
func zoneCASpec() *Schema {
	return object(req("key", nonEmptyStr()), req("csr", nonEmptyStr()))
}
