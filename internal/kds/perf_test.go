package kds

import (
	"context"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// TestSyncPerformance measures BENCHMARKS.md's sync figures in process (real
// boltstores with fsync, gRPC over bufconn, default stream settings):
//
//	MERIDIAN_SYNC_PERF=1 go test -run TestSyncPerformance -v ./internal/kds/
//
// It is skipped otherwise (and under -short): it writes 20,000 resources.
func TestSyncPerformance(t *testing.T) {
	if os.Getenv("MERIDIAN_SYNC_PERF") == "" || testing.Short() {
		t.Skip("set MERIDIAN_SYNC_PERF=1 to run")
	}
	const n = 10_000
	c := newCluster(t, clusterOpts{quiet: os.Getenv("MERIDIAN_SYNC_PERF_LOG") == ""})
	c.stream = StreamConfig{} // defaults: 1 MiB batches, 8 in flight

	// 1. Live: a connected zone while 10,000 policies are written on the
	// global by 8 writers; time from the last write to the zone holding all.
	z := c.zone("zone-1", zoneOpts{}).start()
	eventually(t, wait, "connected", z.connected)
	seen := watchCount(t, z.store, "MeshTimeout", n)
	start := time.Now()
	writeMany(t, c.global, "live-", n, 8)
	lastWrite := time.Now()
	done := <-seen
	t.Logf("live: %d policies written on the global in %s; last write -> zone holds all: %s",
		n, lastWrite.Sub(start).Round(time.Millisecond), max(0, done.Sub(lastWrite)).Round(time.Millisecond))

	// 2. Cold start: a new zone against the global holding 10,000.
	// The snapshot is applied in one transaction together with the
	// global's revision, which the client reports as soon as it commits.
	z2 := c.zone("zone-2", zoneOpts{})
	target, _ := c.global.Revision(context.Background())
	coldStart := time.Now()
	z2.start()
	for z2.client.Status().GlobalToZone.RevisionAcked < target {
		time.Sleep(time.Millisecond)
	}
	cold := time.Since(coldStart)
	if got := count(t, z2.store, "MeshTimeout"); got != n {
		t.Fatalf("zone-2 holds %d policies", got)
	}
	t.Logf("cold start: zone started -> holds all %d: %s", n, cold.Round(time.Millisecond))

	// 3. One change on the global -> visible in the zone, one at a time.
	z.waitSettled()
	var lat []time.Duration
	for i := range 300 {
		name := "live-" + itoa(i)
		key := resource.Key{Type: "MeshTimeout", Mesh: "default", Name: mapping.HashedName("default", name)}
		ch := watchKey(t, z.store, key)
		begin := time.Now()
		writeGlobal(t, c.global, timeout(name, "", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"`+itoa(i+3)+`s"}}]}`))
		<-ch
		lat = append(lat, time.Since(begin))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("propagation of one change (write on the global, incl. its fsync -> applied in the zone), %d samples: p50 %s p99 %s max %s",
		len(lat), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
}

// writeMany puts n policies with w concurrent writers (each put is its own
// revision, as with REST clients).
func writeMany(t *testing.T, st storage.Store, prefix string, n, w int) {
	var wg sync.WaitGroup
	for k := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += w {
				r := timeout(prefix+itoa(i), "", "")
				r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: "global", resource.LabelPolicyRole: "system"})
				if _, _, err := st.Put(context.Background(), r); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// watchCount reports when st holds n distinct resources of typ.
func watchCount(t *testing.T, st storage.Store, typ string, n int) <-chan time.Time {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	events, err := st.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan time.Time, 1)
	go func() {
		keys := map[resource.Key]bool{}
		for ev := range events {
			if ev.Resource.Type != typ {
				continue
			}
			if ev.Kind == storage.EventPut {
				keys[ev.Resource.Key()] = true
			} else {
				delete(keys, ev.Resource.Key())
			}
			if len(keys) == n {
				out <- time.Now()
				cancel()
				return
			}
		}
	}()
	return out
}

// watchKey reports the next write of key.
func watchKey(t *testing.T, st storage.Store, key resource.Key) <-chan struct{} {
	ctx, cancel := context.WithCancel(context.Background())
	rev, _ := st.Revision(ctx)
	events, err := st.Watch(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan struct{})
	go func() {
		defer cancel()
		for ev := range events {
			if ev.Resource.Key() == key {
				close(out)
				return
			}
		}
	}()
	return out
}

// TestChangeDuringLargeReport measures how long a zone's change waits when
// the zone is sending a status report of 100,000 policies (~20 MB, the
// report a zone sends after a change that alters every global policy's
// status):
//
//	MERIDIAN_SYNC_PERF=1 go test -run TestChangeDuringLargeReport -v ./internal/kds/
//
// Report chunks leave only when nothing else waits, so the change does not
// queue behind the whole report (505–580 ms before, see BENCHMARKS.md).
func TestChangeDuringLargeReport(t *testing.T) {
	if os.Getenv("MERIDIAN_SYNC_PERF") == "" || testing.Short() {
		t.Skip("set MERIDIAN_SYNC_PERF=1 to run")
	}
	const n = 100_000
	c := newCluster(t, clusterOpts{quiet: os.Getenv("MERIDIAN_SYNC_PERF_LOG") == ""})
	z := c.zone("zone-1", zoneOpts{reporter: bigReporter{n: n}}).start()
	eventually(t, wait, "connected", z.connected)
	time.Sleep(20 * time.Millisecond) // the report's first chunks are leaving
	start := time.Now()
	writeZone(t, z.store, "zone-1", timeout("during-report", "", ""))
	eventually(t, time.Minute, "the change on the global", func() bool {
		return exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "during-report", "zone-1"))
	})
	change := time.Since(start)
	eventually(t, time.Minute, "the whole report on the global", func() bool {
		return len(c.server.PolicyStatuses("MeshTimeout", "default", "policy-"+itoa(n-1))) == 1
	})
	t.Logf("a zone's change reached the global after %s; the whole report after %s",
		change.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
