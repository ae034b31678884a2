package kds

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// sink is what one end does with its peer's resources: validation,
// authority checks and mapping to what it stores.
type sink interface {
	// upsert returns the resource to store for one received upsert; an
	// error rejects that resource only (it becomes a Nack entry).
	upsert(ctx context.Context, w *syncv1.Resource) (*resource.Resource, error)
	// removal returns the stored key to delete for one received removal;
	// ok is false when there is nothing to delete. An error rejects it.
	removal(ctx context.Context, k *syncv1.ResourceKey) (key resource.Key, ok bool, err error)
	// owned lists the stored resources that came from the peer: a full
	// snapshot deletes those it does not contain.
	owned(ctx context.Context) ([]resource.Key, error)
}

// inbound is the receiving half of a session: it applies the peer's batches
// and builds the answers. Owned by the session loop goroutine.
type inbound struct {
	store Store
	sink  sink
	// check, when set, gives the in-transaction precondition of each batch
	// (the global: admission's rule that a zone writes only its own
	// resources, into meshes that exist).
	check func(puts []*resource.Resource, deletes []resource.Key) func(storage.TxReader) ([]resource.Key, error)
	// onApplied runs after each successful store write, with what it
	// refused.
	onApplied func(rejected []*syncv1.ResourceError)
	metaKey   string
	// storeKey and peerStore: the peer's store id, recorded with every resume
	// point so that a replaced peer store is recognized (empty: not recorded).
	storeKey  string
	peerStore string
	log       hclog.Logger
	obs       flowObserver
	clock     Clock

	// applied is the peer revision recorded in Meta (the resume point).
	applied uint64

	// A full snapshot being received: staged until its last chunk, which
	// arrived stageStart after the first.
	staging    bool
	stageRev   uint64
	stageStart time.Time
	nextChunk  uint32
	staged     batchSet
	// streamSnapshots allows stream (sessionParams.streamSnapshots);
	// streamTried: this snapshot opened one already (it is not reopened
	// once it failed); lastChunk: when the previous chunk arrived.
	streamSnapshots bool
	streamTried     bool
	lastChunk       time.Time
	// stream, while a full snapshot is received into a store that takes a
	// batch in parts (storage.Streaming), writes each chunk as it comes,
	// so that little is left to write after the last one. The snapshot is
	// still staged in memory: if the stream fails (the store ends one that
	// stalls), the last chunk applies the staged whole instead. nil when
	// not streaming.
	stream storage.ApplyStream
}

// batchSet holds resources to put, the last one per key winning, with the
// key each came as on the wire (for NACKs). One map: a cold zone's full
// snapshot stages every resource here, and at 100,000 a second map keyed
// by resource.Key cost 9% of the cold zone's CPU profile in table growth.
type batchSet struct {
	puts  []*resource.Resource
	wires []*syncv1.ResourceKey // wires[i] is the key puts[i] came as
	index map[resource.Key]int
}

func (s *batchSet) add(r *resource.Resource, wire *syncv1.ResourceKey) {
	if s.index == nil {
		s.index = map[resource.Key]int{}
	}
	k := r.Key()
	if i, ok := s.index[k]; ok {
		s.puts[i], s.wires[i] = r, wire
		return
	}
	s.index[k] = len(s.puts)
	s.puts = append(s.puts, r)
	s.wires = append(s.wires, wire)
}

func (s *batchSet) has(k resource.Key) bool {
	_, ok := s.index[k]
	return ok
}

// wire is the key the resource stored under k came as; nil when k is not
// in the set.
func (s *batchSet) wire(k resource.Key) *syncv1.ResourceKey {
	if i, ok := s.index[k]; ok {
		return s.wires[i]
	}
	return nil
}

// errProtocol marks a peer that broke the protocol; the stream is closed
// and the resume logic starts over.
var errProtocol = errors.New("sync protocol violation")

// handle applies one batch and returns the Ack or Nack to send. An error
// (store failure, protocol violation) ends the stream: the batch is then
// neither acknowledged nor recorded, and the peer resends after
// reconnecting.
func (in *inbound) handle(ctx context.Context, b *syncv1.DeltaBatch) (*syncv1.Message, error) {
	var errs []*syncv1.ResourceError
	var err error
	if b.GetFullSnapshot() {
		errs, err = in.snapshotChunk(ctx, b)
	} else {
		errs, err = in.delta(ctx, b)
	}
	if err != nil {
		return nil, err
	}
	s := summarize(b)
	types := s.types()
	in.obs.batchSent(types, s)
	if len(errs) == 0 {
		in.obs.batchAnswered(types, s, nil, 0)
		return msgAck(&syncv1.Ack{Nonce: b.GetNonce(), Revision: b.GetRevision()}), nil
	}
	nack := &syncv1.Nack{Nonce: b.GetNonce(), Errors: errs}
	in.obs.batchAnswered(types, s, nack, 0)
	in.log.Warn("rejected resources from peer", "nonce", b.GetNonce(), "count", len(errs), "errors", nackSummary(nack))
	return msgNack(nack), nil
}

