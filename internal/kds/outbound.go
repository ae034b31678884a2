package kds

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// source is what one end sends to its peer: the scope filter and mapping of
// its store's resources (global -> one zone, or zone -> global).
type source interface {
	// put maps a stored resource to the copy to send, or to the key the
	// peer must remove, or to neither (skip). A copy may be shared with
	// other sessions: it is never written.
	put(r *resource.Resource) (send *wireCopy, remove *resource.Key)
	// remove maps a deletion (the tombstone keeps key and last labels) to
	// the key the peer must remove, or nil.
	remove(tomb *resource.Resource) *resource.Key
	// snapshotTypes lists the types a full snapshot covers.
	snapshotTypes() []string
}

// relayTracker is a source whose removals of resources relayed from other
// zones are sent only for what the peer was sent (globalSource): without it
// every write of another zone's non-relayed policy sent each zone a
// removal.
type relayTracker interface {
	relayedFromZone(r *resource.Resource) bool
	relayTypes() []string
}

// outboundConfig are the sender's limits (validated by the constructors).
type outboundConfig struct {
	maxBatchBytes  int
	maxInFlight    int
	confirmDelay   time.Duration
	nackBackoff    time.Duration
	maxNackBackoff time.Duration
	batchInterval  time.Duration // pacer.interval
}

// batchOverhead leaves room for a DeltaBatch's own fields under the limit.
const batchOverhead = 256

// outbound is the sending half of a session. It is owned by the session's
// loop goroutine; nothing in it is safe for concurrent use.
//
// Revisions. Events arrive in revision order, and the store's watch marks the
// last event of each revision (storage.Event.Last): a revision is complete as
// soon as that event is consumed. A batch that ends with a complete revision
// is sent with last_chunk (the receiver records it as its resume point); one
// cut earlier (size, or the watch pausing between read chunks) is sent
// without, and the revision's last chunk follows. So the receiver never
// records a revision of which it may lack a part, it records each one as soon
// as it has it, and a reconnect resends exactly what it had not applied.
// Revisions with nothing for the peer (every event out of its scope) are
// stamped by an empty last_chunk batch after confirmDelay of quiet, or at
// once when the session drains for a graceful end; that only keeps the
// peer's resume point recent (a replay skips them anyway).
type outbound struct {
	cfg   outboundConfig
	store Store
	src   source
	log   hclog.Logger
	clock Clock
	obs   flowObserver
	emit  func(*syncv1.Message)
	// backlog counts the messages emitted and not yet taken by the sender.
	// A full snapshot maps its next chunk only when that is zero (the
	// session pumps again when the sender takes one): mapping every chunk
	// the window allows before the first one left delayed it by all of
	// their mapping, and the peer waited with nothing to validate.
	backlog func() int

	events   <-chan storage.Event
	snapshot *snapshotIter // a full snapshot being sent
	// listed holds the version of every resource the snapshot listed, until
	// the watch has passed listedUntil (the revision after listing): a write
	// that raced with the listing is then not sent a second time.
	listed      map[resource.Key]uint64
	listedUntil uint64

	pending  batchBuilder
	seen     uint64 // revision of the last consumed store event
	complete uint64 // highest revision whose last event was consumed
	stamped  uint64 // highest revision sent with last_chunk
	runRev   uint64 // revision of the current run of chunks
	runIndex uint32 // next chunk_index in that run

	nonce    uint64
	inflight map[string]*flight

	// rej records what the peer rejected (for the resources' status); nil
	// records nothing.
	rej *rejections

	// relayed holds the local keys of resources relayed from other zones
	// that the peer holds (relayTracker sources). It is exact for events
	// after trackedFrom (the revision read after listing them); removals of
	// earlier events are sent unconditionally, as they may concern what
	// the listing did not see.
	relayed     map[resource.Key]bool
	trackedFrom uint64
	tracking    bool

	// draining: the session is ending; nothing more is read from the watch.
	draining bool

	confirm    optTimer
	retry      optTimer
	pacer      pacer
	paced      optTimer // a partial batch waits for the pacer
	retryKeys  map[resource.Key]struct{}
	nackStreak int
}

