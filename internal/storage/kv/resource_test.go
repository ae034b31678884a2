package kv

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func TestResourceRoundTrip(t *testing.T) {
	t0 := time.Date(2030, 5, 6, 7, 8, 9, 123456789, time.UTC)
	tests := []struct {
		name string
		in   resource.Resource
	}{
		{"minimal", resource.Resource{Type: "Mesh", Name: "default"}},
		{"full", resource.Resource{
			Type: "MeshTimeout", Mesh: "default", Namespace: "ns", Name: "t",
			Labels: resource.NewLabels(map[string]string{"b": "2", "a": "1", "": "empty key"}),
			Spec:   []byte(`{"to":[]}`), Status: []byte(`{"ok":true}`),
			CreationTime: t0, ModificationTime: t0.Add(time.Hour), Version: 1 << 40,
		}},
		{"before 1970", resource.Resource{Type: "Mesh", Name: "old", CreationTime: time.Date(1900, 1, 1, 0, 0, 0, 5, time.UTC)}},
		{"unicode and long", resource.Resource{Type: "Mesh", Name: "é" + string(make([]byte, 300))}},
		{"many labels, large spec, far times", resource.Resource{Type: "MeshTimeout", Mesh: "m", Name: "n",
			Labels: resource.NewLabels(manyLabels(40)), Spec: make([]byte, 70000), Version: 127,
			CreationTime: time.Unix(-1<<40, 999999999), ModificationTime: time.Unix(1<<40, 0)}},
	}
	for _, tc := range tests {
		enc := AppendResource(nil, &tc.in)
		got, err := DecodeResource(enc)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := tc.in
		if got.Key() != want.Key() || !got.Labels.Equal(want.Labels) || string(got.Spec) != string(want.Spec) ||
			string(got.Status) != string(want.Status) || !got.CreationTime.Equal(want.CreationTime) ||
			!got.ModificationTime.Equal(want.ModificationTime) || got.Version != want.Version {
			t.Errorf("%s: round trip gave %+v, want %+v", tc.name, got, want)
		}
		// Equal labels encode equally whatever the map order.
		if again := AppendResource(nil, got); string(again) != string(enc) {
			t.Errorf("%s: encoding not deterministic", tc.name)
		}
		if n := ResourceSize(&tc.in); n != len(enc) {
			t.Errorf("%s: ResourceSize %d, encoding %d bytes", tc.name, n, len(enc))
		}
	}
}

// TestDecodeCorrupt: every truncation and a few bit flips of a valid record
// give an error, never a panic.
func TestDecodeCorrupt(t *testing.T) {
	r := &resource.Resource{Type: "MeshTimeout", Mesh: "m", Name: "n", Labels: resource.NewLabels(map[string]string{"k": "v"}),
		Spec: []byte(`{}`), CreationTime: time.Unix(1, 2), Version: 3}
	enc := AppendResource(nil, r)
	for n := range len(enc) {
		if _, err := DecodeResource(enc[:n]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("truncated to %d bytes: %v, want ErrCorrupt", n, err)
		}
	}
	if _, err := DecodeResource(append(slices.Clone(enc), 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing byte: %v", err)
	}
	bad := slices.Clone(enc)
	bad[0] = 99
	if _, err := DecodeResource(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("unknown format: %v", err)
	}
}

// TestRecordHasLabels: the raw matcher agrees with decoding and Labels.Contains,
// and a record cut inside its labels is an error.
func TestRecordHasLabels(t *testing.T) {
	rec := AppendResource(nil, &resource.Resource{Type: "MeshTimeout", Mesh: "m", Name: "n",
		Labels: resource.NewLabels(map[string]string{"kuma.io/origin": "zone", "kuma.io/zone": "zone-1", "": "empty key"}), Spec: []byte(`{}`),
		CreationTime: time.Unix(0, 0), ModificationTime: time.Unix(0, 0)})
	noLabels := AppendResource(nil, &resource.Resource{Type: "MeshTimeout", Mesh: "m", Name: "n"})
	tests := []struct {
		name string
		rec  []byte
		want map[string]string
		ok   bool
	}{
		{"one label", rec, map[string]string{"kuma.io/zone": "zone-1"}, true},
		{"two labels", rec, map[string]string{"kuma.io/zone": "zone-1", "kuma.io/origin": "zone"}, true},
		{"empty key", rec, map[string]string{"": "empty key"}, true},
		{"other value", rec, map[string]string{"kuma.io/zone": "zone-2"}, false},
		{"value prefix", rec, map[string]string{"kuma.io/zone": "zone-"}, false},
		{"one of two missing", rec, map[string]string{"kuma.io/zone": "zone-1", "team": "a"}, false},
		{"no labels", noLabels, map[string]string{"kuma.io/zone": "zone-1"}, false},
	}
	for _, tc := range tests {
		got, err := RecordHasLabels(tc.rec, tc.want)
		if err != nil || got != tc.ok {
			t.Errorf("%s: got %v, %v; want %v", tc.name, got, err, tc.ok)
		}
		r, err := DecodeResource(tc.rec)
		if err != nil {
			t.Fatal(err)
		}
		if r.Labels.Contains(tc.want) != tc.ok {
			t.Errorf("%s: Labels.Contains disagrees", tc.name)
		}
	}
	// After the labels: spec (1+2 bytes), status (1), two times at the
	// epoch (2 each), version 0 (1); see AppendResource.
	labelsEnd := len(rec) - 9
	for n := range labelsEnd {
		if _, err := RecordHasLabels(rec[:n], map[string]string{"team": "a"}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("truncated to %d bytes: %v, want ErrCorrupt", n, err)
		}
	}
	// A repeated key (no encoder writes one): the last value counts, as in
	// DecodeResource.
	dup := []byte{ResourceFormat, 0, 0, 0, 1, 'n', 2, 1, 'a', 1, 'x', 1, 'a', 1, 'b', 0, 0, 0, 0, 0, 0, 0}
	r, err := DecodeResource(dup)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"x", "b"} {
		got, err := RecordHasLabels(dup, map[string]string{"a": v})
		if err != nil || got != r.Labels.Contains(map[string]string{"a": v}) {
			t.Errorf("repeated key, want a=%s: got %v, %v; DecodeResource gave labels %v", v, got, err, r.Labels)
		}
	}
	bad := slices.Clone(rec)
	bad[0] = 99
	if _, err := RecordHasLabels(bad, map[string]string{"team": "a"}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("unknown format: %v", err)
	}
}