// delta applies a delta batch in one transaction with, when it completes a
// revision, that revision as the resume point.
func (in *inbound) delta(ctx context.Context, b *syncv1.DeltaBatch) ([]*syncv1.ResourceError, error) {
	// A delta's write would wait for the committer that an open stream
	// holds; the staged snapshot does not need it.
	in.endStream("a delta arrived during the snapshot", nil)
	var set batchSet
	_, errs := in.convert(ctx, b, &set)
	var deletes []resource.Key
	removed := map[resource.Key]*syncv1.ResourceKey{}
	for _, k := range b.GetRemovals() {
		key, ok, err := in.sink.removal(ctx, k)
		switch {
		case err != nil:
			errs = append(errs, &syncv1.ResourceError{Key: k, Message: err.Error()})
		case ok && !set.has(key):
			deletes = append(deletes, key)
			removed[key] = k
		}
	}
	record := b.GetLastChunk() && b.GetRevision() > in.applied
	// Owned: the puts were made for this batch from the peer's message
	// (convert) and are dropped after it, retry included.
	batch := storage.Batch{Puts: set.puts, Deletes: deletes, Owned: true}
	if record {
		batch.Meta = in.resumeMeta(b.GetRevision())
	}
	if len(batch.Puts)+len(batch.Deletes)+len(batch.Meta) > 0 {
		rejected, err := in.apply(ctx, batch, func(k resource.Key) *syncv1.ResourceKey {
			if w := set.wire(k); w != nil {
				return w
			}
			return removed[k]
		})
		if err != nil {
			return nil, fmt.Errorf("apply batch %s: %w", b.GetNonce(), err)
		}
		errs = append(errs, rejected...)
	}
	if record {
		in.applied = b.GetRevision()
	}
	return errs, nil
}

// snapshotChunk stages one chunk of a full snapshot; the last chunk applies
// the whole snapshot and deletes every peer resource absent from it, in one
// transaction, so the store never passes through a state without them.
// With a streaming store, that transaction is opened at the second chunk,
// when it came soon enough, and takes each chunk as it comes (see
// inbound.stream and streamStartGap).
func (in *inbound) snapshotChunk(ctx context.Context, b *syncv1.DeltaBatch) ([]*syncv1.ResourceError, error) {
	switch {
	case b.GetChunkIndex() == 0:
		in.endStream("a new snapshot started", nil)
		in.staging, in.stageRev, in.staged, in.stageStart = true, b.GetRevision(), batchSet{}, in.clock.Now()
		in.streamTried, in.lastChunk = false, in.stageStart
	case !in.staging || b.GetChunkIndex() != in.nextChunk || b.GetRevision() != in.stageRev:
		return nil, fmt.Errorf("%w: snapshot chunk %d of revision %d, expected chunk %d of revision %d",
			errProtocol, b.GetChunkIndex(), b.GetRevision(), in.nextChunk, in.stageRev)
	}
	in.nextChunk = b.GetChunkIndex() + 1
	now := in.clock.Now()
	gap := now.Sub(in.lastChunk)
	in.lastChunk = now
	accepted, errs := in.convert(ctx, b, &in.staged)
	switch {
	case in.stream != nil:
		if len(accepted) > 0 {
			if err := in.stream.Put(in.part(accepted, nil)); err != nil {
				in.endStream("the store refused a chunk", err)
			}
		}
	case b.GetChunkIndex() > 0 && !b.GetLastChunk() && !in.streamTried && gap <= streamStartGap:
		// A second chunk came soon after the first: the link keeps up, so
		// the rest is worth writing as it comes. A snapshot of one chunk,
		// or one over a link too slow to deliver a chunk in streamStartGap,
		// is applied whole and never holds the store's writers.
		in.streamTried = true
		in.beginStream(ctx)
		if in.stream != nil {
			if err := in.stream.Put(in.part(slices.Clone(in.staged.puts), nil)); err != nil {
				in.endStream("the store refused the first chunks", err)
			}
		}
	}
	if !b.GetLastChunk() {
		return errs, nil
	}
	owned, err := in.sink.owned(ctx)
	if err != nil {
		return nil, fmt.Errorf("list synced resources for snapshot: %w", err)
	}
	var deletes []resource.Key
	for _, k := range owned {
		if !in.staged.has(k) {
			deletes = append(deletes, k)
		}
	}
	meta := in.resumeMeta(b.GetRevision())
	start := in.clock.Now()
	streamed := in.commitStream(deletes, meta)
	if !streamed {
		batch := storage.Batch{Puts: in.staged.puts, Deletes: deletes, Meta: meta, Owned: true}
		rejected, err := in.apply(ctx, batch, in.staged.wire)
		if err != nil {
			return nil, fmt.Errorf("apply snapshot of revision %d: %w", b.GetRevision(), err)
		}
		errs = append(errs, rejected...)
	}
	received, applied := start.Sub(in.stageStart), in.clock.Now().Sub(start)
	in.obs.snapshotApplied(received, applied)
	in.log.Info("applied full snapshot", "revision", b.GetRevision(), "resources", len(in.staged.puts), "deleted", len(deletes),
		"chunks", in.nextChunk, "streamed", streamed, "receive_time", received, "apply_time", applied)
	in.applied = b.GetRevision()
	in.staging, in.staged = false, batchSet{}
	return errs, nil
}