// flight is one batch awaiting its Ack or Nack.
type flight struct {
	summary batchSummary
	types   []string
	sentAt  time.Time
	retry   bool
	partial bool // a partial batch (its answer time paces the stream)
	// entries map each wire key of the batch to the sender's store key, to
	// retry NACKed resources.
	entries []entry
}

func newOutbound(cfg outboundConfig, store Store, src source, log hclog.Logger, clock Clock, obs flowObserver,
	emit func(*syncv1.Message), backlog func() int) *outbound {
	return &outbound{
		cfg: cfg, store: store, src: src, log: log, clock: clock, obs: obs, emit: emit, backlog: backlog,
		inflight:  map[string]*flight{},
		retryKeys: map[resource.Key]struct{}{},
		confirm:   optTimer{clock: clock},
		retry:     optTimer{clock: clock},
		pacer:     pacer{interval: cfg.batchInterval},
		paced:     optTimer{clock: clock},
		pending:   newBatchBuilder(),
	}
}

// start opens the store watch from the peer's resume point, or prepares a
// full snapshot when there is none, it lies in the future (the store was
// replaced), or the history no longer reaches back to it.
func (o *outbound) start(ctx context.Context, resume uint64) error {
	if err := o.startWatch(ctx, resume); err != nil {
		return err
	}
	return o.trackRelayed(ctx)
}

// trackRelayed lists what the peer holds of the resources relayed from other
// zones (see relayed).
func (o *outbound) trackRelayed(ctx context.Context) error {
	rt, ok := o.src.(relayTracker)
	if !ok {
		return nil
	}
	o.relayed = map[resource.Key]bool{}
	for _, typ := range rt.relayTypes() {
		list, err := o.store.List(ctx, storage.ListOptions{Type: typ, Labels: map[string]string{resource.LabelOrigin: resource.OriginZone}})
		if err != nil {
			return fmt.Errorf("list relayed %s: %w", typ, err)
		}
		for _, r := range list.Items {
			if send, _ := o.src.put(r); send != nil && rt.relayedFromZone(r) {
				o.relayed[r.Key()] = true
			}
		}
	}
	rev, err := o.store.Revision(ctx)
	if err != nil {
		return fmt.Errorf("read store revision: %w", err)
	}
	o.trackedFrom, o.tracking = rev, true
	return nil
}

func (o *outbound) startWatch(ctx context.Context, resume uint64) error {
	current, err := o.store.Revision(ctx)
	if err != nil {
		return fmt.Errorf("read store revision: %w", err)
	}
	if resume > 0 && resume <= current {
		events, err := o.store.Watch(ctx, resume)
		if err == nil {
			o.events, o.seen, o.stamped, o.complete = events, resume, resume, resume
			o.log.Debug("resuming", "from_revision", resume, "store_revision", current)
			return nil
		}
		if !errors.Is(err, storage.ErrCompacted) {
			return fmt.Errorf("watch store from %d: %w", resume, err)
		}
		o.log.Info("resume point compacted, sending a full snapshot", "resume_revision", resume)
	} else if resume > current {
		o.log.Warn("peer's resume point is ahead of this store, sending a full snapshot", "resume_revision", resume, "store_revision", current)
	}
	return o.startSnapshot(ctx)
}

// startSnapshot watches from the current revision first and lists
// afterwards, so that every change after the listed state reaches the peer
// through the watch (a change seen twice is harmless).
func (o *outbound) startSnapshot(ctx context.Context) error {
	var rev uint64
	for attempt := 0; ; attempt++ {
		var err error
		if rev, err = o.store.Revision(ctx); err != nil {
			return fmt.Errorf("read store revision: %w", err)
		}
		o.events, err = o.store.Watch(ctx, rev)
		if err == nil {
			break
		}
		if !errors.Is(err, storage.ErrCompacted) || attempt == 3 {
			return fmt.Errorf("watch store from %d: %w", rev, err)
		}
	}
	it, err := o.listSnapshot(ctx, rev)
	if err != nil {
		return err
	}
	if o.listedUntil, err = o.store.Revision(ctx); err != nil {
		return fmt.Errorf("read store revision: %w", err)
	}
	o.snapshot, o.seen, o.stamped, o.complete = it, rev, rev, rev
	o.log.Info("sending full snapshot", "revision", rev, "listed", len(it.items))
	return nil
}

