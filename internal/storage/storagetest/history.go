package storagetest

import (
	"maps"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// history is every change a test made, in commit order: the events a watch
// that never lags would deliver.
type history []storage.Event

// tombstone is what a delete event carries: the key and the last labels.
func tombstone(old *resource.Resource) *resource.Resource {
	return &resource.Resource{
		Type: old.Type, Mesh: old.Mesh, Namespace: old.Namespace, Name: old.Name,
		Labels: old.Labels, Version: old.Version,
	}
}

type histKey struct {
	rev     uint64
	key     resource.Key
	kind    storage.EventKind
	version uint64 // 0 for deletes: the contract does not promise it
}

func histKeyOf(ev storage.Event) histKey {
	k := histKey{rev: ev.Revision, key: ev.Resource.Key(), kind: ev.Kind}
	if ev.Kind == storage.EventPut {
		k.version = ev.Resource.Version
	}
	return k
}

// checkStream checks what a watch from `from` delivered against the
// contract: events in commit order, none twice, each equal to the change it
// reports; every delete after from present, and every key's last change
// after from present. Intermediate puts of a key may be missing (a watcher
// that lags sees each key's latest state).
func checkStream(t *testing.T, what string, hist history, from uint64, got []storage.Event) {
	t.Helper()
	index := make(map[histKey]int, len(hist))
	for i, ev := range hist {
		index[histKeyOf(ev)] = i
	}
	seen := make(map[int]bool, len(got))
	last := -1
	for n, ev := range got {
		if ev.Resource == nil {
			t.Fatalf("%s: event %d has no resource", what, n)
		}
		i, ok := index[histKeyOf(ev)]
		switch {
		case !ok:
			t.Fatalf("%s: event %d (%v rev %d %s v%d) is no change that happened", what, n, ev.Kind, ev.Revision, ev.Resource.Key(), ev.Resource.Version)
		case ev.Revision <= from:
			t.Fatalf("%s: event %d at revision %d, not after %d", what, n, ev.Revision, from)
		case i <= last:
			t.Fatalf("%s: event %d (rev %d %s) out of order or repeated", what, n, ev.Revision, ev.Resource.Key())
		}
		last = i
		seen[i] = true
		checkEvent(t, what, ev, hist[i])
	}
	lastOfKey := map[resource.Key]int{}
	for i, ev := range hist {
		if ev.Revision <= from {
			continue
		}
		lastOfKey[ev.Resource.Key()] = i
		if ev.Kind == storage.EventDelete && !seen[i] {
			t.Errorf("%s: delete of %s at revision %d not delivered", what, ev.Resource.Key(), ev.Revision)
		}
	}
	for k, i := range lastOfKey {
		if !seen[i] {
			t.Errorf("%s: latest change of %s (revision %d) not delivered", what, k, hist[i].Revision)
		}
	}
}

func checkEvent(t *testing.T, what string, got, want storage.Event) {
	t.Helper()
	if got.Kind == storage.EventPut {
		checkRes(t, what, got.Resource, want.Resource)
		return
	}
	if !got.Resource.Labels.Equal(want.Resource.Labels) || got.Resource.Spec != nil {
		t.Errorf("%s: delete of %s carries labels %v spec %s, want labels %v and no spec",
			what, got.Resource.Key(), got.Resource.Labels, got.Resource.Spec, want.Resource.Labels)
	}
}

// checkExact requires exactly the recorded changes after from.
func checkExact(t *testing.T, what string, hist history, from uint64, got []storage.Event) {
	t.Helper()
	var want history
	for _, ev := range hist {
		if ev.Revision > from {
			want = append(want, ev)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i].Kind != want[i].Kind || got[i].Revision != want[i].Revision {
			t.Fatalf("%s: event %d is %v@%d, want %v@%d", what, i, got[i].Kind, got[i].Revision, want[i].Kind, want[i].Revision)
		}
		checkEvent(t, what, got[i], want[i])
		// Every revision's last delivered event, and only it, says Last.
		if last := i == len(got)-1 || got[i+1].Revision != got[i].Revision; got[i].Last != last {
			t.Fatalf("%s: event %d (%v@%d) has Last %v, want %v", what, i, got[i].Kind, got[i].Revision, got[i].Last, last)
		}
	}
}

type state map[resource.Key]*resource.Resource

func replay(base state, events []storage.Event) state {
	s := maps.Clone(base)
	if s == nil {
		s = state{}
	}
	for _, ev := range events {
		if ev.Kind == storage.EventDelete {
			delete(s, ev.Resource.Key())
		} else {
			s[ev.Resource.Key()] = ev.Resource
		}
	}
	return s
}

// stateAt is the store's content at revision rev according to hist.
func stateAt(hist history, rev uint64) state {
	end := len(hist)
	for i, ev := range hist {
		if ev.Revision > rev {
			end = i
			break
		}
	}
	return replay(nil, hist[:end])
}

func checkState(t *testing.T, what string, got, want state) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: %s missing", what, k)
			continue
		}
		checkRes(t, what, g, w)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected %s", what, k)
		}
	}
}

