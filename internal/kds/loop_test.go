package kds

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/plane"

	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// fakeStream is the test's end of a session: the test pushes what the peer
// sends into in and reads what the session sends from out.
type fakeStream struct {
	in     chan *syncv1.Message
	out    chan *syncv1.Message
	closed chan struct{}
}

func newFakeStream() *fakeStream {
	return &fakeStream{in: make(chan *syncv1.Message, 16), out: make(chan *syncv1.Message, 1024), closed: make(chan struct{})}
}

func (f *fakeStream) Recv() (*syncv1.Message, error) {
	select {
	case m := <-f.in:
		return m, nil
	case <-f.closed:
		return nil, io.EOF
	}
}

func (f *fakeStream) Send(m *syncv1.Message) error {
	select {
	case f.out <- m:
		return nil
	case <-f.closed:
		return io.EOF
	}
}

// next returns the next message the session sent, skipping heartbeats.
func (f *fakeStream) next(t *testing.T) *syncv1.Message {
	t.Helper()
	for {
		select {
		case m := <-f.out:
			if m.GetHeartbeat() != nil {
				continue
			}
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("no message from the session")
			return nil
		}
	}
}

// none checks that the session sends nothing but heartbeats for a moment.
func (f *fakeStream) none(t *testing.T) {
	t.Helper()
	deadline := time.After(100 * time.Millisecond)
	for {
		select {
		case m := <-f.out:
			if m.GetHeartbeat() == nil {
				t.Fatalf("unexpected message %v", m)
			}
		case <-deadline:
			return
		}
	}
}

type loopHarness struct {
	t      *testing.T
	store  storage.Store
	clock  *fakeClock
	stream *fakeStream
	obs    *flow
	done   chan error
	cancel context.CancelFunc
	// drain, when closed, starts the session's graceful end.
	drain chan struct{}
}

// startLoop runs a global-side session for zone-1 on a fake stream and a
// fake clock, resuming from resume.
func startLoop(t *testing.T, cfg StreamConfig, store storage.Store, resume uint64) *loopHarness {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	h := &loopHarness{t: t, store: store, clock: newFakeClock(), stream: newFakeStream(), done: make(chan error, 1),
		drain: make(chan struct{})}
	tr := newTracker(h.clock, nil)
	_, g2z, z2g := tr.connected("zone-1", &syncv1.Handshake{ResumeRevision: resume}, "kubernetes", 0)
	h.obs = g2z
	zone := zonePlane("zone-1", plane.EnvKubernetes)
	sess := &session{log: testLogger(t, "loop"), clock: h.clock, stream: h.stream,
		heartbeatInterval: cfg.HeartbeatInterval, heartbeatTimeout: cfg.HeartbeatTimeout, drain: h.drain}
	sess.out = newOutbound(cfg.outbound(), store, globalSource{reg: testRegistry, zone: "zone-1"}, sess.log, h.clock, g2z, sess.enqueue, sess.backlog)
	sess.in = &inbound{store: store, metaKey: MetaKeyZoneRevision("zone-1"), log: sess.log, obs: z2g, clock: h.clock,
		sink: globalSink{reg: testRegistry, store: store, zone: zone, global: testGlobal}}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- sess.run(ctx, resume) }()
	t.Cleanup(func() {
		cancel()
		close(h.stream.closed)
		<-h.done
	})
	return h
}

// startCurrentLoop runs a session on a store holding the default mesh,
// resuming at its current revision: nothing to send until the test writes.
func startCurrentLoop(t *testing.T, cfg StreamConfig) (*loopHarness, storage.Store) {
	t.Helper()
	store := newTestStore(t)
	writeGlobal(t, store, mesh("default"))
	rev, _ := store.Revision(context.Background())
	h := startLoop(t, cfg, store, rev)
	h.stream.none(t)
	return h, store
}

func (h *loopHarness) ack(b *syncv1.DeltaBatch) {
	h.stream.in <- msgAck(&syncv1.Ack{Nonce: b.GetNonce(), Revision: b.GetRevision()})
}

func (h *loopHarness) batch() *syncv1.DeltaBatch {
	h.t.Helper()
	m := h.stream.next(h.t)
	b := m.GetDeltaBatch()
	if b == nil {
		h.t.Fatalf("expected a batch, got %v", m)
	}
	return b
}