// snapshotIter produces the chunks of a full snapshot on demand, so the
// first chunk leaves while the rest are still being mapped (the receiver
// validates one chunk while the next is built).
type snapshotIter struct {
	rev   uint64
	items []*resource.Resource // listed resources of every snapshot type
	pos   int
	index uint32
	done  bool
}

// listSnapshot lists every resource of the snapshot types.
func (o *outbound) listSnapshot(ctx context.Context, rev uint64) (*snapshotIter, error) {
	it := &snapshotIter{rev: rev}
	for _, typ := range o.src.snapshotTypes() {
		list, err := o.store.List(ctx, storage.ListOptions{Type: typ})
		if err != nil {
			return nil, fmt.Errorf("list %s for snapshot: %w", typ, err)
		}
		it.items = append(it.items, list.Items...)
	}
	o.listed = make(map[resource.Key]uint64, len(it.items))
	return it, nil
}

// nextChunk maps listed resources until the batch is full; the final chunk
// (possibly empty, for an empty snapshot) carries last_chunk.
func (o *outbound) nextChunk(it *snapshotIter) (*syncv1.DeltaBatch, []entry) {
	b := newBatchBuilder()
	for ; it.pos < len(it.items); it.pos++ {
		r := it.items[it.pos]
		send, _ := o.src.put(r)
		if send == nil {
			continue
		}
		e := putEntry(r.Key(), send)
		if b.len() > 0 && b.size+e.size > o.chunkLimit(it.index) {
			break
		}
		o.listed[r.Key()] = r.Version
		b.add(e)
	}
	entries := b.entries
	batch := b.build()
	it.done = it.pos == len(it.items)
	batch.Revision, batch.FullSnapshot, batch.LastChunk, batch.ChunkIndex = it.rev, true, it.done, it.index
	it.index++
	if it.done {
		it.items = nil
	}
	return batch, entries
}

func (o *outbound) limit() int { return o.cfg.maxBatchBytes - batchOverhead }

// snapshotRamp is how many chunks a full snapshot takes to reach the batch
// limit: chunk 0 is limit/2^snapshotRamp, each next one twice as large. The
// receiver gets its first resources to validate after a small chunk's
// mapping, encoding and transfer instead of a full one's, and the stages on
// both sides overlap from the start; later chunks are full size.
const snapshotRamp = 4

// chunkLimit is the size limit of snapshot chunk index.
func (o *outbound) chunkLimit(index uint32) int {
	if index >= snapshotRamp {
		return o.limit()
	}
	return max(o.limit()>>(snapshotRamp-index), 1)
}

func (o *outbound) windowOpen() bool { return len(o.inflight) < o.cfg.maxInFlight }

// eventsC is the watch channel while the loop may consume events (not while
// draining: what is sent then is what was there when the drain began).
func (o *outbound) eventsC(draining bool) <-chan storage.Event {
	if draining || !o.windowOpen() || o.snapshot != nil {
		return nil
	}
	return o.events
}

// errWatchClosed: the store watch ended (store closed or log unreadable).
var errWatchClosed = errors.New("store watch ended")

// pump sends snapshot chunks, then consumes the store events already
// available, while the window has room; when the watch has nothing more for
// now it flushes the partial batch. It reports whether the watch was found
// empty.
func (o *outbound) pump() (drained bool, err error) {
	for o.windowOpen() {
		if o.snapshot != nil {
			if o.backlog() > 0 {
				return false, nil // the next chunk is mapped once the sender took this one
			}
			o.send(o.nextChunk(o.snapshot))
			if o.snapshot.done {
				o.snapshot = nil
			}
			continue
		}
		if o.draining {
			return true, nil // a drain sends what was there when it began
		}
		select {
		case ev, ok := <-o.events:
			if !ok {
				return false, errWatchClosed
			}
			o.accept(ev)
		default:
			o.flushIdle()
			return true, nil
		}
	}
	return false, nil
}

// accept adds one store event to the pending batch, cutting the batch
// first when the event would overflow it.
func (o *outbound) accept(ev storage.Event) {
	newRevision := ev.Revision > o.seen
	e, ok := o.mapEvent(ev)
	if ok && o.pending.len() > 0 && o.pending.size+e.size > o.limit() {
		// The pending batch is complete through o.seen if that revision's
		// last event is in it, or this event starts a later revision.
		o.cut(o.seen, o.complete >= o.seen || newRevision)
	}
	if newRevision {
		o.seen = ev.Revision
	}
	if ev.Last {
		o.complete = max(o.complete, ev.Revision)
	}
	if ok {
		o.pending.add(e)
	}
}

