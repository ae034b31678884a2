package kds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// wireStream is the symmetric view of either end of SyncService.Stream.
// Send is called by one goroutine and Recv by another, as gRPC allows.
type wireStream interface {
	Send(*syncv1.Message) error
	Recv() (*syncv1.Message, error)
}

// grpcStream is either end of the generated SyncService stream: it sends Out
// envelopes and receives In envelopes, each carrying one Message.
type grpcStream[Out any, In interface{ GetMessage() *syncv1.Message }] interface {
	Send(Out) error
	Recv() (In, error)
}

// wire adapts a gRPC stream end to wireStream, so the zone and the global
// share every loop above it.
type wire[Out any, In interface{ GetMessage() *syncv1.Message }] struct {
	s    grpcStream[Out, In]
	wrap func(*syncv1.Message) Out
}

func newWire[Out any, In interface{ GetMessage() *syncv1.Message }](s grpcStream[Out, In], wrap func(*syncv1.Message) Out) wireStream {
	return wire[Out, In]{s: s, wrap: wrap}
}

func (w wire[Out, In]) Send(m *syncv1.Message) error { return w.s.Send(w.wrap(m)) }

func (w wire[Out, In]) Recv() (*syncv1.Message, error) {
	env, err := w.s.Recv()
	if err != nil {
		return nil, err
	}
	m := env.GetMessage()
	if m == nil {
		return nil, fmt.Errorf("%w: empty message", errProtocol)
	}
	return m, nil
}

// errDrained ends a session that finished its graceful drain.
var errDrained = errors.New("session drained for shutdown")

// ErrPeerSilent ends a stream on which nothing arrived for the heartbeat
// timeout.
var ErrPeerSilent = errors.New("peer silent for longer than the heartbeat timeout")

// session runs one established stream (after the handshake). Concurrency:
// run starts a receive goroutine (only Recv, feeding recvC) and the loop
// goroutine (owner of out, in, the send queues and lastRecv); the goroutine that
// calls run is the sender (the only caller of Send). On the server that is
// the gRPC handler goroutine, so no Send can happen after the handler has
// returned.
type session struct {
	log               hclog.Logger
	clock             Clock
	stream            wireStream
	out               *outbound
	in                *inbound
	heartbeatInterval time.Duration
	heartbeatTimeout  time.Duration
	// onHeartbeat is called (from the loop) for every heartbeat received.
	onHeartbeat func()
	// reporter (zone, when the global supports FeaturePolicyStatus) gives
	// the policy status report to send, again whenever it changes.
	reporter StatusReporter
	// onReport (global) starts taking in one of the zone's policy status
	// reports, which arrive in chunks.
	onReport func() reportAssembly

	// drain, when closed, ends the session gracefully (see StreamConfig's
	// DrainTimeout); drainTimeout bounds the wait for the peer's answers.
	drain        <-chan struct{}
	drainTimeout time.Duration

	// maxChunk bounds each chunk of a status report (StreamConfig's
	// MaxBatchBytes); partialReport takes in a chunked report being
	// received, partialStatuses counts its statuses so far.
	maxChunk        int
	partialReport   reportAssembly
	partialStatuses int
	partialBytes    int

	// queue holds what the loop sends next: batches, answers, heartbeats.
	// reportQueue holds status report chunks, sent only when queue is
	// empty: at 100,000 policies a report is ~20 MB, and a change queued
	// behind it waited for all of it (the chunks are reassembled in order
	// whatever travels between them).
	queue       []*syncv1.Message
	reportQueue []*syncv1.Message
	// reportMidway: chunks of a report were sent and its last one was not
	// (the rest of it must follow before another report starts).
	reportMidway bool
	lastRecv     time.Time
}

