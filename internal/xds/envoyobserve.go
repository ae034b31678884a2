package xds

import (
	"encoding/json"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	filelogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	celfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/filters/cel/v3"
	grpclogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	otellogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/open_telemetry/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	tracingv3 "github.com/envoyproxy/go-control-plane/envoy/type/tracing/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	otlpcommonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// Access logs and tracing for Envoy (docs/dataplane.md#envoy), as Kuma
// renders MeshAccessLog and MeshTrace:
//
//   - MeshAccessLog: an access log on the connection manager (HTTP) or the
//     TCP proxy of each inbound and outbound its entries reach. A file
//     backend is Envoy's file logger with the format (Kuma's default
//     format when none, its %KUMA_*% values filled in); a tcp backend is
//     the file logger writing {address, message} lines to the agent's
//     pipe, which sends each message to its address (meridian-dp does
//     this); an openTelemetry backend is Envoy's OpenTelemetry logger to
//     a cluster of the collector.
//   - MeshTrace: tracing on every HTTP connection manager (sampling,
//     custom tags plus kuma.mesh and kuma.zone, the provider) and a
//     cluster of the collector.

// Kuma's default access log formats.
const (
	defaultTCPLogFormat  = `[%START_TIME%] %RESPONSE_FLAGS% %KUMA_MESH% %KUMA_SOURCE_ADDRESS_WITHOUT_PORT%(%KUMA_SOURCE_SERVICE%)->%UPSTREAM_HOST%(%KUMA_DESTINATION_SERVICE%) took %DURATION%ms, sent %BYTES_SENT% bytes, received: %BYTES_RECEIVED% bytes`
	defaultHTTPLogFormat = `[%START_TIME%] %KUMA_MESH% "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-B3-TRACEID?X-DATADOG-TRACEID)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%KUMA_SOURCE_SERVICE%" "%KUMA_DESTINATION_SERVICE%" "%KUMA_SOURCE_ADDRESS_WITHOUT_PORT%" "%UPSTREAM_HOST%"`
	// serviceUnknown is the source service of an inbound's traffic.
	serviceUnknown = "unknown"
)

// logValues are what Kuma's %KUMA_*% format commands stand for on one
// listener.
type logValues struct {
	sourceService, sourceIP, destinationService, mesh, zone, direction string
}

func (v logValues) interpolate(format string) string {
	return strings.NewReplacer(
		"%KUMA_SOURCE_ADDRESS_WITHOUT_PORT%", v.sourceIP,
		"%KUMA_SOURCE_ADDRESS%", net.JoinHostPort(v.sourceIP, "0"),
		"%KUMA_SOURCE_SERVICE%", v.sourceService,
		"%KUMA_DESTINATION_SERVICE%", v.destinationService,
		"%KUMA_MESH%", v.mesh,
		"%KUMA_TRAFFIC_DIRECTION%", v.direction,
		"%KUMA_ZONE%", v.zone,
	).Replace(format)
}

func (e *envoyGen) inboundLogValues(inb Inbound) logValues {
	return logValues{sourceService: serviceUnknown, sourceIP: e.in.Dataplane.Address, destinationService: inb.Service(),
		mesh: e.in.Dataplane.Mesh, zone: e.in.Zone, direction: "INBOUND"}
}

func (e *envoyGen) outboundLogValues(svc string) logValues {
	return logValues{sourceService: e.ownService(), sourceIP: e.in.Dataplane.Address, destinationService: svc,
		mesh: e.in.Dataplane.Mesh, zone: e.in.Zone, direction: "OUTBOUND"}
}

// ownService is the service of the proxy's first inbound (Kuma's
// identifying name), "unknown" without inbounds.
func (e *envoyGen) ownService() string {
	for _, in := range e.in.Dataplane.Inbounds {
		if s := in.Service(); s != "" {
			return s
		}
	}
	return serviceUnknown
}

type meshAccessLogConf struct {
	Backends []struct {
		File *struct {
			Path   string     `json:"path"`
			Format *logFormat `json:"format"`
		} `json:"file"`
		TCP *struct {
			Address string     `json:"address"`
			Format  *logFormat `json:"format"`
		} `json:"tcp"`
		OpenTelemetry *struct {
			Endpoint   string `json:"endpoint"`
			Attributes []struct {
				Key   string `json:"key"`
				Value string `json:"value"`
			} `json:"attributes"`
			Body       json.RawMessage `json:"body"`
			BackendRef json.RawMessage `json:"backendRef"`
		} `json:"openTelemetry"`
	} `json:"backends"`
}

type logFormat struct {
	Plain *string `json:"plain"`
	JSON  []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"json"`
	OmitEmptyValues bool `json:"omitEmptyValues"`
}

// inboundAccessLogs are the access logs of an inbound: those of its
// MeshAccessLog rules, each filtered to the rule's clients. peerSAN says a
// filter reads the client's URI SANs from the filter state (the chain
// needs peerSANFilter).
func (e *envoyGen) inboundAccessLogs(cfg policy.InboundConfig, inb Inbound, listener string, http bool) (out []*accesslogv3.AccessLog, peerSAN bool, err error) {
	p, ok := cfg.Policies["MeshAccessLog"]
	if !ok {
		return nil, false, nil
	}
	defer func() { e.about = nil }()
	for _, r := range p.Rules {
		e.about = r.Origin
		var filter *accesslogv3.AccessLogFilter
		if len(r.Matchers) > 0 {
			var why string
			var fromState bool
			if filter, fromState, why = e.clientLogFilter(r); filter == nil {
				e.drop("MeshAccessLog for some clients of inbound %d: not rendered for Envoy: %s", cfg.Port, why)
				continue
			}
			peerSAN = peerSAN || fromState
		}
		logs, err := e.accessLogs("inbound "+strconv.Itoa(cfg.Port), r.Conf, e.inboundLogValues(inb), http)
		if err != nil {
			return nil, false, err
		}
		for _, l := range logs {
			l.Filter = filter
		}
		if len(logs) > 0 {
			e.shape(resourcev3.ListenerType, listener, e.carry(r.Origin))
		}
		out = append(out, logs...)
	}
	return out, peerSAN, nil
}

// outboundAccessLogs are the access logs of the outbound to svc.
func (e *envoyGen) outboundAccessLogs(svc string, policies map[string]*policy.OutboundPolicy, http bool) ([]*accesslogv3.AccessLog, [][]policy.Origin, error) {
	p, ok := policies["MeshAccessLog"]
	if !ok || p.Conf == nil {
		return nil, nil, nil
	}
	e.about = p.Origin
	defer func() { e.about = nil }()
	logs, err := e.accessLogs("the outbound to "+svc, p.Conf, e.outboundLogValues(svc), http)
	if err != nil || len(logs) == 0 {
		return nil, nil, err
	}
	return logs, e.carry(p.Origin), nil
}

// accessLogs renders a MeshAccessLog conf's backends on one listener.
func (e *envoyGen) accessLogs(where string, conf json.RawMessage, values logValues, http bool) ([]*accesslogv3.AccessLog, error) {
	var c meshAccessLogConf
	if err := json.Unmarshal(conf, &c); err != nil {
		e.drop("MeshAccessLog on %s: conf cannot be read: %v", where, err)
		return nil, nil
	}
	def := defaultTCPLogFormat
	if http {
		def = defaultHTTPLogFormat
	}
	var out []*accesslogv3.AccessLog
	for i, b := range c.Backends {
		var (
			name string
			cfg  proto.Message
		)
		switch {
		case b.File != nil:
			name, cfg = "envoy.access_loggers.file", &filelogv3.FileAccessLog{Path: b.File.Path,
				AccessLogFormat: &filelogv3.FileAccessLog_LogFormat{LogFormat: fileLogFormat(b.File.Format, def, values)}}
		case b.TCP != nil:
			if e.in.AccessLogPipe == "" {
				e.drop("MeshAccessLog backends[%d] (tcp) on %s: the proxy's agent has no access log pipe", i, where)
				continue
			}
			name, cfg = "envoy.access_loggers.file", &filelogv3.FileAccessLog{Path: e.in.AccessLogPipe,
				AccessLogFormat: &filelogv3.FileAccessLog_LogFormat{LogFormat: tcpLogFormat(b.TCP.Address, b.TCP.Format, def, values)}}
		case b.OpenTelemetry != nil:
			endpoint, problem := e.otelEndpoint(b.OpenTelemetry.Endpoint, b.OpenTelemetry.BackendRef)
			if endpoint == "" {
				e.drop("MeshAccessLog backends[%d] (openTelemetry) on %s: %s", i, where, problem)
				continue
			}
			cluster, ok := e.collector("meshaccesslog_"+cleanName(endpoint), endpoint, true)
			if !ok {
				e.drop("MeshAccessLog backends[%d] (openTelemetry) on %s: endpoint %q is not host:port", i, where, endpoint)
				continue
			}
			name, cfg = "envoy.access_loggers.open_telemetry", otelLog(b.OpenTelemetry.Body, b.OpenTelemetry.Attributes, cluster, def, values)
		default:
			continue
		}
		a, err := anyOf(cfg)
		if err != nil {
			return nil, err
		}
		out = append(out, &accesslogv3.AccessLog{Name: name, ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: a}})
	}
	return out, nil
}

func fileLogFormat(f *logFormat, def string, values logValues) *corev3.SubstitutionFormatString {
	switch {
	case f == nil:
		return plainFormat(values.interpolate(def+"\n"), false)
	case f.Plain != nil:
		return plainFormat(values.interpolate(*f.Plain+"\n"), f.OmitEmptyValues)
	default:
		return jsonFormat(jsonFields(f, values), f.OmitEmptyValues)
	}
}

// tcpLogFormat is a line the agent's pipe reads: where to send it and the
// message.
func tcpLogFormat(address string, f *logFormat, def string, values logValues) *corev3.SubstitutionFormatString {
	fields := map[string]*structpb.Value{"address": structpb.NewStringValue(address)}
	omit := false
	switch {
	case f == nil:
		fields["message"] = structpb.NewStringValue(values.interpolate(def + "\n"))
	case f.Plain != nil:
		fields["message"], omit = structpb.NewStringValue(values.interpolate(*f.Plain+"\n")), f.OmitEmptyValues
	default:
		fields["message"], omit = structpb.NewStructValue(&structpb.Struct{Fields: jsonFields(f, values)}), f.OmitEmptyValues
	}
	return jsonFormat(fields, omit)
}

func jsonFields(f *logFormat, values logValues) map[string]*structpb.Value {
	fields := map[string]*structpb.Value{}
	for _, kv := range f.JSON {
		fields[kv.Key] = structpb.NewStringValue(values.interpolate(kv.Value))
	}
	return fields
}

func plainFormat(s string, omit bool) *corev3.SubstitutionFormatString {
	return &corev3.SubstitutionFormatString{OmitEmptyValues: omit, Format: &corev3.SubstitutionFormatString_TextFormatSource{
		TextFormatSource: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: s}}}}
}

func jsonFormat(fields map[string]*structpb.Value, omit bool) *corev3.SubstitutionFormatString {
	return &corev3.SubstitutionFormatString{OmitEmptyValues: omit, Format: &corev3.SubstitutionFormatString_JsonFormat{
		JsonFormat: &structpb.Struct{Fields: fields}}}
}

// otelLog is Envoy's OpenTelemetry logger: the body (Kuma's default format
// when none; an OTLP AnyValue in JSON, else the text as a string) and the
// attributes.
func otelLog(body json.RawMessage, attrs []struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}, cluster, def string, values logValues) *otellogv3.OpenTelemetryAccessLogConfig {
	b := &otlpcommonv1.AnyValue{Value: &otlpcommonv1.AnyValue_StringValue{StringValue: values.interpolate(def)}}
	if len(body) > 0 && string(body) != "null" {
		parsed := &otlpcommonv1.AnyValue{}
		if protojson.Unmarshal(body, parsed) == nil {
			b = parsed
			interpolateAny(b, values)
		} else {
			var s string
			if json.Unmarshal(body, &s) != nil {
				s = string(body)
			}
			b = &otlpcommonv1.AnyValue{Value: &otlpcommonv1.AnyValue_StringValue{StringValue: values.interpolate(s)}}
		}
	}
	common := &grpclogv3.CommonGrpcAccessLogConfig{LogName: "MeshAccessLog", TransportApiVersion: corev3.ApiVersion_V3,
		GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster}}}}
	//lint:ignore SA1019 Kuma 2.14 writes common_config, which every Envoy it ships reads.
	out := &otellogv3.OpenTelemetryAccessLogConfig{Body: b, CommonConfig: common}
	if len(attrs) > 0 {
		out.Attributes = &otlpcommonv1.KeyValueList{}
		for _, kv := range attrs {
			out.Attributes.Values = append(out.Attributes.Values, &otlpcommonv1.KeyValue{Key: values.interpolate(kv.Key),
				Value: &otlpcommonv1.AnyValue{Value: &otlpcommonv1.AnyValue_StringValue{StringValue: values.interpolate(kv.Value)}}})
		}
	}
	return out
}

// cleanNameRE matches what Kuma's system names replace by '-'.
var cleanNameRE = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// cleanName is a system name part as Kuma writes it.
func cleanName(s string) string { return cleanNameRE.ReplaceAllString(s, "-") }

// collector records (once) the cluster system_<name> of an observability
// backend at endpoint (host:port, or a URL with one); ok is false when the
// endpoint names no port.
func (e *envoyGen) collector(name, endpoint string, http2 bool) (string, bool) {
	host, port, ok := endpointHostPort(endpoint)
	if !ok {
		return "", false
	}
	name = "system_" + name
	if e.rec != nil {
		e.rec.escapes = true // the collector is emitted apart from the fragment
	}
	if e.about != nil {
		e.collectorShapers[name] = append(e.collectorShapers[name], e.about)
	}
	if _, seen := e.collectors[name]; seen {
		return name, true
	}
	c := &clusterv3.Cluster{
		Name: name, ConnectTimeout: durationpb.New(defaultConnectTimeout),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}, DnsLookupFamily: clusterv3.Cluster_V4_ONLY,
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress(host, port)}}}}}}},
	}
	if net.ParseIP(host) != nil {
		c.ClusterDiscoveryType, c.DnsLookupFamily = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}, clusterv3.Cluster_AUTO
	}
	if http2 {
		opts, _ := anyOf(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
				Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts}
	}
	e.collectors[name] = c
	return name, true
}

// endpointHostPort reads host:port, or a URL's host and port (its
// scheme's default port when it names none).
func endpointHostPort(endpoint string) (string, int, bool) {
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		p, err := strconv.Atoi(port)
		return u.Hostname(), p, err == nil && p > 0 && p < 65536
	}
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return "", 0, false
	}
	p, err := strconv.Atoi(port)
	return host, p, err == nil && p > 0 && p < 65536 && host != ""
}

// emitCollectors adds the observability backends' clusters, by name.
func (e *envoyGen) emitCollectors() {
	names := make([]string, 0, len(e.collectors))
	for n := range e.collectors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e.out.Clusters = append(e.out.Clusters, e.collectors[n])
		e.shape(resourcev3.ClusterType, n, e.collectorShapers[n])
	}
}

type meshTraceConf struct {
	Backends []struct {
		Zipkin *struct {
			URL               string `json:"url"`
			TraceID128bit     bool   `json:"traceId128bit"`
			APIVersion        string `json:"apiVersion"`
			SharedSpanContext *bool  `json:"sharedSpanContext"`
		} `json:"zipkin"`
		Datadog *struct {
			URL          string `json:"url"`
			SplitService bool   `json:"splitService"`
		} `json:"datadog"`
		OpenTelemetry *struct {
			Endpoint   string          `json:"endpoint"`
			BackendRef json.RawMessage `json:"backendRef"`
		} `json:"openTelemetry"`
	} `json:"backends"`
	Sampling *struct {
		Overall any `json:"overall"`
		Client  any `json:"client"`
		Random  any `json:"random"`
	} `json:"sampling"`
	Tags []struct {
		Name    string  `json:"name"`
		Literal *string `json:"literal"`
		Header  *struct {
			Name    string  `json:"name"`
			Default *string `json:"default"`
		} `json:"header"`
	} `json:"tags"`
}

// tracing is MeshTrace on listener's HTTP connection manager: direction INBOUND
// or OUTBOUND, destination the outbound's service. nil: no tracing.
func (e *envoyGen) tracing(listener, direction, destination string) *hcmv3.HttpConnectionManager_Tracing {
	ap, ok := e.in.Config.Proxy["MeshTrace"]
	if !ok || ap.Conf == nil {
		return nil
	}
	var c meshTraceConf
	e.about = ap.Origin
	defer func() { e.about = nil }()
	if err := json.Unmarshal(ap.Conf, &c); err != nil {
		e.drop("MeshTrace (whole proxy): conf cannot be read: %v", err)
		return nil
	}
	if len(c.Backends) == 0 {
		return nil
	}
	t := &hcmv3.HttpConnectionManager_Tracing{SpawnUpstreamSpan: wrapperspb.Bool(false)}
	if s := c.Sampling; s != nil {
		t.OverallSampling, t.ClientSampling, t.RandomSampling = percent(s.Overall), percent(s.Client), percent(s.Random)
	}
	for _, tag := range c.Tags {
		switch {
		case tag.Literal != nil:
			t.CustomTags = append(t.CustomTags, literalTag(tag.Name, *tag.Literal))
		case tag.Header != nil:
			h := &tracingv3.CustomTag_Header{Name: tag.Header.Name}
			if tag.Header.Default != nil {
				h.DefaultValue = *tag.Header.Default
			}
			t.CustomTags = append(t.CustomTags, &tracingv3.CustomTag{Tag: tag.Name, Type: &tracingv3.CustomTag_RequestHeader{RequestHeader: h}})
		}
	}
	t.CustomTags = append(t.CustomTags, literalTag("kuma.mesh", e.in.Dataplane.Mesh), literalTag("kuma.zone", e.in.Zone))
	provider, ok := e.tracingProvider(c, direction, destination)
	if !ok {
		return nil
	}
	t.Provider = provider
	e.traced = true
	e.shape(resourcev3.ListenerType, listener, e.carry(ap.Origin))
	return t
}

func (e *envoyGen) tracingProvider(c meshTraceConf, direction, destination string) (*tracev3.Tracing_Http, bool) {
	b := c.Backends[0]
	var (
		name, cluster string
		cfg           proto.Message
		ok            bool
	)
	switch {
	case b.Zipkin != nil:
		cluster, ok = e.collector("meshtrace_zipkin_"+cleanName(b.Zipkin.URL), b.Zipkin.URL, false)
		if !ok {
			break
		}
		u, _ := url.Parse(b.Zipkin.URL)
		version := tracev3.ZipkinConfig_HTTP_JSON
		if b.Zipkin.APIVersion == "httpProto" {
			version = tracev3.ZipkinConfig_HTTP_PROTO
		}
		shared := b.Zipkin.SharedSpanContext == nil || *b.Zipkin.SharedSpanContext
		name, cfg = "envoy.tracers.zipkin", &tracev3.ZipkinConfig{CollectorCluster: cluster, CollectorEndpoint: u.Path,
			CollectorEndpointVersion: version, CollectorHostname: u.Host, SharedSpanContext: wrapperspb.Bool(shared), TraceId_128Bit: b.Zipkin.TraceID128bit}
	case b.Datadog != nil:
		cluster, ok = e.collector("meshtrace_datadog_"+cleanName(b.Datadog.URL), b.Datadog.URL, false)
		service := e.ownService()
		if b.Datadog.SplitService {
			service += "_" + direction
			if direction == "OUTBOUND" {
				service += "_" + destination
			}
		}
		name, cfg = "envoy.tracers.datadog", &tracev3.DatadogConfig{CollectorCluster: cluster, ServiceName: service}
	case b.OpenTelemetry != nil:
		endpoint, problem := e.otelEndpoint(b.OpenTelemetry.Endpoint, b.OpenTelemetry.BackendRef)
		if endpoint == "" {
			e.drop("MeshTrace (whole proxy): %s", problem)
			return nil, false
		}
		cluster, ok = e.collector("meshtrace_otel_"+cleanName(endpoint), endpoint, true)
		name, cfg = "envoy.tracers.opentelemetry", &tracev3.OpenTelemetryConfig{ServiceName: e.ownService(),
			GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster}}}}
	}
	if !ok {
		e.drop("MeshTrace (whole proxy): the backend's address cannot be read")
		return nil, false
	}
	a, err := anyOf(cfg)
	if err != nil {
		return nil, false
	}
	return &tracev3.Tracing_Http{Name: name, ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: a}}, true
}

func literalTag(name, value string) *tracingv3.CustomTag {
	return &tracingv3.CustomTag{Tag: name, Type: &tracingv3.CustomTag_Literal_{Literal: &tracingv3.CustomTag_Literal{Value: value}}}
}

// percent is a sampling percentage (a number or a decimal string); nil
// when unset or unreadable.
func percent(v any) *typev3.Percent {
	if v == nil {
		return nil
	}
	f, ok := number(v)
	if !ok {
		return nil
	}
	return &typev3.Percent{Value: f}
}

// interpolateAny fills in Kuma's %KUMA_*% values in an OTLP value's
// strings and keys, as Kuma does.
func interpolateAny(v *otlpcommonv1.AnyValue, values logValues) {
	switch x := v.GetValue().(type) {
	case *otlpcommonv1.AnyValue_StringValue:
		x.StringValue = values.interpolate(x.StringValue)
	case *otlpcommonv1.AnyValue_ArrayValue:
		for _, e := range x.ArrayValue.GetValues() {
			interpolateAny(e, values)
		}
	case *otlpcommonv1.AnyValue_KvlistValue:
		for _, kv := range x.KvlistValue.GetValues() {
			kv.Key = values.interpolate(kv.Key)
			if kv.Value != nil {
				interpolateAny(kv.Value, values)
			}
		}
	}
}

// clientLogFilter is an access log filter for a rule's clients: a CEL
// expression. A rule naming clients by their service is rendered as Kuma
// 2.14 renders it, on the client certificate's URI SAN (Envoy's
// connection.uri_san_peer_certificate, its first one: the client's first
// service, spiffe://<mesh>/<service>). A rule naming other tags reads
// every URI SAN of the client certificate from the filter state
// peerSANFilter keeps (fromState), as the rate limit routes do. Without
// mTLS there is no identity: nil, and why.
func (e *envoyGen) clientLogFilter(r policy.Rule) (filter *accesslogv3.AccessLogFilter, fromState bool, why string) {
	if !e.in.MTLS {
		return nil, false, "the mesh has no mTLS to tell clients apart"
	}
	for _, m := range r.Matchers {
		fromState = fromState || m.Key != resource.ServiceTag
	}
	var terms []string
	for _, m := range r.Matchers {
		id := policy.IdentityOf(e.in.Dataplane.Mesh, m.Key, m.Value)
		var term string
		if fromState {
			term = "string(filter_state[" + strconv.Quote(peerSANState) + "]).matches(" + strconv.Quote(`(^|,)`+regexp.QuoteMeta(id)+`(,|$)`) + ")"
			if m.Not {
				term = "!" + term
			}
		} else {
			op := "=="
			if m.Not {
				op = "!="
			}
			term = "connection.uri_san_peer_certificate " + op + " " + strconv.Quote(id)
		}
		terms = append(terms, term)
	}
	if fromState {
		// A client without a certificate has no such state.
		terms = append([]string{strconv.Quote(peerSANState) + " in filter_state"}, terms...)
	}
	cel, err := anyOf(&celfilterv3.ExpressionFilter{Expression: strings.Join(terms, " && ")})
	if err != nil {
		return nil, false, err.Error()
	}
	return &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_ExtensionFilter{ExtensionFilter: &accesslogv3.ExtensionFilter{
		Name: "envoy.access_loggers.extension_filters.cel", ConfigType: &accesslogv3.ExtensionFilter_TypedConfig{TypedConfig: cel}}}}, fromState, ""
}