// storeState lists every resource of the given types.
func (h *harness) storeState(types ...string) state {
	h.t.Helper()
	s := state{}
	for _, typ := range types {
		for _, r := range h.list(storage.ListOptions{Type: typ}).Items {
			s[r.Key()] = r
		}
	}
	return s
}

// recv returns the next event, failing if the channel closes or stays empty.
func recv(t *testing.T, ch <-chan storage.Event) storage.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatalf("watch channel closed early")
		}
		return ev
	case <-time.After(waitTimeout):
		t.Fatalf("no watch event within %s", waitTimeout)
	}
	return storage.Event{}
}

func recvN(t *testing.T, ch <-chan storage.Event, n int) []storage.Event {
	t.Helper()
	out := make([]storage.Event, 0, n)
	for range n {
		out = append(out, recv(t, ch))
	}
	return out
}

// recvThrough reads until an event at revision rev; rev must be a
// single-resource write so that nothing at rev follows it.
func recvThrough(t *testing.T, ch <-chan storage.Event, rev uint64) []storage.Event {
	t.Helper()
	var out []storage.Event
	for {
		ev := recv(t, ch)
		out = append(out, ev)
		if ev.Revision >= rev {
			return out
		}
	}
}

// expectClosed drains ch and fails unless it closes in time.
func expectClosed(t *testing.T, what string, ch <-chan storage.Event) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("%s: watch channel not closed within %s", what, waitTimeout)
		}
	}
}

// recorder performs writes sequentially and records them in a history.
type recorder struct {
	h    *harness
	hist history
}

func (r *recorder) add(kind storage.EventKind, res *resource.Resource) {
	r.hist = append(r.hist, storage.Event{Kind: kind, Revision: r.h.rev(), Resource: res})
}

func (r *recorder) create(res *resource.Resource) {
	r.h.t.Helper()
	r.add(storage.EventPut, r.h.create(res))
}

func (r *recorder) put(res *resource.Resource) {
	r.h.t.Helper()
	if out, o := r.h.put(res); o != storage.Unchanged {
		r.add(storage.EventPut, out)
	}
}

func (r *recorder) del(path string) {
	r.h.t.Helper()
	old := r.h.get(key(path))
	r.h.del(key(path), 0)
	r.add(storage.EventDelete, tombstone(old))
}

// apply records a batch whose puts and deletes name distinct keys.
func (r *recorder) apply(b storage.Batch) {
	r.h.t.Helper()
	var gone []*resource.Resource
	for _, k := range b.Deletes {
		if old, err := r.h.s.Get(r.h.ctx, k); err == nil {
			gone = append(gone, old)
		}
	}
	res := r.h.apply(b)
	for i, p := range b.Puts {
		if res.Outcomes[i] != storage.Unchanged {
			r.add(storage.EventPut, r.h.get(p.Key()))
		}
	}
	for _, old := range gone {
		r.add(storage.EventDelete, tombstone(old))
	}
}