// sessionParams is what differs between the global's and the zone's end of
// a session; newSession wires everything else the same way for both.
type sessionParams struct {
	log    hclog.Logger
	clock  Clock
	stream wireStream
	cfg    StreamConfig // defaults applied
	store  Store

	// The sending half: what this end sends (src), how it is counted
	// (sent), and where the peer's rejections are recorded.
	src     source
	sendLog hclog.Logger
	sent    flowObserver
	rej     *rejections

	// The receiving half: how the peer's resources are stored (sink), the
	// Meta keys of the resume point and of the peer's store id, and the
	// resume point already applied.
	sink       sink
	recvLog    hclog.Logger
	received   flowObserver
	metaKey    string
	storeKey   string
	peerStore  string
	applied    uint64
	checkBatch func(puts []*resource.Resource, deletes []resource.Key) func(storage.TxReader) ([]resource.Key, error)
	// onApplied (optional) runs after each store write of a received
	// batch, with the resources the write refused.
	onApplied func(rejected []*syncv1.ResourceError)
	// streamSnapshots: write a full snapshot into the store while it is
	// received (inbound.stream). Only a zone does, for the global's
	// snapshots: while a stream is open every other write waits, and a
	// zone's own writers may wait on the global it trusts, but the
	// global's writers must not wait on any one zone.
	streamSnapshots bool

	onHeartbeat func()
	reporter    StatusReporter
	onReport    func() reportAssembly
	drain       <-chan struct{}
}

func newSession(p sessionParams) *session {
	s := &session{
		log: p.log, clock: p.clock, stream: p.stream,
		heartbeatInterval: p.cfg.HeartbeatInterval, heartbeatTimeout: p.cfg.HeartbeatTimeout,
		onHeartbeat: p.onHeartbeat, reporter: p.reporter, onReport: p.onReport,
		drain: p.drain, drainTimeout: p.cfg.DrainTimeout, maxChunk: p.cfg.MaxBatchBytes,
	}
	s.out = newOutbound(p.cfg.outbound(), p.store, p.src, p.sendLog, p.clock, p.sent, s.enqueue, s.backlog)
	s.out.rej = p.rej
	s.in = &inbound{store: p.store, sink: p.sink, check: p.checkBatch, onApplied: p.onApplied, metaKey: p.metaKey, storeKey: p.storeKey,
		peerStore: p.peerStore, log: p.recvLog, obs: p.received, clock: p.clock, applied: p.applied,
		streamSnapshots: p.streamSnapshots}
	return s
}

func (s *session) enqueue(m *syncv1.Message) { s.queue = append(s.queue, m) }

// backlog is the number of messages enqueued and not yet taken by the sender.
func (s *session) backlog() int { return len(s.queue) }

// nextToSend is the message the loop offers the sender: the queue first,
// then report chunks.
func (s *session) nextToSend() *syncv1.Message {
	switch {
	case len(s.queue) > 0:
		return s.queue[0]
	case len(s.reportQueue) > 0:
		return s.reportQueue[0]
	}
	return nil
}

// sent drops the message nextToSend offered, once the sender took it.
func (s *session) sent() {
	if len(s.queue) > 0 {
		s.queue[0] = nil
		s.queue = s.queue[1:]
		return
	}
	s.reportMidway = s.reportQueue[0].GetPolicyStatusReport().GetMore()
	s.reportQueue[0] = nil
	s.reportQueue = s.reportQueue[1:]
}

// queueReport queues report's chunks in place of any queued report that has
// not begun to leave (a report replaces the previous one: sending a stale
// one first only delays the current one).
func (s *session) queueReport(report *syncv1.PolicyStatusReport) {
	keep := 0
	if s.reportMidway {
		for keep < len(s.reportQueue) && s.reportQueue[keep].GetPolicyStatusReport().GetMore() {
			keep++
		}
		keep = min(keep+1, len(s.reportQueue)) // with the report's last chunk
	}
	clear(s.reportQueue[keep:])
	s.reportQueue = s.reportQueue[:keep]
	for _, chunk := range chunkReport(report, min(s.maxChunk, maxReportChunk)) {
		s.reportQueue = append(s.reportQueue, &syncv1.Message{Kind: &syncv1.Message_PolicyStatusReport{PolicyStatusReport: chunk}})
	}
}

// run streams until ctx ends or the stream fails, and returns why.
func (s *session) run(ctx context.Context, resume uint64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recvC := make(chan *syncv1.Message)
	recvErr := make(chan error, 1)
	sendC := make(chan *syncv1.Message)
	sendErr := make(chan error, 1)
	go s.receive(ctx, recvC, recvErr)
	loopErr := make(chan error, 1)
	go func() {
		loopErr <- s.loop(ctx, resume, recvC, recvErr, sendC, sendErr)
		cancel()
	}()
	s.sendLoop(ctx, sendC, sendErr)
	return <-loopErr
}

