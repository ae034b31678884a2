package admission_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/plane"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	"github.com/meridian-mesh/meridian/internal/storage/boltstore"
)

func newStore(t *testing.T) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func controller(t *testing.T, mode plane.Mode, federated bool) *admission.Controller {
	t.Helper()
	p := plane.NewGlobal("")
	if mode == plane.Zone {
		p = plane.Plane{Mode: plane.Zone, Zone: "zone-1", Environment: plane.EnvKubernetes, SystemNamespace: plane.DefaultSystemNamespace, Federated: federated}
	}
	c, err := admission.New(admission.Config{Registry: resource.NewDefaultRegistry(), Plane: p})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func timeout(mesh, name string, labels map[string]string) *resource.Resource {
	return &resource.Resource{Type: "MeshTimeout", Mesh: mesh, Name: name, Labels: resource.NewLabels(labels),
		Spec: []byte(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}`)}
}

func put(t *testing.T, s storage.Store, c *admission.Controller, r *resource.Resource) error {
	t.Helper()
	if err := c.Prepare(r); err != nil {
		return err
	}
	_, err := s.Apply(context.Background(), c.Put(r))
	return err
}

func seed(t *testing.T, s storage.Store, rs ...*resource.Resource) {
	t.Helper()
	if _, err := s.Apply(context.Background(), storage.Batch{Puts: rs}); err != nil {
		t.Fatal(err)
	}
}

func mesh(name string, labels map[string]string) *resource.Resource {
	return &resource.Resource{Type: "Mesh", Name: name, Labels: resource.NewLabels(labels), Spec: []byte(`{}`)}
}

func TestPrepareAndPut(t *testing.T) {
	global := controller(t, plane.Global, false)
	zone := controller(t, plane.Zone, false)
	federated := controller(t, plane.Zone, true)
	tests := []struct {
		name string
		c    *admission.Controller
		seed []*resource.Resource
		res  *resource.Resource
		want error
		// invalid: the error is a *resource.ValidationError
		invalid bool
		msg     string
	}{
		{name: "global refuses a zone label", c: global, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", "t", map[string]string{resource.LabelZone: "zone-1"}), want: admission.ErrForbidden, msg: "kuma.io/zone"},
		{name: "global refuses a namespace label", c: global, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", "t", map[string]string{resource.LabelNamespace: "pay"}), want: admission.ErrForbidden, msg: "k8s.kuma.io/namespace"},
		{name: "global refuses another origin", c: global, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", "t", map[string]string{resource.LabelOrigin: "zone"}), want: admission.ErrForbidden, msg: "origin"},
		{name: "zone refuses another zone", c: zone, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", "t", map[string]string{resource.LabelZone: "zone-2"}), want: admission.ErrForbidden, msg: "zone-2"},
		{name: "zone refuses a namespace label that is not the namespace", c: zone, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", "t", map[string]string{resource.LabelNamespace: "pay"}), want: admission.ErrForbidden, msg: "does not match"},
		{name: "global refuses a Dataplane", c: global, seed: []*resource.Resource{mesh("default", nil)},
			res:  &resource.Resource{Type: "Dataplane", Mesh: "default", Name: "dp", Spec: []byte(`{"networking":{"address":"1.1.1.1","inbound":[{"port":80,"tags":{"kuma.io/service":"a"}}]}}`)},
			want: admission.ErrForbidden, msg: "created on the zone control plane"},
		{name: "a kuma.io/mesh label names the mesh", c: global, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", "t", map[string]string{resource.LabelMesh: "other"}), invalid: true, msg: `labels["kuma.io/mesh"]: "other" does not match the resource's mesh "default"`},
		{name: "mesh must exist", c: global, res: timeout("nope", "t", nil), want: admission.ErrMeshMissing, msg: `mesh "nope"`},
		{name: "federated zone creates no mesh", c: federated, res: mesh("new", nil), want: admission.ErrForbidden, msg: "create meshes there"},
		{name: "standalone zone creates meshes", c: zone, res: mesh("new", nil)},
		{name: "zone does not edit the global's policy", c: zone,
			seed: []*resource.Resource{mesh("default", nil), timeout("default", "t", map[string]string{resource.LabelOrigin: "global"})},
			res:  timeout("default", "t", nil), want: admission.ErrOwned, msg: "change it on the global"},
		{name: "global does not edit a zone's copy", c: global,
			seed: []*resource.Resource{mesh("default", nil), timeout("default", "t", map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1"})},
			res:  timeout("default", "t", nil), want: admission.ErrOwned, msg: "change it in that zone"},
		{name: "global writes its own", c: global, seed: []*resource.Resource{mesh("default", nil)}, res: timeout("default", "t", nil)},
		{name: "zone does not squat a global copy's name", c: zone, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", mapping.HashedName("default", "squat"), nil), want: admission.ErrOwned, msg: `the global's MeshTimeout "squat"`},
		{name: "a look-alike suffix is fine", c: zone, seed: []*resource.Resource{mesh("default", nil)},
			res: timeout("default", "squat-zcxfc7db4c7v784b", nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			if len(tt.seed) > 0 {
				seed(t, s, tt.seed...)
			}
			err := put(t, s, tt.c, tt.res)
			if tt.invalid {
				var verr *resource.ValidationError
				if !errors.As(err, &verr) || !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("err %v, want a validation error containing %q", err, tt.msg)
				}
				return
			}
			if !errors.Is(err, tt.want) || (tt.want != nil && !strings.Contains(err.Error(), tt.msg)) {
				t.Fatalf("err %v, want %v containing %q", err, tt.want, tt.msg)
			}
		})
	}
}

func TestClientStatusIsDropped(t *testing.T) {
	c := controller(t, plane.Global, false)
	r := timeout("default", "t", nil)
	r.Status = []byte(`{"conditions":[{"type":"Enforced","status":"True"}]}`)
	if err := c.Prepare(r); err != nil {
		t.Fatal(err)
	}
	if r.Status != nil {
		t.Errorf("status %s kept", r.Status)
	}
}

func TestDeleteMeshOnGlobal(t *testing.T) {
	c := controller(t, plane.Global, false)
	s := newStore(t)
	ctx := context.Background()
	seed(t, s, mesh("default", nil), timeout("default", "own", map[string]string{resource.LabelOrigin: "global"}),
		timeout("default", "from-zone", map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1"}))
	_, err := s.Apply(ctx, c.DeleteMesh("default", 0))
	if !errors.Is(err, admission.ErrOwned) || !strings.Contains(err.Error(), "MeshTimeout from-zone (zone zone-1)") {
		t.Fatalf("delete of a mesh with zone resources: %v", err)
	}
	if _, err := s.Get(ctx, resource.Key{Type: "Mesh", Name: "default"}); err != nil {
		t.Fatalf("mesh gone after a refused delete: %v", err)
	}
	if _, err := s.Apply(ctx, storage.Batch{Deletes: []resource.Key{{Type: "MeshTimeout", Mesh: "default", Name: "from-zone"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, c.DeleteMesh("default", 0)); err != nil {
		t.Fatalf("delete: %v", err)
	}
	list, err := s.List(ctx, storage.ListOptions{Type: "MeshTimeout", Mesh: "default"})
	if err != nil || list.Total != 0 {
		t.Fatalf("cascade left %v (%v)", list, err)
	}
	if _, err := s.Apply(ctx, c.DeleteMesh("default", 0)); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

// TestNoOrphanAfterRacingMeshDelete: writes into a mesh racing with the
// mesh's delete never leave a resource in a mesh that does not exist (the
// mesh check and the cascade run in the write's transaction).
func TestNoOrphanAfterRacingMeshDelete(t *testing.T) {
	c := controller(t, plane.Global, false)
	s := newStore(t)
	ctx := context.Background()
	for round := 0; round < 20; round++ {
		seed(t, s, mesh("m", nil))
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := put(t, s, c, timeout("m", fmt.Sprintf("t-%d-%d", round, i), nil))
				if err != nil && !errors.Is(err, admission.ErrMeshMissing) {
					t.Errorf("put: %v", err)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Apply(ctx, c.DeleteMesh("m", 0)); err != nil {
				t.Errorf("delete mesh: %v", err)
			}
		}()
		wg.Wait()
		list, err := s.List(ctx, storage.ListOptions{Type: "MeshTimeout", Mesh: "m"})
		if err != nil {
			t.Fatal(err)
		}
		if list.Total > 0 {
			t.Fatalf("round %d: %d resources outlived mesh m", round, list.Total)
		}
	}
}

func TestDeleteChecksVersionAndOwner(t *testing.T) {
	c := controller(t, plane.Zone, false)
	s := newStore(t)
	ctx := context.Background()
	seed(t, s, mesh("default", nil), timeout("default", "mine", nil),
		timeout("default", "global", map[string]string{resource.LabelOrigin: "global"}))
	k := func(n string) resource.Key { return resource.Key{Type: "MeshTimeout", Mesh: "default", Name: n} }
	if _, err := s.Apply(ctx, c.Delete(k("mine"), 7)); !errors.Is(err, storage.ErrConflict) {
		t.Errorf("stale version: %v", err)
	}
	if _, err := s.Apply(ctx, c.Delete(k("global"), 0)); !errors.Is(err, admission.ErrOwned) {
		t.Errorf("global's policy: %v", err)
	}
	if _, err := s.Apply(ctx, c.Delete(k("absent"), 0)); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("absent: %v", err)
	}
	if _, err := s.Apply(ctx, c.Delete(k("mine"), 1)); err != nil {
		t.Errorf("delete: %v", err)
	}
}

func TestFromZone(t *testing.T) {
	c := controller(t, plane.Global, false)
	s := newStore(t)
	ctx := context.Background()
	own := timeout("default", "own", map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1"})
	other := timeout("default", "other", map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-2"})
	global := timeout("default", "global", map[string]string{resource.LabelOrigin: "global"})
	seed(t, s, mesh("default", nil), own, other, global)
	k := func(n string) resource.Key { return resource.Key{Type: "MeshTimeout", Mesh: "default", Name: n} }
	puts := []*resource.Resource{timeout("default", "own", nil), timeout("default", "other", nil), timeout("nope", "x", nil), timeout("default", "new", nil)}
	deletes := []resource.Key{k("global"), k("own")}
	_, err := s.Apply(ctx, storage.Batch{Puts: puts, Deletes: deletes, Check: c.FromZone("zone-1", nil, puts, deletes)})
	var rej *admission.Rejected
	if !errors.As(err, &rej) {
		t.Fatalf("err %v, want Rejected", err)
	}
	want := map[resource.Key]error{k("other"): admission.ErrOwned, k("global"): admission.ErrOwned,
		{Type: "MeshTimeout", Mesh: "nope", Name: "x"}: admission.ErrMeshMissing}
	if len(rej.Keys) != len(want) {
		t.Fatalf("rejected %v, want %v", rej.Keys, want)
	}
	for key, sentinel := range want {
		if !errors.Is(rej.Keys[key], sentinel) {
			t.Errorf("%s: %v, want %v", key, rej.Keys[key], sentinel)
		}
	}
	if _, err := s.Get(ctx, k("new")); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("a vetoed batch wrote: %v", err)
	}
}

// TestFromGlobal: on a zone, a batch from the global may not overwrite or
// remove the zone's own resources; what the global sent before, and new
// keys, are free.
func TestFromGlobal(t *testing.T) {
	c := controller(t, plane.Zone, true)
	s := newStore(t)
	ctx := context.Background()
	own := timeout("default", "own", map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1"})
	ownUnlabelled := timeout("default", "legacy", nil)
	synced := timeout("default", "synced", map[string]string{resource.LabelOrigin: "global"})
	seed(t, s, mesh("default", nil), own, ownUnlabelled, synced)
	k := func(n string) resource.Key { return resource.Key{Type: "MeshTimeout", Mesh: "default", Name: n} }
	puts := []*resource.Resource{timeout("default", "own", nil), timeout("default", "synced", nil), timeout("default", "new", nil)}
	deletes := []resource.Key{k("legacy"), k("absent")}
	_, err := s.Apply(ctx, storage.Batch{Puts: puts, Deletes: deletes, Check: c.FromGlobal(puts, deletes)})
	var rej *admission.Rejected
	if !errors.As(err, &rej) {
		t.Fatalf("err %v, want Rejected", err)
	}
	if len(rej.Keys) != 2 || !errors.Is(rej.Keys[k("own")], admission.ErrOwned) || !errors.Is(rej.Keys[k("legacy")], admission.ErrOwned) {
		t.Fatalf("rejected %v, want own and legacy (ErrOwned)", rej.Keys)
	}
	if _, err := s.Get(ctx, k("new")); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("a vetoed batch wrote: %v", err)
	}
	ok := []*resource.Resource{timeout("default", "synced", nil), timeout("default", "new", nil)}
	if _, err := s.Apply(ctx, storage.Batch{Puts: ok, Check: c.FromGlobal(ok, nil)}); err != nil {
		t.Fatalf("a batch of the global's own and new keys: %v", err)
	}
}

// TestZoneQuota: a zone's puts on the global count against its quota by
// resources and bytes; deletes in the same batch free room first; an
// update counts only its growth; what does not fit is refused with
// ErrQuota and the rest applies.
func TestZoneQuota(t *testing.T) {
	c := controller(t, plane.Global, false)
	s := newStore(t)
	ctx := context.Background()
	seed(t, s, mesh("default", nil))
	zoneTimeout := func(name string) *resource.Resource {
		return timeout("default", name, map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1"})
	}
	q := &admission.Quota{MaxResources: 2}
	apply := func(puts []*resource.Resource, deletes []resource.Key) error {
		_, err := s.Apply(ctx, storage.Batch{Puts: puts, Deletes: deletes, Check: c.FromZone("zone-1", q, puts, deletes)})
		if err == nil {
			q.Used.Resources += q.Delta.Resources
			q.Used.Bytes += q.Delta.Bytes
		}
		return err
	}
	if err := apply([]*resource.Resource{zoneTimeout("a"), zoneTimeout("b")}, nil); err != nil {
		t.Fatalf("within the quota: %v", err)
	}
	err := apply([]*resource.Resource{zoneTimeout("c")}, nil)
	var rej *admission.Rejected
	if !errors.As(err, &rej) || !errors.Is(rej.Keys[zoneTimeout("c").Key()], admission.ErrQuota) {
		t.Fatalf("a third resource: %v, want ErrQuota", err)
	}
	if err := apply([]*resource.Resource{zoneTimeout("a")}, nil); err != nil {
		t.Errorf("an update at the quota: %v", err)
	}
	if err := apply([]*resource.Resource{zoneTimeout("c")}, []resource.Key{zoneTimeout("b").Key()}); err != nil {
		t.Errorf("a put with a delete that frees room: %v", err)
	}
	if q.Used.Resources != 2 {
		t.Errorf("used %d resources, want 2", q.Used.Resources)
	}
	q.MaxBytes = q.Used.Bytes + 10
	big := zoneTimeout("a")
	big.Labels.Set("padding", strings.Repeat("x", 60))
	if err := apply([]*resource.Resource{big}, nil); !errors.As(err, &rej) {
		t.Errorf("an update past the byte quota: %v", err)
	}
}