// part is one stream part: puts with, when the end checks batches, the
// check of those puts and deletes.
func (in *inbound) part(puts []*resource.Resource, deletes []resource.Key) storage.Batch {
	b := storage.Batch{Puts: puts, Deletes: deletes, Owned: true}
	if in.check != nil {
		b.Check = in.check(puts, deletes)
	}
	return b
}

// beginStream opens a stream for the snapshot starting now, when this end
// streams snapshots and the store takes batches in parts. Failing to is
// not an error: the snapshot is then applied whole at its last chunk.
func (in *inbound) beginStream(ctx context.Context) {
	st, ok := in.store.(storage.Streaming)
	if !ok || !in.streamSnapshots {
		return
	}
	stream, err := st.BeginApply(ctx)
	if err != nil {
		in.log.Warn("cannot stream the snapshot into the store; applying it whole at its last chunk", "error", err)
		return
	}
	in.stream = stream
	in.log.Debug("streaming the snapshot into the store", "revision", in.stageRev)
}

// commitStream commits the streamed snapshot with its deletes and resume
// point, and reports whether it did. On false the staged snapshot must be
// applied whole: the stream failed (a chunk vetoed by the batch check, a
// stall the store ended) and wrote nothing.
func (in *inbound) commitStream(deletes []resource.Key, meta map[string][]byte) bool {
	if in.stream == nil {
		return false
	}
	rest := in.part(nil, deletes)
	rest.Meta = meta
	_, err := in.stream.Commit(rest)
	in.stream = nil
	if err != nil {
		in.log.Warn("streamed snapshot not committed; applying it whole", "error", err)
		return false
	}
	return true
}

// endStream rolls back an open stream (why says why; err may be nil). The
// snapshot stays staged in memory.
func (in *inbound) endStream(why string, err error) {
	if in.stream == nil {
		return
	}
	in.stream.Abort()
	in.stream = nil
	if err != nil {
		in.log.Warn("snapshot stream ended; the snapshot will be applied whole", "reason", why, "error", err)
	}
}

// close ends what the inbound holds when its session ends: a stream
// holding the store's writer is rolled back at once.
func (in *inbound) close() { in.endStream("the session ended", nil) }

// convert runs every upsert through the sink into set, and returns the
// resources it added (in the batch's order) and the NACK entries of those
// it rejected. Large batches (a snapshot chunk holds thousands of
// resources) are converted by one worker per CPU: validation dominates a
// cold start. The sink only reads, so its calls may run concurrently;
// results keep the batch's order.
func (in *inbound) convert(ctx context.Context, b *syncv1.DeltaBatch, set *batchSet) (accepted []*resource.Resource, rejected []*syncv1.ResourceError) {
	ups := b.GetUpserts()
	out := make([]*resource.Resource, len(ups))
	errs := make([]error, len(ups))
	workers := min(runtime.GOMAXPROCS(0), len(ups)/parallelConvertMin)
	if workers <= 1 {
		for i, w := range ups {
			out[i], errs[i] = in.sink.upsert(ctx, w)
		}
	} else {
		var wg sync.WaitGroup
		for k := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := k; i < len(ups); i += workers {
					out[i], errs[i] = in.sink.upsert(ctx, ups[i])
				}
			}()
		}
		wg.Wait()
	}
	accepted = out[:0] // reuses out: out[i] is read before accepted grows past i
	for i, r := range out {
		if errs[i] != nil {
			rejected = append(rejected, &syncv1.ResourceError{Key: keyToWire(wireKeyOf(ups[i])), Message: errs[i].Error()})
			continue
		}
		set.add(r, keyToWire(wireKeyOf(ups[i])))
		accepted = append(accepted, r)
	}
	return accepted, rejected
}

