package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/api"
)

// Regression tests for issue 13's REST findings (admission rules).
func TestSecurityFindings(t *testing.T) {
	g := newFixture(t, api.ModeGlobal)
	ms := `{"type":"MeshService","mesh":"default","name":"payments","labels":{"kuma.io/zone":"zone-1","k8s.kuma.io/namespace":"pay"},"spec":{"selector":{"dataplaneTags":{"app":"x"}},"ports":[{"port":80}]}}`
	resp := g.do("PUT", "/meshes/default/meshservices/payments", ms)
	if resp.status != http.StatusForbidden || !strings.Contains(string(resp.body), "kuma.io/zone") {
		t.Errorf("global accepts zone labels: %d %s", resp.status, resp.body)
	}
	two := "type: Mesh\nname: a\n---\ntype: Mesh\nname: b\n"
	if resp := g.do("PUT", "/meshes/a", two); resp.status != http.StatusBadRequest || !strings.Contains(string(resp.body), "2 documents") {
		t.Errorf("multi-document PUT: %d %s", resp.status, resp.body)
	}
	long := strings.Repeat("x", 40<<10)
	for _, m := range []string{"GET", "DELETE"} {
		if resp := g.do(m, "/meshes/default/meshtimeouts/"+long, ""); resp.status != http.StatusBadRequest {
			t.Errorf("%s of a 40 KiB name: %d %.200s", m, resp.status, resp.body)
		}
		if resp := g.do(m, "/meshes/"+long, ""); resp.status != http.StatusBadRequest {
			t.Errorf("%s of a 40 KiB mesh: %d %.200s", m, resp.status, resp.body)
		}
	}
	withStatus := `{"type":"MeshTimeout","mesh":"default","name":"t","status":{"forged":true},"spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}}`
	g.mustDo("PUT", "/meshes/default/meshtimeouts/t", withStatus, http.StatusCreated)
	if resp := g.mustDo("GET", "/meshes/default/meshtimeouts/t", "", http.StatusOK); strings.Contains(string(resp.body), "forged") {
		t.Errorf("client status stored: %s", resp.body)
	}
}