// advance moves the fake clock once the session has armed its timers.
func (h *loopHarness) advance(d time.Duration, timers int) {
	h.t.Helper()
	eventually(h.t, 5*time.Second, "timers armed", func() bool { return h.clock.pending() >= timers })
	h.clock.Advance(d)
}

func newTestStore(t *testing.T) storage.Store {
	st := openStore(t, filepath.Join(t.TempDir(), "s.db"), storeOpts{})
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func TestLoopHeartbeatsAndTimeout(t *testing.T) {
	store := newTestStore(t)
	h := startLoop(t, StreamConfig{HeartbeatInterval: time.Second, HeartbeatTimeout: 3 * time.Second}, store, 0)
	snap := h.batch()
	if !snap.GetFullSnapshot() || !snap.GetLastChunk() {
		t.Fatalf("first batch %v", snap)
	}
	h.ack(snap)
	for i := range 2 {
		h.advance(time.Second, 1)
		if m := <-h.stream.out; m.GetHeartbeat() == nil {
			t.Fatalf("tick %d: got %v, want a heartbeat", i, m)
		}
	}
	// A heartbeat from the peer keeps the stream alive...
	h.stream.in <- msgHeartbeat(&syncv1.Heartbeat{})
	eventually(t, time.Second, "heartbeat handled", func() bool { return len(h.stream.in) == 0 })
	time.Sleep(20 * time.Millisecond)
	h.advance(time.Second, 1)
	h.advance(time.Second, 1)
	h.advance(time.Second, 1)
	select {
	case err := <-h.done:
		t.Fatalf("stream ended early: %v", err)
	default:
	}
	// ...silence beyond the timeout ends it.
	h.advance(time.Second, 1)
	select {
	case err := <-h.done:
		if !errors.Is(err, ErrPeerSilent) {
			t.Fatalf("stream ended with %v, want ErrPeerSilent", err)
		}
		h.done <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("silent peer not detected")
	}
}

// TestLoopWindowAndConfirmation: at most MaxInFlight batches are
// unacknowledged; the last chunk of a revision carries last_chunk as soon as
// the revision's last event is in it (no quiet period); a revision with
// nothing for the peer is stamped by an empty marker after the delay.
func TestLoopWindowAndConfirmation(t *testing.T) {
	store := newTestStore(t)
	writeGlobal(t, store, mesh("default"))
	rev, _ := store.Revision(context.Background())
	cfg := StreamConfig{MaxBatchBytes: MinMaxBatchBytes, MaxInFlight: 2, ResumeConfirmDelay: 5 * time.Second}
	h := startLoop(t, cfg, store, rev)
	h.stream.none(t) // resuming at the current revision: nothing to send

	var b storage.Batch
	for i := range 30 {
		r := timeout("p-"+itoa(i), "", "")
		r.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: "global"})
		b.Puts = append(b.Puts, r)
	}
	res, err := store.Apply(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	first, second := h.batch(), h.batch()
	h.stream.none(t) // window full
	if first.GetRevision() != res.Revision || first.GetLastChunk() {
		t.Errorf("first chunk: revision %d last %v", first.GetRevision(), first.GetLastChunk())
	}
	if second.GetChunkIndex() != first.GetChunkIndex()+1 {
		t.Errorf("chunk indexes %d, %d", first.GetChunkIndex(), second.GetChunkIndex())
	}
	got := len(first.GetUpserts()) + len(second.GetUpserts())
	last := second
	h.ack(first)
	h.ack(second)
	for got < 30 {
		last = h.batch()
		got += len(last.GetUpserts())
		h.ack(last)
	}
	if got != 30 || !last.GetLastChunk() || last.GetRevision() != res.Revision {
		t.Fatalf("resources %d; last chunk %v at revision %d, want last_chunk on the revision's final chunk", got,
			last.GetLastChunk(), last.GetRevision())
	}
	eventually(t, time.Second, "acked revision", func() bool {
		h.obs.mu.Lock()
		defer h.obs.mu.Unlock()
		return h.obs.st.RevisionAcked == res.Revision
	})
	h.stream.none(t) // no marker: the revision is stamped already

	// zone-1's own resource is not sent back to it: its revision is stamped
	// by an empty marker after the delay.
	own := timeout("own", "", "")
	own.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: "zone", resource.LabelZone: "zone-1"})
	if _, _, err := store.Put(context.Background(), own); err != nil {
		t.Fatal(err)
	}
	ownRev, _ := store.Revision(context.Background())
	h.stream.none(t)
	h.advance(5*time.Second, 2)
	marker := h.batch()
	if !marker.GetLastChunk() || marker.GetRevision() != ownRev || len(marker.GetUpserts()) != 0 {
		t.Fatalf("marker %v", marker)
	}
	h.ack(marker)

	// Later writes each arrive as a stamped batch.
	writeGlobal(t, store, timeout("x", "", ""))
	writeGlobal(t, store, timeout("y", "", ""))
	for n := 0; n < 2; {
		bb := h.batch()
		if !bb.GetLastChunk() {
			t.Errorf("batch of a complete revision without last_chunk: %v", bb)
		}
		n += len(bb.GetUpserts())
		h.ack(bb)
	}
}

