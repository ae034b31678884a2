package resource

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/plane"
)

// kubernetesZone is where every example in testdata/valid is valid: the
// namespace examples use application namespaces.
func kubernetesZone() plane.Plane {
	return plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvKubernetes, SystemNamespace: plane.DefaultSystemNamespace}
}

func readDocs(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := SplitDocuments(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return docs
}

func TestValidTestdata(t *testing.T) {
	reg := NewDefaultRegistry()
	files, _ := filepath.Glob("testdata/valid/*.yaml")
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	seen := map[string]bool{}
	for _, f := range files {
		for i, doc := range readDocs(t, f) {
			r, err := reg.Decode(doc)
			if err != nil {
				t.Errorf("%s doc %d: decode: %v", f, i+1, describeErr(err))
				continue
			}
			reg.Normalize(r, plane.DefaultSystemNamespace)
			if err := reg.Validate(r, kubernetesZone()); err != nil {
				t.Errorf("%s doc %d (%s): %v", f, i+1, r.Key(), describeErr(err))
			}
			seen[r.Type] = true
		}
	}
	for _, name := range reg.Names() {
		if !seen[name] {
			t.Errorf("no valid example of %s in testdata/valid", name)
		}
	}
}

// TestInvalidTestdata: each file holds one document and "# want: FIELD:
// MESSAGE" lines naming causes the validation error must contain.
func TestInvalidTestdata(t *testing.T) {
	reg := NewDefaultRegistry()
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, _ := os.ReadFile(f)
			wants := wantedCauses(data)
			if len(wants) == 0 {
				t.Fatal("no '# want:' line")
			}
			docs := readDocs(t, f)
			if len(docs) != 1 {
				t.Fatalf("want one document, got %d", len(docs))
			}
			err := decodeAndValidate(reg, docs[0], kubernetesZone())
			got := causes(t, err)
			for _, w := range wants {
				if !containsCause(got, w) {
					t.Errorf("missing cause %q in %q", w, got)
				}
			}
		})
	}
}

func decodeAndValidate(reg *Registry, doc []byte, opts plane.Plane) error {
	r, err := reg.Decode(doc)
	if err != nil {
		return err
	}
	reg.Normalize(r, opts.SystemNamespace)
	return reg.Validate(r, opts)
}

func wantedCauses(data []byte) []string {
	var wants []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		if w, ok := strings.CutPrefix(string(line), "# want: "); ok {
			wants = append(wants, strings.TrimSpace(w))
		}
	}
	return wants
}

// causes renders a ValidationError's causes as "field: message".
func causes(t *testing.T, err error) []string {
	t.Helper()
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("want *ValidationError, got %v", err)
	}
	out := make([]string, len(verr.Causes))
	for i, c := range verr.Causes {
		out[i] = c.Field + ": " + c.Message
	}
	return out
}

func containsCause(got []string, want string) bool {
	for _, g := range got {
		if strings.Contains(g, want) {
			return true
		}
	}
	return false
}

func describeErr(err error) string {
	var verr *ValidationError
	if errors.As(err, &verr) {
		var parts []string
		for _, c := range verr.Causes {
			parts = append(parts, c.Field+": "+c.Message)
		}
		return strings.Join(parts, "; ")
	}
	return err.Error()
}