func (o *outbound) mapEvent(ev storage.Event) (entry, bool) {
	if o.listed != nil {
		key := ev.Resource.Key()
		v, ok := o.listed[key]
		switch {
		case ev.Revision > o.listedUntil:
			o.listed = nil
		case ok && ev.Kind == storage.EventDelete:
			// A re-creation after this delete may have the listed
			// version again: it must not be mistaken for the listed one.
			delete(o.listed, key)
		case ok && v == ev.Resource.Version:
			return entry{}, false // the snapshot carried this very version
		}
	}
	key := ev.Resource.Key()
	switch ev.Kind {
	case storage.EventPut:
		send, remove := o.src.put(ev.Resource)
		switch {
		case send != nil:
			if o.relayed != nil && o.src.(relayTracker).relayedFromZone(ev.Resource) {
				o.relayed[key] = true
			}
			return putEntry(key, send), true
		case remove != nil:
			if o.relayed != nil && o.src.(relayTracker).relayedFromZone(ev.Resource) {
				held := o.relayed[key]
				delete(o.relayed, key)
				if !held && o.tracking && ev.Revision > o.trackedFrom {
					return entry{}, false // never sent to this peer: nothing to remove
				}
			}
			return newEntry(key, nil, remove), true
		}
	case storage.EventDelete:
		if o.relayed != nil {
			delete(o.relayed, key)
		}
		if k := o.src.remove(ev.Resource); k != nil {
			return newEntry(key, nil, k), true
		}
	}
	return entry{}, false
}

// flushIdle sends what is pending, with last_chunk when its last revision is
// complete; revisions that sent nothing are stamped later (see outbound).
//
// A partial batch waits while an earlier batch is unanswered: the reply
// pumps again and sends what gathered meanwhile as one batch. An idle peer
// so gets a change at once, and a busy one fewer, larger batches (one
// transaction with its fsyncs on its side per batch, one frame here)
// instead of one per local commit; a full batch leaves as soon as the
// window allows. The pacer spaces partial batches further while a stream is
// busy (see pacer); the paced timer pumps again when the next may leave.
func (o *outbound) flushIdle() {
	if o.pending.len() > 0 && o.idle() {
		now := o.clock.Now()
		if wait := o.pacer.wait(now, o.pending.len()); wait > 0 {
			o.paced.armIfIdle(wait)
		} else {
			o.pacer.sent(now, o.pending.len())
			o.cut(o.seen, o.complete >= o.seen).partial = true
		}
	}
	if o.seen > o.stamped {
		o.confirm.armIfIdle(o.cfg.confirmDelay)
	}
}

// onConfirm runs when the confirmation timer fires: if the watch is still
// quiet and the last revision is complete, an empty last_chunk batch lets
// the peer record it (revisions that had nothing for the peer).
func (o *outbound) onConfirm() error {
	o.confirm.fired()
	drained, err := o.pump()
	if err != nil {
		return err
	}
	if o.seen <= o.stamped {
		return nil
	}
	if !drained || o.pending.len() > 0 || !o.windowOpen() || o.complete < o.seen {
		o.confirm.arm(o.cfg.confirmDelay)
		return nil
	}
	o.send(&syncv1.DeltaBatch{Revision: o.seen, BaseRevision: o.stamped, LastChunk: true}, nil)
	return nil
}

// onPaced runs when the pacer lets the next partial batch leave.
func (o *outbound) onPaced() error {
	o.paced.fired()
	_, err := o.pump()
	return err
}

// flushForDrain sends, within the window, what the watch holds and the
// stamp of the last complete revision at once (no quiet period), so that
// the peer's resume point is current when the stream ends.
func (o *outbound) flushForDrain() {
	defer func() { o.draining = true }()
	if o.snapshot != nil {
		return // an unfinished snapshot is resent in full anyway
	}
	if drained, err := o.pump(); err != nil || !drained {
		return
	}
	if o.pending.len() > 0 && o.windowOpen() {
		o.cut(o.seen, o.complete >= o.seen) // no waiting for replies: the stream ends
	}
	o.confirm.stop()
	if o.seen > o.stamped && o.complete >= o.seen && o.pending.len() == 0 && o.windowOpen() {
		o.send(&syncv1.DeltaBatch{Revision: o.seen, BaseRevision: o.stamped, LastChunk: true}, nil)
	}
}