// TestLoopGathersWhileAnswerPending: a change to an idle peer leaves at
// once; changes made while its batch is unanswered leave together, as one
// stamped batch, when the answer arrives (a busy peer gets fewer, larger
// batches). The window would allow more batches: it is the partial batch
// that waits.
func TestLoopGathersWhileAnswerPending(t *testing.T) {
	h, store := startCurrentLoop(t, StreamConfig{MaxInFlight: 8})

	writeGlobal(t, store, timeout("first", "", ""))
	first := h.batch()
	if len(first.GetUpserts()) != 1 || !first.GetLastChunk() {
		t.Fatalf("first batch: %v", first)
	}
	for _, name := range []string{"a", "b", "c"} {
		writeGlobal(t, store, timeout(name, "", ""))
	}
	last, _ := store.Revision(context.Background())
	h.stream.none(t) // gathered, not sent: first is unanswered
	h.ack(first)
	gathered := h.batch()
	var names []string
	for _, u := range gathered.GetUpserts() {
		base, _, _ := strings.Cut(u.GetName(), "-") // the zone's names carry a hash
		names = append(names, base)
	}
	if strings.Join(names, ",") != "a,b,c" || !gathered.GetLastChunk() || gathered.GetRevision() != last {
		t.Fatalf("gathered batch: upserts %v, last_chunk %v, revision %d (want a,b,c, true, %d)",
			names, gathered.GetLastChunk(), gathered.GetRevision(), last)
	}
	h.ack(gathered)
	h.stream.none(t)
}

// TestLoopPacesBusyStream: after a batch of several changes, what gathers
// leaves as one batch when the spacing has passed (BatchInterval, or four
// times the peer's answer time when longer), not with the next answer.
func TestLoopPacesBusyStream(t *testing.T) {
	h, store := startCurrentLoop(t, StreamConfig{BatchInterval: 10 * time.Millisecond})
	writeGlobal(t, store, timeout("a", "", ""))
	first := h.batch()
	// Two changes gather while a is unanswered: a batch of two makes the
	// stream busy.
	writeGlobal(t, store, timeout("b", "", ""))
	writeGlobal(t, store, timeout("c", "", ""))
	h.stream.none(t)
	h.ack(first)
	gathered := h.batch()
	if len(first.GetUpserts()) != 1 || len(gathered.GetUpserts()) != 2 {
		t.Fatalf("batches of %d and %d changes, want 1 and 2", len(first.GetUpserts()), len(gathered.GetUpserts()))
	}
	h.advance(2500*time.Microsecond, 1) // the peer answers in 2.5 ms: spacing answerShare (8) × 2.5 ms = 20 ms
	h.ack(gathered)
	writeGlobal(t, store, timeout("f", "", ""))
	writeGlobal(t, store, timeout("g", "", ""))
	h.stream.none(t)                 // after a batch of two, f and g wait for the pacer
	h.advance(4*time.Millisecond, 3) // heartbeat, confirmation, pacer
	writeGlobal(t, store, timeout("h", "", ""))
	last, _ := store.Revision(context.Background())
	h.stream.none(t)                 // h joins them: the burst goes on
	h.advance(6*time.Millisecond, 3) // the pacer fires 10 ms after g; h came 6 ms ago
	h.stream.none(t)
	h.advance(4*time.Millisecond, 3) // quiet for 10 ms since h: the tail leaves before the 20 ms spacing
	paced := h.batch()
	if len(paced.GetUpserts()) != 3 || !paced.GetLastChunk() || paced.GetRevision() != last {
		t.Fatalf("paced batch: %d upserts, last_chunk %v, revision %d (want 3, true, %d)",
			len(paced.GetUpserts()), paced.GetLastChunk(), paced.GetRevision(), last)
	}
	h.ack(paced)
	h.stream.none(t)
}

