package resource

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"
)

// fuzzOptions are the control planes every fuzzed resource is validated for.
func fuzzOptions() []plane.Plane {
	return []plane.Plane{
		{Mode: plane.Global},
		{Mode: plane.Zone, Environment: plane.EnvUniversal, SystemNamespace: "mesh-system"},
		kubernetesZone(),
	}
}

// FuzzDecode: splitting, decoding and validating arbitrary input never
// panics, and whatever decodes also survives an encode/decode round trip.
// Seeds: testdata/fuzz/FuzzDecode plus every testdata document.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob("testdata/*/*.yaml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	reg := NewDefaultRegistry()
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := SplitDocuments(data)
		if err != nil {
			return
		}
		for _, doc := range docs {
			checkDecodedDocument(t, reg, doc)
		}
	})
}

func checkDecodedDocument(t *testing.T, reg *Registry, doc []byte) {
	r, err := reg.Decode(doc)
	if err != nil {
		return
	}
	for _, opts := range fuzzOptions() {
		c := r.Clone()
		reg.Normalize(c, opts.SystemNamespace)
		_ = reg.Validate(c, opts)
		if d, ok := reg.Lookup(c.Type); ok && d.IsPolicy() {
			_, _ = PolicyRole(c, d, opts.SystemNamespace)
		}
	}
	for _, encode := range []func(*Resource) ([]byte, error){reg.EncodeJSON, reg.EncodeYAML} {
		out, err := encode(r)
		if err != nil {
			t.Fatalf("decoded resource does not encode: %v\n%s", err, doc)
		}
		back, err := reg.Decode(out)
		if err != nil {
			t.Fatalf("encoded resource does not decode: %v\n%s", err, out)
		}
		if back.Key() != r.Key() || back.Version != r.Version || !back.CreationTime.Equal(r.CreationTime) {
			t.Fatalf("round trip changed the envelope:\n%+v\n%+v", r, back)
		}
	}
}

// FuzzValidate: validation of any spec bytes for any type never panics.
func FuzzValidate(f *testing.F) {
	reg := NewDefaultRegistry()
	names := reg.Names()
	for i, name := range names {
		f.Add(uint8(i), name+"-x", "default", "", []byte(`{}`))
	}
	f.Add(uint8(0), "n", "default", "team-a", []byte(`{"to":[{"targetRef":{"kind":"MeshService","name":"a"},"override":{}}]}`))
	f.Add(uint8(3), "x", "", "kuma-system", []byte(`{"networking":{"address":"1.2.3.4","inbound":[{"port":1,"tags":{"kuma.io/service":"a"}}]}}`))
	f.Add(uint8(7), "y", "m", "ns", []byte(`{"targetRef":{"kind":"MeshGateway","name":"g"},"to":[{"targetRef":{"kind":"Mesh"},"rules":[{"matches":[{}],"default":{"backendRefs":[{"kind":"MeshService","name":"a","namespace":"b"}]}}]}]}`))
	f.Fuzz(func(t *testing.T, typeIndex uint8, name, mesh, namespace string, spec []byte) {
		r := &Resource{
			Type: names[int(typeIndex)%len(names)], Name: name, Mesh: mesh, Namespace: namespace,
			Labels: NewLabels(map[string]string{LabelDisplayName: name}), Spec: bytes.Clone(spec),
		}
		d, _ := reg.Lookup(r.Type)
		for _, opts := range fuzzOptions() {
			_ = reg.Validate(r, opts)
			if d.IsPolicy() {
				_, _ = PolicyRole(r, d, opts.SystemNamespace)
			}
		}
		c := r.Clone()
		reg.Normalize(c, "")
		_ = reg.Validate(c, kubernetesZone())
		_, _ = reg.EncodeJSON(c)
		_, _ = reg.EncodeYAML(c)
	})
}
