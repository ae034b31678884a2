package tuning

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// gcHeadroom paces Go's garbage collector so that a collection comes after
// headroom bytes of new allocation (at most maxPercent of the live heap),
// not after the live heap's size again (GOGC=100). A control plane's live heap is small next to what a
// burst of writes allocates: at 10,000 policies the global's live heap is
// about 20 MiB, and each PUT (its request, decoding, validation, the
// store's transaction, the fan-out to every zone) allocates tens of KiB, so
// at GOGC=100 a burst ran a collection every few hundred writes and the
// bench's profiles of the PUT phase showed 8-9% of the global's CPU in the
// collector, more in the zones. With a floor of headroom between the live
// heap and the next goal, a small heap is collected several times less
// often; once the live heap exceeds headroom (a zone holding 100,000
// policies) the floor is below GOGC=100's goal and nothing changes.
//
// It costs memory only while garbage accumulates: the resident set can grow
// by up to headroom during a burst, and the memory trimmer hands it back once
// the process is quiet, so a settled process is as small as before.
//
// A GOGC set in the environment is the operator's choice: the pacer then
// leaves the collector alone. GOMEMLIMIT needs no such care, since the
// runtime honours a memory limit whatever the percentage.
//
// The percentage is recomputed after every collection (a cleanup on an
// object dropped at once runs after the collection that finds it
// unreachable), from the live heap that collection measured.
type gcHeadroom struct {
	headroom   uint64
	maxPercent int
	live       func() uint64
	setPercent func(int) int
	// mu orders a collection's adjust with halt; current is the
	// percentage last set.
	mu      sync.Mutex
	current int
	stopped atomic.Bool
}

const (
	// defaultGCHeadroom: measured with the bench's PUT phases, 64 MiB
	// took the global's and the zones' CPU per PUT down by the
	// collector's share; the resident set during a burst grows by at
	// most this much.
	defaultGCHeadroom = 64 << 20
	// maxGCPercent bounds the goal of a nearly empty heap (a process just
	// started): 8 times its live heap at most.
	maxGCPercent = 800
)

// StartGCPacing starts the process's collector pacing (see gcHeadroom)
// unless GOGC is set in the environment. The binaries call it once, first
// thing: the collector's percentage is process-wide.
func StartGCPacing() { startGCPacing(os.Getenv, liveHeap, debug.SetGCPercent) }

// PaceGC paces the collector as StartGCPacing does until stop is called,
// which sets the percentage back to Go's default (100). It is for a
// program that runs a control plane's work in process for a while:
// cmd/bench renders proxies under the pacing zone-cp runs with. With GOGC
// set in the environment it does nothing.
func PaceGC() (stop func()) {
	g := startGCPacing(os.Getenv, liveHeap, debug.SetGCPercent)
	if g == nil {
		return func() {}
	}
	return func() { g.halt(100) }
}

// startGCPacing starts the pacing with these hooks into the environment and
// the runtime; nil when GOGC is set.
func startGCPacing(getenv func(string) string, live func() uint64, setPercent func(int) int) *gcHeadroom {
	if getenv("GOGC") != "" {
		return nil
	}
	g := &gcHeadroom{headroom: defaultGCHeadroom, maxPercent: maxGCPercent, live: live, setPercent: setPercent, current: 100}
	g.adjust()
	g.arm()
	return g
}

// percentFor is the GOGC that leaves at least headroom between a live
// heap of live bytes and the next collection, within [100, maxPercent].
func (g *gcHeadroom) percentFor(live uint64) int {
	if live == 0 {
		return g.maxPercent
	}
	p := g.headroom * 100 / live
	return int(min(max(p, 100), uint64(g.maxPercent)))
}

// adjust sets the percentage for the live heap of the last collection.
func (g *gcHeadroom) adjust() {
	if p := g.percentFor(g.live()); p != g.current {
		g.setPercent(p)
		g.current = p
	}
}

// arm registers adjust to run after the next collection, and to arm itself
// again then, until stop.
func (g *gcHeadroom) arm() {
	// Large enough to stay out of the tiny allocator, whose blocks are
	// shared by other objects and may stay reachable.
	sentinel := new([32]byte)
	runtime.AddCleanup(sentinel, func(g *gcHeadroom) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.stopped.Load() {
			return
		}
		g.adjust()
		g.arm()
	}, g)
}

// halt stops the pacing and sets the percentage to restore.
func (g *gcHeadroom) halt(restore int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped.Store(true)
	g.setPercent(restore)
	g.current = restore
}

func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
