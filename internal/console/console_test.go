package console

import (
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// TestTemplatesParse: every page template parses with the layout (a
// template error would otherwise only show when the process starts).
func TestTemplatesParse(t *testing.T) {
	for _, mode := range []api.Mode{api.ModeGlobal, api.ModeZone} {
		c, err := New(Config{API: fakeAPI{}, Mode: mode, Registry: resource.NewDefaultRegistry(), Logger: hclog.NewNullLogger()})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		for _, name := range []string{"zones", "zone", "tokens", "meshes", "policies", "resource", "dataplanes", "dataplane", "explain", "login", "error"} {
			if c.pages[name] == nil {
				t.Errorf("%s: no page %s", mode, name)
			}
		}
	}
}