func (s *session) receive(ctx context.Context, out chan<- *syncv1.Message, errc chan<- error) {
	for {
		m, err := s.stream.Recv()
		if err != nil {
			errc <- err
			return
		}
		select {
		case out <- m:
		case <-ctx.Done():
			return
		}
	}
}

func (s *session) sendLoop(ctx context.Context, in <-chan *syncv1.Message, errc chan<- error) {
	for {
		select {
		case m := <-in:
			if err := s.stream.Send(m); err != nil {
				errc <- err
				<-ctx.Done()
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func (s *session) loop(ctx context.Context, resume uint64, recvC <-chan *syncv1.Message, recvErr <-chan error,
	sendC chan<- *syncv1.Message, sendErr <-chan error) error {
	defer s.out.stopTimers()
	defer s.in.close()
	if err := s.out.start(ctx, resume); err != nil {
		return err
	}
	hb := s.clock.NewTimer(s.heartbeatInterval)
	defer hb.Stop()
	s.lastRecv = s.clock.Now()
	if _, err := s.out.pump(); err != nil {
		return err
	}
	var reportC <-chan struct{}
	if s.reporter != nil {
		reportC = s.sendReport()
	}
	drainC := s.drain
	var drainDeadline <-chan time.Time
	draining := false
	for {
		if draining && s.out.idle() && len(s.queue) == 0 && len(s.reportQueue) == 0 {
			return errDrained
		}
		var sc chan<- *syncv1.Message
		head := s.nextToSend()
		if head != nil {
			sc = sendC
		}
		var err error
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err = <-recvErr:
			err = fmt.Errorf("receive: %w", err)
		case err = <-sendErr:
			err = s.sendFailure(err, recvErr)
		case sc <- head:
			s.sent()
			if s.out.sendingSnapshot() {
				_, err = s.out.pump() // the next chunk (see outbound.backlog)
			}
		case m := <-recvC:
			s.lastRecv = s.clock.Now()
			err = s.handle(ctx, m)
		case <-drainC:
			drainC, draining = nil, true
			s.out.flushForDrain()
			t := s.clock.NewTimer(s.drainTimeout)
			defer t.Stop()
			drainDeadline = t.C()
		case <-drainDeadline:
			s.log.Debug("drain timed out with batches unanswered", "in_flight", len(s.out.inflight))
			return errDrained
		case ev, ok := <-s.out.eventsC(draining):
			if !ok {
				return errWatchClosed
			}
			s.out.accept(ev)
			_, err = s.out.pump()
		case <-hb.C():
			err = s.tick()
			hb.Reset(s.heartbeatInterval)
		case <-reportC:
			reportC = s.sendReport()
		case <-s.out.confirm.C():
			err = s.out.onConfirm()
		case <-s.out.paced.C():
			err = s.out.onPaced()
		case <-s.out.retry.C():
			if err = s.out.onRetry(ctx); err == nil {
				_, err = s.out.pump()
			}
		}
		if err != nil {
			return err
		}
	}
}

// sendFailure explains a failed Send. gRPC reports a stream the peer ended
// as io.EOF on Send and gives the peer's status only to Recv: wait briefly
// for it, so that the reason (a revoked token, a shutdown) is not lost.
func (s *session) sendFailure(err error, recvErr <-chan error) error {
	if !errors.Is(err, io.EOF) {
		return fmt.Errorf("send: %w", err)
	}
	t := s.clock.NewTimer(time.Second)
	defer t.Stop()
	select {
	case rerr := <-recvErr:
		return fmt.Errorf("receive: %w", rerr)
	case <-t.C():
		return fmt.Errorf("send: %w", err)
	}
}

// sendReport queues the current policy status report (if any), in chunks
// of at most maxChunk bytes (queueReport), and returns the channel
// announcing the next one.
func (s *session) sendReport() <-chan struct{} {
	report, changed := s.reporter.PolicyStatusReport()
	if report != nil {
		s.queueReport(report)
	}
	return changed
}

// chunkReport splits a report into chunks of at most limit bytes (a status
// larger than that travels alone); all chunks but the last have more set.
func chunkReport(report *syncv1.PolicyStatusReport, limit int) []*syncv1.PolicyStatusReport {
	var chunks []*syncv1.PolicyStatusReport
	cur, size := &syncv1.PolicyStatusReport{}, 0
	for _, st := range report.GetStatuses() {
		n := proto.Size(st) + entryOverhead
		if len(cur.Statuses) > 0 && size+n > limit-batchOverhead {
			cur.More = true
			chunks = append(chunks, cur)
			cur, size = &syncv1.PolicyStatusReport{}, 0
		}
		cur.Statuses = append(cur.Statuses, st)
		size += n
	}
	return append(chunks, cur)
}

// maxReportChunk bounds a report chunk below MaxBatchBytes: the global
// decodes every connected zone's chunks at once when they all report
// (after a new policy, say), and with 100 zones the decoded chunks in
// flight made most of its peak memory.
const maxReportChunk = 256 << 10

// maxReportStatuses bounds a report the global reassembles from chunks: a
// zone holding more of the global's policies than this is not plausible,
// and an unbounded stream of chunks must not grow the global's memory.
const maxReportStatuses = 1 << 20

// Byte bounds of status reports (a zone token holder must not grow the
// global's heap at will): a report's chunks together, and one chunk (the
// sender cuts them at 256 KiB).
const (
	maxReportBytes      = 64 << 20
	maxReportChunkBytes = 1 << 20
)

// reportAssembly takes in one report, chunk by chunk (the global's end):
// each chunk is folded in as it arrives, so that the decoded chunks of
// many zones reporting at once are not all held until their last ones
// come (100 zones sending 10,000 statuses each held 600 MB). done makes
// the report the zone's; one never done (the session ended) changes
// nothing.
type reportAssembly interface {
	add(statuses []*syncv1.PolicyStatus)
	done()
}

// onReportChunk takes in one chunk of a report.
func (s *session) onReportChunk(chunk *syncv1.PolicyStatusReport) error {
	if s.onReport == nil {
		return fmt.Errorf("%w: a policy status report was not negotiated", errProtocol)
	}
	size := proto.Size(chunk)
	if size > maxReportChunkBytes {
		return fmt.Errorf("%w: policy status report chunk of %d bytes, at most %d", errProtocol, size, maxReportChunkBytes)
	}
	if s.partialReport == nil {
		s.partialReport, s.partialStatuses, s.partialBytes = s.onReport(), 0, 0
	}
	if s.partialStatuses += len(chunk.GetStatuses()); s.partialStatuses > maxReportStatuses {
		return fmt.Errorf("%w: policy status report of more than %d statuses", errProtocol, maxReportStatuses)
	}
	if s.partialBytes += size; s.partialBytes > maxReportBytes {
		return fmt.Errorf("%w: policy status report of more than %d bytes", errProtocol, maxReportBytes)
	}
	s.partialReport.add(chunk.GetStatuses())
	if !chunk.GetMore() {
		a := s.partialReport
		s.partialReport = nil
		a.done()
	}
	return nil
}

// tick sends a heartbeat and checks that the peer is alive.
func (s *session) tick() error {
	now := s.clock.Now()
	if silent := now.Sub(s.lastRecv); silent > s.heartbeatTimeout {
		return fmt.Errorf("%w (%s)", ErrPeerSilent, silent.Round(time.Millisecond))
	}
	s.enqueue(msgHeartbeat(&syncv1.Heartbeat{Time: timestamppb.New(now)}))
	return nil
}

// handle dispatches one received message.
func (s *session) handle(ctx context.Context, m *syncv1.Message) error {
	switch k := m.GetKind().(type) {
	case *syncv1.Message_DeltaBatch:
		reply, err := s.in.handle(ctx, k.DeltaBatch)
		if err != nil {
			return err
		}
		s.enqueue(reply)
		return nil
	case *syncv1.Message_Ack:
		return s.reply(k.Ack.GetNonce(), nil)
	case *syncv1.Message_Nack:
		return s.reply(k.Nack.GetNonce(), k.Nack)
	case *syncv1.Message_Heartbeat:
		if s.onHeartbeat != nil {
			s.onHeartbeat()
		}
		return nil
	case *syncv1.Message_PolicyStatusReport:
		return s.onReportChunk(k.PolicyStatusReport)
	}
	return fmt.Errorf("%w: unexpected %T after the handshake", errProtocol, m.GetKind())
}

func (s *session) reply(nonce string, nack *syncv1.Nack) error {
	if err := s.out.onReply(nonce, nack); err != nil {
		return fmt.Errorf("%w: %v", errProtocol, err)
	}
	_, err := s.out.pump()
	return err
}