// sendingSnapshot reports that a full snapshot has chunks left to map.
func (o *outbound) sendingSnapshot() bool { return o.snapshot != nil }

// idle reports that every batch sent was answered.
func (o *outbound) idle() bool { return len(o.inflight) == 0 }

// cut sends the pending batch stamped with revision rev.
func (o *outbound) cut(rev uint64, last bool) *flight {
	entries := o.pending.entries
	batch := o.pending.build()
	batch.Revision, batch.BaseRevision, batch.LastChunk = rev, o.stamped, last
	return o.send(batch, entries)
}

// send assigns the nonce and chunk index, records the flight and hands the
// batch to the sender.
func (o *outbound) send(b *syncv1.DeltaBatch, entries []entry) *flight {
	return o.sendBatch(b, entries, false)
}

func (o *outbound) sendBatch(b *syncv1.DeltaBatch, entries []entry, retry bool) *flight {
	o.nonce++
	b.Nonce = strconv.FormatUint(o.nonce, 10)
	if !b.FullSnapshot && !retry {
		if b.Revision != o.runRev {
			o.runRev, o.runIndex = b.Revision, 0
		}
		b.ChunkIndex = o.runIndex
		o.runIndex++
		if b.LastChunk {
			o.stamped = max(o.stamped, b.Revision)
		}
	}
	summary := summarize(b)
	f := &flight{summary: summary, types: summary.types(), sentAt: o.clock.Now(), retry: retry, entries: entries}
	o.inflight[b.Nonce] = f
	o.obs.batchSent(f.types, f.summary)
	o.emit(msgBatch(b))
	return f
}

// onReply classifies the peer's answer to one of our batches: the only
// place where Ack and Nack are interpreted. nack is nil for an Ack.
func (o *outbound) onReply(nonce string, nack *syncv1.Nack) error {
	f, ok := o.inflight[nonce]
	if !ok {
		return fmt.Errorf("reply for unknown batch nonce %q", nonce)
	}
	delete(o.inflight, nonce)
	took := o.clock.Now().Sub(f.sentAt)
	o.obs.batchAnswered(f.types, f.summary, nack, took)
	if f.partial {
		o.pacer.answered(took)
	}
	if o.rej != nil {
		o.rej.answered(f.entries, nack)
	}
	if nack == nil {
		if f.retry {
			o.nackStreak = 0
		}
		return nil
	}
	o.log.Warn("peer rejected resources", "nonce", nonce, "revision", f.summary.revision, "errors", nackSummary(nack))
	o.scheduleRetry(f, nack)
	return nil
}

// scheduleRetry remembers the rejected resources and resends them after a
// backoff that grows with consecutive rejections: the peer may accept them
// later (e.g. once a mesh they belong to has arrived), and a resource that
// stays invalid costs one batch per backoff period, not a hot loop.
func (o *outbound) scheduleRetry(f *flight, nack *syncv1.Nack) {
	locals := make(map[resource.Key]resource.Key, len(f.entries))
	for _, e := range f.entries {
		locals[e.wireKey] = e.local
	}
	for _, re := range nack.GetErrors() {
		if re.GetPermanent() {
			continue // refused until it changes: the watch sends its next version
		}
		if local, ok := locals[keyFromWire(re.GetKey())]; ok {
			o.retryKeys[local] = struct{}{}
		}
	}
	if len(o.retryKeys) == 0 {
		return
	}
	o.nackStreak++
	o.retry.arm(backoff(o.cfg.nackBackoff, o.cfg.maxNackBackoff, o.nackStreak))
}