// TestLoopSingleChangesNotPaced: one change at a time, each answered before
// the next, leaves at once every time, however close together.
func TestLoopSingleChangesNotPaced(t *testing.T) {
	h, store := startCurrentLoop(t, StreamConfig{BatchInterval: time.Hour})
	for i := range 20 {
		writeGlobal(t, store, timeout("single-"+itoa(i), "", ""))
		b := h.batch()
		if len(b.GetUpserts()) != 1 {
			t.Fatalf("change %d: %v", i, b)
		}
		h.ack(b)
	}
}

// TestLoopDrainSendsGathered: a graceful end does not wait for the answer
// that a gathered batch waits for: what gathered leaves at once, stamped.
func TestLoopDrainSendsGathered(t *testing.T) {
	h, store := startCurrentLoop(t, StreamConfig{})
	writeGlobal(t, store, timeout("first", "", ""))
	first := h.batch()
	writeGlobal(t, store, timeout("second", "", ""))
	last, _ := store.Revision(context.Background())
	h.stream.none(t)
	close(h.drain)
	gathered := h.batch()
	if len(gathered.GetUpserts()) != 1 || !gathered.GetLastChunk() || gathered.GetRevision() != last {
		t.Fatalf("at the drain: %d upserts, last_chunk %v, revision %d (want 1, true, %d)",
			len(gathered.GetUpserts()), gathered.GetLastChunk(), gathered.GetRevision(), last)
	}
	h.ack(first)
	h.ack(gathered)
}

func TestLoopNackBackoff(t *testing.T) {
	store := newTestStore(t)
	writeGlobal(t, store, mesh("default"))
	rev, _ := store.Revision(context.Background())
	cfg := StreamConfig{NackBackoff: 10 * time.Second, MaxNackBackoff: 40 * time.Second, ResumeConfirmDelay: time.Hour}
	h := startLoop(t, cfg, store, rev)
	writeGlobal(t, store, timeout("bad", "", ""))
	b := h.batch()
	up := b.GetUpserts()[0]
	nack := func(b *syncv1.DeltaBatch) {
		h.stream.in <- msgNack(&syncv1.Nack{Nonce: b.GetNonce(), Errors: []*syncv1.ResourceError{
			{Key: keyToWire(wireKeyOf(up)), Message: "no"}}})
	}
	nack(b)
	h.stream.none(t)             // no resend before the backoff
	h.advance(12*time.Second, 2) // heartbeat and retry (the batch was stamped: no confirmation timer)
	retry := h.batch()
	if retry.GetRevision() != 0 || retry.GetLastChunk() || retry.GetUpserts()[0].GetName() != up.GetName() {
		t.Fatalf("retry batch %v", retry)
	}
	nack(retry)
	h.advance(12*time.Second, 2)
	h.stream.none(t) // the second backoff is about twice as long
	h.advance(12*time.Second, 2)
	retry = h.batch()
	h.ack(retry)
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	if h.obs.st.BatchesNacked != 2 || h.obs.st.LastNackError == "" {
		t.Errorf("status %+v", h.obs.st)
	}
}

func TestLoopResumeAheadSendsSnapshot(t *testing.T) {
	store := newTestStore(t)
	writeGlobal(t, store, mesh("default"))
	h := startLoop(t, StreamConfig{}, store, 1000) // a resume point from another store
	if b := h.batch(); !b.GetFullSnapshot() || len(b.GetUpserts()) != 1 {
		t.Fatalf("batch %v", b)
	}
}

