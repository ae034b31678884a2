package tuning

import (
	"context"
	"net/http"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/stats"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// MemoryTrimmer hands the heap's free pages back to the OS once the process
// has gone quiet. Go returns freed memory slowly: a background scavenger,
// paced at 1% of a CPU, trims only down to about the next collection's goal,
// which is twice the live heap. After a burst (a snapshot received, statuses
// recomputed, a large list served) a control plane so kept about twice its
// live heap resident for minutes, and paid the scavenger's CPU meanwhile.
// Once the process has allocated next to nothing for a quiet period, one
// collection and release (debug.FreeOSMemory) brings the resident set down
// to about the live heap. The free memory a trim leaves is near zero and only
// grows again with new garbage, so an idle process is not collected again.
//
// A trim also drops the embedded store's memory map from the resident set
// (boltstore.Store.ReleaseMap): the bursts that leave garbage (a zone's first
// load, a list of every resource, a snapshot sent to a zone) are the ones
// that read the whole file through the map, and at 100,000 policies its
// pages were 45 MiB of a zone's 210 MiB resident, kept for as long as the
// kernel left them. They stay in the page cache; the next read maps them
// again.
//
// Between bursts it sleeps: after a trim, or once quiet for idle with nothing
// worth trimming, it stops its ticker until wake is called (by every API
// request and every sync message received, the sources of a control plane's
// work). Each tick costs a wakeup, and on this project's 2-core VMs a Go
// process woken once a second used 1.0-1.5 ms of CPU a second for that
// alone: for the bench's four processes, about half of BENCHMARKS.md's idle bar
// (1% of a core).
//
// Owned by its run goroutine; the fields are fixed before run starts, and
// wake may be called from any goroutine.
type MemoryTrimmer struct {
	tick time.Duration
	// idle: quiet this long with nothing worth trimming, it sleeps.
	idle time.Duration
	// awaken holds a wake that came while asleep (capacity 1).
	awaken chan struct{}
	// quiet: no more than quietAlloc bytes allocated per tick for this long.
	quiet      time.Duration
	quietAlloc uint64
	// A trim needs at least minFree reclaimable (see memSample), and a
	// quarter of the live heap: a collection costs in proportion to the
	// live heap, so a large one waits for more garbage (a trickle of
	// allocation in an idle process then rarely triggers one). Half the
	// live heap was too much: a zone at 10,000 policies (42 MB live) often
	// settled with 20 MB free, just under it, and stayed at 100–110 MiB
	// resident instead of 77.
	minFree uint64
	read    func() memSample
	trim    func()
	// release drops the store's map from the resident set (nil: none).
	release func()
	ticks   func(time.Duration) (<-chan time.Time, func())
}

// memSample is what the trimmer reads of the runtime.
type memSample struct {
	allocated uint64 // bytes allocated since the process started
	// free is what a collection and release would hand back, about: the
	// heap held from the OS (objects, dead or alive, and free spans) less
	// what was live at the last collection. Garbage counts: an idle
	// process does not collect it (the next collection waits for
	// allocation, or the runtime's forced one every 2 minutes).
	free uint64
	live uint64 // heap live at the last collection
}

// NewMemoryTrimmer trims the heap, and after each trim calls release when it
// is not nil.
func NewMemoryTrimmer(release func()) *MemoryTrimmer {
	return &MemoryTrimmer{
		tick: time.Second, idle: 4 * time.Second, awaken: make(chan struct{}, 1),
		quiet: 2 * time.Second, quietAlloc: 1 << 20, minFree: 8 << 20,
		read: readMemSample, trim: debug.FreeOSMemory, release: release,
		ticks: func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		},
	}
}

func readMemSample() memSample {
	s := []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	held, live := s[1].Value.Uint64()+s[2].Value.Uint64(), s[3].Value.Uint64()
	return memSample{allocated: s[0].Value.Uint64(), free: held - min(held, live), live: live}
}

// Run trims after each quiet period until ctx ends, sleeping between
// bursts until woken.
func (m *MemoryTrimmer) Run(ctx context.Context) error {
	st := trimState{last: m.read()}
	for {
		m.awake(ctx, &st)
		// What came since the last tick is not lost: the next tick counts
		// the allocation since then (st.last), and a burst of work wakes
		// the trimmer again.
		select {
		case <-m.awaken:
		default:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.awaken:
		}
	}
}

// awake ticks until a trim, until quiet for idle with nothing worth
// trimming, or until ctx ends.
func (m *MemoryTrimmer) awake(ctx context.Context, st *trimState) {
	c, stop := m.ticks(m.tick)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c:
		}
		if m.observe(st, m.read()) {
			m.trim()
			if m.release != nil {
				m.release()
			}
			*st = trimState{last: m.read()}
			return
		}
		if st.quietFor >= m.idle {
			return
		}
	}
}

// Wake ends the trimmer's sleep: work came in. Cheap and never blocks.
func (m *MemoryTrimmer) Wake() {
	select {
	case m.awaken <- struct{}{}:
	default:
	}
}

// WakeOn wakes the trimmer on every request to h.
func (m *MemoryTrimmer) WakeOn(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.Wake()
		h.ServeHTTP(w, r)
	})
}

// GRPCStats wakes the trimmer on every message a gRPC stream receives but
// heartbeats: they come every few seconds on every stream, carry no work,
// and would keep an idle global's trimmer ticking.
func (m *MemoryTrimmer) GRPCStats() stats.Handler { return trimmerStats{m} }

type trimmerStats struct{ m *MemoryTrimmer }

func (t trimmerStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (t trimmerStats) HandleRPC(_ context.Context, s stats.RPCStats) {
	in, ok := s.(*stats.InPayload)
	if !ok {
		return
	}
	if msg, ok := in.Payload.(*syncv1.Message); ok && msg.GetHeartbeat() != nil {
		return
	}
	t.m.Wake()
}
func (t trimmerStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (t trimmerStats) HandleConn(context.Context, stats.ConnStats)                       {}

// trimState is what the trimmer remembers between ticks.
type trimState struct {
	last     memSample
	quietFor time.Duration
	// burst is what was allocated in busy ticks since the last trim.
	burst uint64
}

// observe takes the sample of the next tick and reports whether to trim:
// once quiet, when the free memory held is worth a collection, or when a
// burst since the last trim allocated as much. The second case is there
// because free (memSample) only counts garbage made since the last
// collection: after a burst whose last collection ran in its midst (100
// zones' status reports arriving at once), what was live then and is
// garbage now was not counted, and a 400 MB heap of it stayed resident.
func (m *MemoryTrimmer) observe(st *trimState, s memSample) bool {
	if a := s.allocated - st.last.allocated; a > m.quietAlloc {
		st.quietFor = 0
		st.burst += a
	} else {
		st.quietFor += m.tick
	}
	st.last = s
	worth := max(m.minFree, s.live/4)
	return st.quietFor >= m.quiet && (s.free >= worth || st.burst >= worth)
}

// MapReleaser returns what drops store's memory map from the resident set
// (boltstore.Store.ReleaseMap), or nil when the store keeps none (etcd).
func MapReleaser(ctx context.Context, store any, logger hclog.Logger) func() {
	m, ok := store.(interface{ ReleaseMap(context.Context) error })
	if !ok {
		return nil
	}
	return func() {
		if err := m.ReleaseMap(ctx); err != nil && ctx.Err() == nil {
			logger.Warn("releasing the store's memory map", "error", err)
		}
	}
}
