package resource

import (
	"testing"
)

// TestConfDefaults: every default Kuma's API schema declares for a
// supported policy type is filled inside the objects present, never
// creating a parent, never replacing a value, never changing the input.
func TestConfDefaults(t *testing.T) {
	reg := NewDefaultRegistry()
	cases := []struct{ typ, in, want string }{
		{"MeshTrace", `{"backends":[{"type":"Zipkin","zipkin":{"url":"http://z:9411"}}]}`,
			`{"backends":[{"type":"Zipkin","zipkin":{"apiVersion":"httpJson","sharedSpanContext":true,"traceId128bit":false,"url":"http://z:9411"}}]}`},
		{"MeshTrace", `{"backends":[{"zipkin":{"url":"u","apiVersion":"httpProto","sharedSpanContext":false}}]}`,
			`{"backends":[{"zipkin":{"apiVersion":"httpProto","sharedSpanContext":false,"traceId128bit":false,"url":"u"}}]}`},
		{"MeshTrace", `{"backends":[{"datadog":{"url":"u"}}]}`, `{"backends":[{"datadog":{"splitService":false,"url":"u"}}]}`},
		{"MeshTrace", `{"sampling":{"overall":50}}`, `{"sampling":{"overall":50}}`},
		{"MeshAccessLog", `{"backends":[{"file":{"path":"/l","format":{"plain":"x"}}},{"openTelemetry":{"backendRef":{"kind":"MeshOpenTelemetryBackend"}}}]}`,
			`{"backends":[{"file":{"format":{"omitEmptyValues":false,"plain":"x"},"path":"/l"}},{"openTelemetry":{"backendRef":{"kind":"MeshOpenTelemetryBackend"},"endpoint":""}}]}`},
		{"MeshMetric", `{"applications":[{"port":8080}],"backends":[{"type":"Prometheus","prometheus":{"tls":{}}}]}`,
			`{"applications":[{"path":"/metrics","port":8080}],"backends":[{"prometheus":{"path":"/metrics","port":5670,"tls":{"mode":"Disabled"}},"type":"Prometheus"}]}`},
		{"MeshPassthrough", `{"appendMatch":[{"type":"Domain","value":"a.b"}]}`, `{"appendMatch":[{"protocol":"tcp","type":"Domain","value":"a.b"}]}`},
		{"MeshTLS", `{"tlsVersion":{"min":"TLS12"}}`, `{"tlsVersion":{"max":"TLSAuto","min":"TLS12"}}`},
		{"MeshTLS", `{"mode":"Strict"}`, `{"mode":"Strict"}`},
		{"MeshRetry", `{"http":{"hostSelection":[{"predicate":"OmitPreviousHosts"}],"retriableRequestHeaders":[{"name":"x"}]}}`,
			`{"http":{"hostSelection":[{"predicate":"OmitPreviousHosts","updateFrequency":2}],"retriableRequestHeaders":[{"name":"x","type":"Exact"}]}}`},
		{"MeshHTTPRoute", `{"matches":[{"headers":[{"name":"h","value":"v"}]}],"default":{"backendRefs":[{"kind":"MeshService","name":"b"}],"filters":[{"type":"RequestRedirect","requestRedirect":{"scheme":"https"}},{"type":"RequestMirror","requestMirror":{"backendRef":{"kind":"MeshService","name":"m","weight":3}}}]}}`,
			`{"default":{"backendRefs":[{"kind":"MeshService","name":"b","weight":1}],"filters":[{"requestRedirect":{"scheme":"https","statusCode":302},"type":"RequestRedirect"},{"requestMirror":{"backendRef":{"kind":"MeshService","name":"m","weight":3}},"type":"RequestMirror"}]},"matches":[{"headers":[{"name":"h","type":"Exact","value":"v"}]}]}`},
		{"MeshTCPRoute", `{"default":{"backendRefs":[{"kind":"MeshService","name":"b"}]}}`,
			`{"default":{"backendRefs":[{"kind":"MeshService","name":"b","weight":1}]}}`},
		{"MeshTimeout", `{"idleTimeout":"1s"}`, `{"idleTimeout":"1s"}`},
	}
	for _, c := range cases {
		d, _ := reg.Lookup(c.typ)
		in, err := ParseJSON([]byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		before, _ := CanonicalJSON(in)
		got, _ := CanonicalJSON(d.ConfDefaults(in))
		if string(got) != c.want {
			t.Errorf("%s %s:\n got  %s\n want %s", c.typ, c.in, got, c.want)
		}
		if after, _ := CanonicalJSON(in); string(after) != string(before) {
			t.Errorf("%s %s: the input changed to %s", c.typ, c.in, after)
		}
	}
}