func FuzzDecodeResource(f *testing.F) {
	f.Add(AppendResource(nil, &resource.Resource{Type: "Mesh", Name: "x", Labels: resource.NewLabels(map[string]string{"a": "b"}), Spec: []byte("{}")}))
	f.Add([]byte{ResourceFormat, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeResource(b)
		want := map[string]string{"a": "b"}
		if match, merr := RecordHasLabels(b, want); err == nil && (merr != nil || match != r.Labels.Contains(want)) {
			t.Fatalf("RecordHasLabels gave %v, %v on a record that decodes with labels %v", match, merr, r.Labels)
		}
		if err != nil {
			return
		}
		enc := AppendResource(nil, r)
		if _, err := DecodeResource(enc); err != nil {
			t.Fatalf("re-encoding a decoded record fails: %v", err)
		}
		if n := ResourceSize(r); n != len(enc) {
			t.Fatalf("ResourceSize %d, encoding %d bytes", n, len(enc))
		}
	})
}

// TestKeyOrder: byte order of encoded keys is the (mesh, namespace, name)
// order that List promises, including names that extend one another, and
// CompareKeys orders keys the same way without encoding them.
func TestKeyOrder(t *testing.T) {
	keys := []resource.Key{
		{Type: "T", Mesh: "a", Name: "x"},
		{Type: "T", Mesh: "a", Namespace: "", Name: "x-y"},
		{Type: "T", Mesh: "a", Namespace: "n", Name: "a"},
		{Type: "T", Mesh: "a-b", Name: "a"},
		{Type: "T", Mesh: "a.b", Name: "a"},
		{Type: "T", Mesh: "ab", Name: "a"},
	}
	for i := 1; i < len(keys); i++ {
		if string(EncodeKey(keys[i-1])) >= string(EncodeKey(keys[i])) {
			t.Errorf("%s does not sort before %s", keys[i-1], keys[i])
		}
		if CompareKeys(keys[i-1], keys[i]) >= 0 || CompareKeys(keys[i], keys[i-1]) <= 0 {
			t.Errorf("CompareKeys disagrees with the encoding on %s and %s", keys[i-1], keys[i])
		}
		if got, err := DecodeKey(EncodeKey(keys[i])); err != nil || got != keys[i] {
			t.Errorf("decode %s: %v, %v", keys[i], got, err)
		}
	}
	if c := CompareKeys(keys[0], keys[0]); c != 0 {
		t.Errorf("CompareKeys of a key with itself: %d", c)
	}
	if err := ValidateKey(resource.Key{Type: "T", Name: "a\x00b"}); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("NUL accepted: %v", err)
	}
}

func manyLabels(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[string(rune('a'+i%26))+string(make([]byte, i*7))] = string(make([]byte, 200-i))
	}
	return m
}
