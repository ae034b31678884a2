package zonesim

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// reporter is a simulated zone's sync.StatusReporter. Like a zone-cp's
// status loop, it reports once its state has stopped changing for settle,
// and only when the set of the global's policies it holds changed (a zone
// whose statuses did not change sends nothing). Safe for concurrent use.
type reporter struct {
	store  *memStore
	reg    *resource.Registry
	settle time.Duration
	// kick is signalled (buffer 1) by the store when an apply created or
	// deleted a resource.
	kick chan struct{}
	// conds is what the zone reports for each of the global's policies it
	// holds: the conditions of a zone-cp whose policy applies without a
	// loss (policy.CondAccepted, policy.CondEnforced), so that the global
	// keeps as much per zone as it keeps for a real one. Never written.
	conds []*syncv1.Condition

	mu      sync.Mutex
	rep     *syncv1.PolicyStatusReport
	changed chan struct{}
}

func newReporter(store *memStore, reg *resource.Registry, settle time.Duration) *reporter {
	return &reporter{store: store, reg: reg, settle: settle, kick: make(chan struct{}, 1), changed: make(chan struct{}),
		conds: []*syncv1.Condition{
			{Type: "Accepted", Status: "True", Reason: "Accepted", Message: "Policy has been accepted"},
			{Type: "Enforced", Status: "True", Reason: "Enforced", Message: "Policy has been successfully enforced"},
		}}
}

// PolicyStatusReport implements sync.StatusReporter.
func (r *reporter) PolicyStatusReport() (*syncv1.PolicyStatusReport, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rep, r.changed
}

// held is the store's signal that the set of resources changed.
func (r *reporter) held() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run publishes a new report after every settled change until ctx ends.
func (r *reporter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		t := time.NewTimer(r.settle)
	settling:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-r.kick:
				t.Reset(r.settle)
			case <-t.C:
				break settling
			}
		}
		r.publish(r.build())
	}
}

// build lists the global's policies the zone holds, sorted by type and
// name (the global's name: a zone stores the display name as a label).
func (r *reporter) build() *syncv1.PolicyStatusReport {
	var held []*resource.Resource
	r.store.each(func(res *resource.Resource) {
		if d, ok := r.reg.Lookup(res.Type); ok && d.IsPolicy() && res.Labels.Get(resource.LabelOrigin) == resource.OriginGlobal {
			held = append(held, res)
		}
	})
	rep := &syncv1.PolicyStatusReport{Statuses: make([]*syncv1.PolicyStatus, 0, len(held))}
	for _, res := range held {
		rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{
			Key:        &syncv1.ResourceKey{Type: res.Type, Mesh: res.Mesh, Name: res.DisplayName()},
			Conditions: r.conds,
		})
	}
	slices.SortFunc(rep.Statuses, func(a, b *syncv1.PolicyStatus) int {
		if c := strings.Compare(a.Key.Type, b.Key.Type); c != 0 {
			return c
		}
		return strings.Compare(a.Key.Name, b.Key.Name)
	})
	return rep
}

func (r *reporter) publish(rep *syncv1.PolicyStatusReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rep = rep
	close(r.changed)
	r.changed = make(chan struct{})
}
