package zonesim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func timeout(name, display, origin string) *resource.Resource {
	labels := map[string]string{resource.LabelDisplayName: display}
	if origin != "" {
		labels[resource.LabelOrigin] = origin
	}
	return &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name, Labels: resource.NewLabels(labels),
		Spec: []byte(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}`)}
}

// TestReporterReportsHeldGlobalPolicies: a simulated zone reports each of
// the global's policies it holds, by its global name, once what it holds
// settles, and again only when that set changes.
func TestReporterReportsHeldGlobalPolicies(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newMemStore(nil)
	rep := newReporter(st, resource.NewDefaultRegistry(), 20*time.Millisecond)
	st.onHeld = rep.held
	go rep.run(ctx)

	apply := func(b storage.Batch) {
		t.Helper()
		if _, err := st.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	next := func(changed <-chan struct{}) []string {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(5 * time.Second):
			t.Fatal("no report")
		}
		r, _ := rep.PolicyStatusReport()
		var names []string
		for _, s := range r.Statuses {
			if len(s.Conditions) != 2 {
				t.Errorf("%s: %d conditions", s.Key.Name, len(s.Conditions))
			}
			names = append(names, s.Key.Type+"/"+s.Key.Mesh+"/"+s.Key.Name)
		}
		return names
	}
	first, changed := rep.PolicyStatusReport()
	if first != nil {
		t.Fatalf("a report before anything was held: %v", first)
	}
	apply(storage.Batch{Puts: []*resource.Resource{
		timeout("b-hash", "b", resource.OriginGlobal),
		timeout("a-hash", "a", resource.OriginGlobal),
		timeout("own", "own", ""), // the zone's own: not reported
		{Type: "Mesh", Name: "default", Labels: resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal})},
	}})
	got := next(changed)
	if want := []string{"MeshTimeout/default/a", "MeshTimeout/default/b"}; !slices.Equal(got, want) {
		t.Fatalf("report %v, want %v", got, want)
	}

	_, changed = rep.PolicyStatusReport()
	apply(storage.Batch{Puts: []*resource.Resource{timeout("a-hash", "a", resource.OriginGlobal)}}) // an update
	select {
	case <-changed:
		t.Fatal("an update of a held policy changed the report")
	case <-time.After(100 * time.Millisecond):
	}
	apply(storage.Batch{Deletes: []resource.Key{{Type: "MeshTimeout", Mesh: "default", Name: "b-hash"}}})
	if got, want := next(changed), []string{"MeshTimeout/default/a"}; !slices.Equal(got, want) {
		t.Fatalf("report after a delete %v, want %v", got, want)
	}
}