// rejection is what admission's precondition returns for the resources it
// refuses (admission.Rejected).
type rejection interface {
	RejectedKeys() map[resource.Key]error
}

// apply applies batch with the in-transaction precondition, in one
// transaction, or in several when the store limits a transaction's size
// (splitBatch). When the precondition rejects some resources (a write that
// raced the sink's own checks), it applies the rest and answers those with
// NACK entries; wire names each key as the peer sent it. A second rejection
// fails the batch (the stream restarts and the peer resends).
func (in *inbound) apply(ctx context.Context, batch storage.Batch, wire func(resource.Key) *syncv1.ResourceKey) ([]*syncv1.ResourceError, error) {
	var limits storage.Limits
	if l, ok := in.store.(storage.Limited); ok {
		limits = l.Limits()
	}
	var rejected []*syncv1.ResourceError
	for _, part := range splitBatch(batch, limits) {
		r, err := in.applyPart(ctx, part, wire)
		rejected = append(rejected, r...)
		if err != nil {
			return rejected, err
		}
	}
	return rejected, nil
}

// applyPart applies one transaction's worth (see apply).
func (in *inbound) applyPart(ctx context.Context, batch storage.Batch, wire func(resource.Key) *syncv1.ResourceKey) ([]*syncv1.ResourceError, error) {
	var rejected []*syncv1.ResourceError
	for attempt := 0; ; attempt++ {
		if in.check != nil {
			batch.Check = in.check(batch.Puts, batch.Deletes)
		}
		_, err := in.store.Apply(ctx, batch)
		if err == nil && in.onApplied != nil {
			in.onApplied(rejected)
		}
		var rej rejection
		if err == nil || attempt > 0 || !errors.As(err, &rej) {
			return rejected, err
		}
		keys := rej.RejectedKeys()
		bad := func(k resource.Key) bool { _, ok := keys[k]; return ok }
		batch.Puts = slices.DeleteFunc(slices.Clone(batch.Puts), func(r *resource.Resource) bool { return bad(r.Key()) })
		batch.Deletes = slices.DeleteFunc(slices.Clone(batch.Deletes), bad)
		for _, k := range sortedResourceKeys(keys) {
			w := wire(k)
			if w == nil {
				w = keyToWire(k)
			}
			rejected = append(rejected, &syncv1.ResourceError{Key: w, Message: keys[k].Error(), Permanent: isPermanent(keys[k])})
		}
		in.log.Warn("resources rejected in the write transaction", "count", len(keys))
	}
}

// isPermanent reports whether a rejection holds whatever changes on this
// side (admission marks such errors), so the sender need not resend.
func isPermanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

func sortedResourceKeys(m map[resource.Key]error) []resource.Key {
	keys := make([]resource.Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b resource.Key) int { return strings.Compare(a.String(), b.String()) })
	return keys
}

// streamStartGap: a snapshot is streamed into the store (inbound.stream)
// from its second chunk on when that chunk came within this of the first.
// A quarter of the store's 1 s idle limit: a link that fast is unlikely to
// pause long enough for the store to give up on the stream, while on a
// slower one (a 100 KiB/s link takes seconds per chunk) the stream would
// only hold the zone's writers until the store did.
const streamStartGap = 250 * time.Millisecond

// parallelConvertMin is the number of upserts per worker below which one
// goroutine converts the batch alone.
const parallelConvertMin = 128

func encodeRevision(rev uint64) []byte { return []byte(strconv.FormatUint(rev, 10)) }

// resumeMeta is the resume point to record with a batch: the peer's
// revision and, with it, the peer's store id.
func (in *inbound) resumeMeta(rev uint64) map[string][]byte {
	m := map[string][]byte{in.metaKey: encodeRevision(rev)}
	if in.storeKey != "" && in.peerStore != "" {
		m[in.storeKey] = []byte(in.peerStore)
	}
	return m
}

// readStoreID reads a peer store id recorded in Meta; absent is "".
func readStoreID(ctx context.Context, st Store, key string) (string, error) {
	v, err := st.Meta(ctx, key)
	if errors.Is(err, storage.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	return string(v), nil
}

// readRevision reads a revision recorded in Meta; absent is 0.
func readRevision(ctx context.Context, st Store, key string) (uint64, error) {
	v, err := st.Meta(ctx, key)
	if errors.Is(err, storage.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", key, err)
	}
	rev, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %q is not a revision", key, v)
	}
	return rev, nil
}
