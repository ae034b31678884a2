package kds

import (
	"maps"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// TestFromWireSharesSystemLabelStrings decodes a resource as a receiver
// does and checks that the system's label keys and values point at the
// constants (and a display name equal to the name at the name), while
// every label keeps its value.
func TestFromWireSharesSystemLabelStrings(t *testing.T) {
	labels := map[string]string{
		resource.LabelOrigin:      resource.OriginGlobal,
		resource.LabelPolicyRole:  resource.RoleProducer,
		resource.LabelDisplayName: "t-1",
		resource.LabelZone:        "zone-1",
		"team":                    "global", // not a system label: kept as decoded
	}
	data, err := proto.Marshal(&syncv1.Resource{Type: "MeshTimeout", Mesh: "default", Name: "t-1", Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	var w syncv1.Resource
	if err := proto.Unmarshal(data, &w); err != nil {
		t.Fatal(err)
	}
	r := fromWire(&w)
	if !maps.Equal(r.Labels.Map(), labels) {
		t.Fatalf("labels %v, want %v", r.Labels, labels)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	for k, v := range r.Labels.All() {
		switch k {
		case resource.LabelOrigin, resource.LabelPolicyRole, resource.LabelDisplayName, resource.LabelZone:
			if c := systemLabel(k); !same(k, c) {
				t.Errorf("key %s is a copy, not the constant", k)
			}
		default:
			if systemLabel(k) != "" {
				t.Errorf("key %s taken for a system label", k)
			}
		}
		switch k {
		case resource.LabelOrigin:
			if !same(v, resource.OriginGlobal) {
				t.Errorf("%s: value is a copy", k)
			}
		case resource.LabelPolicyRole:
			if !same(v, resource.RoleProducer) {
				t.Errorf("%s: value is a copy", k)
			}
		case resource.LabelDisplayName:
			if !same(v, r.Name) {
				t.Errorf("%s: value is not the name's string", k)
			}
		case "team":
			if same(v, resource.OriginGlobal) || v != "global" {
				t.Errorf("a user label's value was replaced: %q", v)
			}
		}
	}
}
