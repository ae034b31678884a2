package resource

import (
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"
)

// BenchmarkDecodeValidate measures the write path of one policy (the REST
// PUT bar in BENCHMARKS.md is 5,000 writes/s for the whole server).
func BenchmarkDecodeValidate(b *testing.B) {
	reg := NewDefaultRegistry()
	doc := []byte(`{"type":"MeshTimeout","mesh":"default","name":"t","namespace":"backend-ns","spec":{"targetRef":{"kind":"Mesh"},
		"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"connectionTimeout":"5s","idleTimeout":"1h",
		"http":{"requestTimeout":"15s","streamIdleTimeout":"30m"}},"strategy":{"default":"merge"},"unset":["http.maxStreamDuration"]}]}}`)
	opts := kubernetesZone()
	b.ReportAllocs()
	for b.Loop() {
		r, err := reg.Decode(doc)
		if err != nil {
			b.Fatal(err)
		}
		reg.Normalize(r, opts.SystemNamespace)
		if err := reg.Validate(r, opts); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidate measures what a zone does to each policy it receives
// (the cold zone validates every one of them).
func BenchmarkValidate(b *testing.B) {
	reg := NewDefaultRegistry()
	r, err := reg.Decode([]byte(`{"type":"MeshTimeout","mesh":"default","name":"t","labels":{"kuma.io/origin":"global"},"spec":{"targetRef":{"kind":"Mesh"},
		"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"5s","idleTimeout":"1h",
		"http":{"requestTimeout":"15s","streamIdleTimeout":"30m"}}}]}}`))
	if err != nil {
		b.Fatal(err)
	}
	opts := plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvUniversal, SystemNamespace: plane.DefaultSystemNamespace}
	b.ReportAllocs()
	for b.Loop() {
		if err := reg.Validate(r, opts); err != nil {
			b.Fatal(err)
		}
	}
}
