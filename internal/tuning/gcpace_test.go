package tuning

import (
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

func TestGCHeadroomPercent(t *testing.T) {
	g := &gcHeadroom{headroom: 64 << 20, maxPercent: 800}
	for _, tc := range []struct {
		name string
		live uint64
		want int
	}{
		{"nothing measured yet", 0, 800},
		{"nearly empty heap: capped", 1 << 20, 800},
		{"10,000 policies' global", 20 << 20, 320},
		{"live heap equals headroom", 64 << 20, 100},
		{"large heap: Go's default", 200 << 20, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := g.percentFor(tc.live); got != tc.want {
				t.Errorf("percentFor(%d MiB) = %d, want %d", tc.live>>20, got, tc.want)
			}
		})
	}
}

// TestGCPacingLeavesGOGCAlone: a GOGC in the environment is the operator's
// choice; without one the pacing sets the percentage at once.
func TestGCPacingLeavesGOGCAlone(t *testing.T) {
	live := func() uint64 { return 16 << 20 }
	for _, tc := range []struct {
		name, gogc string
		want       []int
	}{
		{"GOGC unset", "", []int{400}},
		{"GOGC=100", "100", nil},
		{"GOGC=off", "off", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var set []int
			getenv := func(k string) string {
				if k == "GOGC" {
					return tc.gogc
				}
				return ""
			}
			g := startGCPacing(getenv, live, func(p int) int { set = append(set, p); return 0 })
			if g != nil {
				g.stop()
			}
			if (g == nil) != (tc.gogc != "") {
				t.Errorf("started = %v with GOGC=%q", g != nil, tc.gogc)
			}
			if !slices.Equal(set, tc.want) {
				t.Errorf("percentages set %v, want %v", set, tc.want)
			}
		})
	}
}

// TestGCHeadroomFollowsCollections: the percentage is recomputed after
// each collection from the live heap it measured, and set only when it
// changes.
func TestGCHeadroomFollowsCollections(t *testing.T) {
	var live atomic.Uint64
	live.Store(32 << 20)
	sets := make(chan int, 100)
	g := &gcHeadroom{headroom: 64 << 20, maxPercent: 800, live: live.Load, current: 100,
		setPercent: func(p int) int { sets <- p; return 0 }}
	defer g.stop()
	g.adjust()
	if p := <-sets; p != 200 {
		t.Fatalf("first adjust set %d, want 200", p)
	}
	g.arm()
	live.Store(16 << 20)
	if p := collectUntilSet(t, sets); p != 400 {
		t.Fatalf("after a collection with 16 MiB live: set %d, want 400", p)
	}
	// Unchanged live heap: collections set nothing.
	collectionsSetNothing(t, sets, "with the live heap unchanged")
	live.Store(128 << 20)
	if p := collectUntilSet(t, sets); p != 100 {
		t.Fatalf("after a collection with 128 MiB live: set %d, want 100", p)
	}
}

func collectUntilSet(t *testing.T, sets <-chan int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		runtime.GC()
		select {
		case p := <-sets:
			return p
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("no percentage set after collections for 10s")
	return 0
}

// stop ends the pacing (tests start and stop it).
func (g *gcHeadroom) stop() { g.stopped.Store(true) }

// TestGCHeadroomHalts: once halted, the percentage is the one restored and
// collections set no other.
func TestGCHeadroomHalts(t *testing.T) {
	sets := make(chan int, 100)
	g := &gcHeadroom{headroom: 64 << 20, maxPercent: 800, live: func() uint64 { return 16 << 20 }, current: 100,
		setPercent: func(p int) int { sets <- p; return 0 }}
	g.adjust()
	g.arm()
	if p := <-sets; p != 400 {
		t.Fatalf("adjust set %d, want 400", p)
	}
	g.halt(100)
	if p := <-sets; p != 100 {
		t.Fatalf("halt set %d, want 100", p)
	}
	collectionsSetNothing(t, sets, "after halt")
}

// collectionsSetNothing runs collections and fails if a percentage is set
// meanwhile.
func collectionsSetNothing(t *testing.T, sets <-chan int, when string) {
	t.Helper()
	for range 3 {
		runtime.GC()
	}
	time.Sleep(50 * time.Millisecond)
	select {
	case p := <-sets:
		t.Fatalf("set %d %s", p, when)
	default:
	}
}