// onRetry resends the current state of every rejected resource. Retry
// batches carry no revision: they do not move the peer's resume point.
func (o *outbound) onRetry(ctx context.Context) error {
	o.retry.fired()
	if !o.windowOpen() {
		o.retry.arm(o.cfg.nackBackoff)
		return nil
	}
	b := newBatchBuilder()
	for key := range o.retryKeys {
		delete(o.retryKeys, key)
		r, err := o.store.Get(ctx, key)
		if errors.Is(err, storage.ErrNotFound) {
			continue // its deletion went out through the watch
		}
		if err != nil {
			return fmt.Errorf("read %s for retry: %w", key, err)
		}
		send, remove := o.src.put(r)
		if send == nil && remove == nil {
			continue
		}
		e := newEntry(key, send, remove)
		if b.len() > 0 && b.size+e.size > o.limit() {
			entries := b.entries
			o.sendBatch(b.build(), entries, true)
		}
		b.add(e)
	}
	if b.len() > 0 {
		entries := b.entries
		o.sendBatch(b.build(), entries, true)
	}
	return nil
}

// backoff is base*2^(n-1), capped, with ±20% jitter so that many peers
// retrying after one event do not stay in step.
func backoff(base, maxDelay time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	jitter := time.Duration(rand.Int64N(int64(d)/5+1)) * 2
	return d - d/5 + jitter
}

// entry is one upsert or removal of a batch under construction.
type entry struct {
	wireKey resource.Key // the key the peer stores
	local   resource.Key // the key in this store
	up      *syncv1.Resource
	rm      *syncv1.ResourceKey
	size    int
}

// entryOverhead approximates the field tag and length prefix of an entry.
const entryOverhead = 8

// wireCopy is a resource as the peer receives it: the key it stores it
// under, its wire form and that form's size in a batch. The global's are
// shared by every session (zoneCopies) and never written.
type wireCopy struct {
	key  resource.Key
	up   *syncv1.Resource
	size int
}

func newWireCopy(send *resource.Resource) *wireCopy {
	up := toWire(send)
	return &wireCopy{key: send.Key(), up: up, size: proto.Size(up) + entryOverhead}
}

// putEntry is the entry sending send.
func putEntry(local resource.Key, send *wireCopy) entry {
	return entry{wireKey: send.key, local: local, up: send.up, size: send.size}
}

// newEntry is the entry sending send, or else removing remove.
func newEntry(local resource.Key, send *wireCopy, remove *resource.Key) entry {
	if send != nil {
		return putEntry(local, send)
	}
	k := keyToWire(*remove)
	return entry{wireKey: *remove, local: local, rm: k, size: proto.Size(k) + entryOverhead}
}

// batchBuilder accumulates entries, keeping only the last change per key
// (a batch applies puts before deletes, so a key must not be in both).
type batchBuilder struct {
	entries []entry
	// index finds a key's entry once a batch has more than
	// smallBatchEntries; a smaller one is searched in order. Most batches
	// carry one change, and the map each builder made (at creation and at
	// every reset) was most of what a session allocated per change.
	index map[resource.Key]int
	size  int
}

const smallBatchEntries = 8

func newBatchBuilder() batchBuilder { return batchBuilder{} }

func (b *batchBuilder) len() int { return len(b.entries) }

func (b *batchBuilder) add(e entry) {
	if i, ok := b.find(e.wireKey); ok {
		b.size += e.size - b.entries[i].size
		b.entries[i] = e
		return
	}
	b.entries = append(b.entries, e)
	b.size += e.size
	switch {
	case b.index != nil:
		b.index[e.wireKey] = len(b.entries) - 1
	case len(b.entries) > smallBatchEntries:
		b.index = make(map[resource.Key]int, 2*len(b.entries))
		for i, e := range b.entries {
			b.index[e.wireKey] = i
		}
	}
}

func (b *batchBuilder) find(k resource.Key) (int, bool) {
	if b.index != nil {
		i, ok := b.index[k]
		return i, ok
	}
	for i := range b.entries {
		if b.entries[i].wireKey == k {
			return i, true
		}
	}
	return 0, false
}

// build returns the batch of the accumulated entries and resets the builder.
func (b *batchBuilder) build() *syncv1.DeltaBatch {
	batch := &syncv1.DeltaBatch{}
	for _, e := range b.entries {
		if e.up != nil {
			batch.Upserts = append(batch.Upserts, e.up)
		} else {
			batch.Removals = append(batch.Removals, e.rm)
		}
	}
	*b = newBatchBuilder()
	return batch
}

func (o *outbound) stopTimers() {
	o.confirm.stop()
	o.retry.stop()
	o.paced.stop()
}