// TestSnapshotChunksRamp: a full snapshot starts with a chunk of a
// sixteenth of the batch limit and doubles until chunks are full size, so
// the peer gets its first resources to validate early.
func TestSnapshotChunksRamp(t *testing.T) {
	store := newTestStore(t)
	writeGlobal(t, store, mesh("default"))
	var b storage.Batch
	for i := range 400 {
		b.Puts = append(b.Puts, timeout("p-"+itoa(i), "", ""))
	}
	if _, err := store.Apply(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	const limit = 32 << 10
	h := startLoop(t, StreamConfig{MaxBatchBytes: limit}, store, 1000) // no usable resume point: a full snapshot
	var counts []int
	for {
		c := h.batch()
		if !c.GetFullSnapshot() || c.GetChunkIndex() != uint32(len(counts)) {
			t.Fatalf("chunk %d: %v", len(counts), c)
		}
		if size := proto.Size(c); size > limit>>max(snapshotRamp-len(counts), 0) {
			t.Errorf("chunk %d: %d bytes, over its ramp limit", len(counts), size)
		}
		counts = append(counts, len(c.GetUpserts()))
		h.ack(c)
		if c.GetLastChunk() {
			break
		}
	}
	total := 0
	for i, n := range counts {
		total += n
		if i > 0 && i <= snapshotRamp && n < counts[i-1] && i < len(counts)-1 {
			t.Errorf("chunk %d holds %d resources, fewer than chunk %d (%d): %v", i, n, i-1, counts[i-1], counts)
		}
	}
	if total != 401 || len(counts) <= snapshotRamp+1 || counts[0]*8 > counts[snapshotRamp] {
		t.Fatalf("chunks %v (%d resources): want 401 resources over a ramp of %d chunks to full size", counts, total, snapshotRamp)
	}
}

// TestSnapshotChunkWaitsForSender: a snapshot chunk is mapped only once the
// sender took the previous one, so the first chunk leaves without waiting
// for the mapping of the whole window's worth.
func TestSnapshotChunkWaitsForSender(t *testing.T) {
	store := newTestStore(t)
	for i := range 50 {
		writeGlobal(t, store, timeout("p-"+itoa(i), "", ""))
	}
	cfg, err := StreamConfig{MaxBatchBytes: MinMaxBatchBytes, MaxInFlight: 8}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	var emitted, queued int
	tr := newTracker(newFakeClock(), nil)
	_, g2z, _ := tr.connected("zone-1", &syncv1.Handshake{}, "kubernetes", 0)
	o := newOutbound(cfg.outbound(), store, globalSource{reg: testRegistry, zone: "zone-1"}, testLogger(t, "out"),
		newFakeClock(), g2z, func(*syncv1.Message) { emitted++; queued++ }, func() int { return queued })
	if err := o.start(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := o.pump(); err != nil {
			t.Fatal(err)
		}
		if emitted != 1 || !o.sendingSnapshot() {
			t.Fatalf("%d chunks mapped while the first waits for the sender", emitted)
		}
	}
	queued = 0 // the sender took it
	if _, err := o.pump(); err != nil {
		t.Fatal(err)
	}
	if emitted != 2 {
		t.Fatalf("%d chunks mapped after the sender took the first, want 2", emitted)
	}
}

// TestInboundSnapshotStaging: nothing of a snapshot is applied before its
// last chunk; then absent zone resources are deleted in the same write.
func TestInboundSnapshotStaging(t *testing.T) {
	store := newTestStore(t)
	zone := zonePlane("zone-1", plane.EnvUniversal)
	tr := newTracker(newFakeClock(), nil)
	_, _, z2g := tr.connected("zone-1", &syncv1.Handshake{}, "universal", 0)
	in := &inbound{store: store, metaKey: MetaKeyZoneRevision("zone-1"), log: testLogger(t, "in"), obs: z2g, clock: newFakeClock(),
		sink: globalSink{reg: testRegistry, store: store, zone: zone, global: testGlobal}}
	ctx := context.Background()
	// The global holds an old resource of zone-1 and one of zone-2.
	for _, r := range []*resource.Resource{timeout("old", "", ""), timeout("kept", "", "")} {
		g, err := mapping.FromZone(mustDesc(t, "MeshTimeout"), r, zone, plane.DefaultSystemNamespace)
		if err != nil {
			t.Fatal(err)
		}
		put(t, store, g)
	}
	other, _ := mapping.FromZone(mustDesc(t, "MeshTimeout"), timeout("other", "", plane.DefaultSystemNamespace), zonePlane("zone-2", plane.EnvUniversal), plane.DefaultSystemNamespace)
	put(t, store, other)
	chunk := func(i uint32, last bool, names ...string) *syncv1.DeltaBatch {
		b := &syncv1.DeltaBatch{Nonce: itoa(int(i)), Revision: 9, FullSnapshot: true, ChunkIndex: i, LastChunk: last}
		for _, n := range names {
			b.Upserts = append(b.Upserts, toWire(timeout(n, "", "")))
		}
		return b
	}
	if m, err := in.handle(ctx, chunk(0, false, "kept", "new-1")); err != nil || m.GetAck() == nil {
		t.Fatalf("chunk 0: %v %v", m, err)
	}
	if exists(store, "MeshTimeout", "default", mapping.HashedName("default", "new-1", "zone-1")) {
		t.Fatal("snapshot chunk applied before the last chunk")
	}
	if _, err := in.handle(ctx, chunk(2, true)); !errors.Is(err, errProtocol) {
		t.Fatalf("out-of-order chunk: %v", err)
	}
	in.handle(ctx, chunk(0, false, "kept", "new-1"))
	if m, err := in.handle(ctx, chunk(1, true, "new-2")); err != nil || m.GetAck() == nil {
		t.Fatalf("last chunk: %v %v", m, err)
	}
	want := []string{mapping.HashedName("default", "kept", "zone-1"), mapping.HashedName("default", "new-1", "zone-1"),
		mapping.HashedName("default", "new-2", "zone-1"), other.Name}
	for _, n := range want {
		if !exists(store, "MeshTimeout", "default", n) {
			t.Errorf("missing %s", n)
		}
	}
	if exists(store, "MeshTimeout", "default", mapping.HashedName("default", "old", "zone-1")) {
		t.Error("zone resource absent from the snapshot not deleted")
	}
	if rev, _ := readRevision(ctx, store, MetaKeyZoneRevision("zone-1")); rev != 9 {
		t.Errorf("resume revision %d", rev)
	}
}

// TestInboundStreamsWhenChunksComeQuickly: a snapshot is written into the
// store as it arrives only when its second chunk came within
// streamStartGap of the first, and only where streaming is allowed; the
// first chunks are then handed over together. Either way the whole
// snapshot lands.
func TestInboundStreamsWhenChunksComeQuickly(t *testing.T) {
	for _, tt := range []struct {
		name     string
		allowed  bool
		gap      time.Duration
		chunks   int
		streamed bool
	}{
		{"chunks in quick succession", true, 10 * time.Millisecond, 3, true},
		{"a slow link", true, time.Second, 3, false},
		{"a snapshot of one chunk", true, 0, 1, false},
		{"streaming not allowed (the global)", false, 0, 3, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			counted := &streamCounter{Store: openStore(t, filepath.Join(t.TempDir(), "s.db"), storeOpts{})}
			t.Cleanup(func() { _ = counted.Close() })
			zone := zonePlane("zone-1", plane.EnvUniversal)
			tr := newTracker(newFakeClock(), nil)
			_, _, z2g := tr.connected("zone-1", &syncv1.Handshake{}, "universal", 0)
			clock := newFakeClock()
			in := &inbound{store: counted, metaKey: MetaKeyZoneRevision("zone-1"), log: testLogger(t, "in"), obs: z2g, clock: clock,
				sink: globalSink{reg: testRegistry, store: counted, zone: zone, global: testGlobal}, streamSnapshots: tt.allowed}
			ctx := context.Background()
			for i := range tt.chunks {
				b := &syncv1.DeltaBatch{Nonce: itoa(i), Revision: 9, FullSnapshot: true, ChunkIndex: uint32(i), LastChunk: i == tt.chunks-1}
				for j := range 3 {
					b.Upserts = append(b.Upserts, toWire(timeout("t-"+itoa(i*3+j), "", "")))
				}
				if m, err := in.handle(ctx, b); err != nil || m.GetAck() == nil {
					t.Fatalf("chunk %d: %v %v", i, m, err)
				}
				clock.Advance(tt.gap)
			}
			if n := count(t, counted.Store, "MeshTimeout"); n != 3*tt.chunks {
				t.Errorf("%d MeshTimeouts stored, want %d", n, 3*tt.chunks)
			}
			if begun, committed := counted.begun.Load(), counted.committed.Load(); (begun == 1 && committed == 1) != tt.streamed || begun > 1 {
				t.Errorf("streams begun %d, committed %d; want streamed %v", begun, committed, tt.streamed)
			}
		})
	}
}

func mustDesc(t *testing.T, name string) *resource.TypeDescriptor {
	d, ok := testRegistry.Lookup(name)
	if !ok {
		t.Fatal(name)
	}
	return d
}
