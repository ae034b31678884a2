package kds

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

func TestReportsReplacePerZone(t *testing.T) {
	var r reports
	report := func(reason string, names ...string) *syncv1.PolicyStatusReport {
		rep := &syncv1.PolicyStatusReport{}
		for _, n := range names {
			rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: n},
				Conditions: []*syncv1.Condition{{Type: "Enforced", Status: "True", Reason: reason}}})
		}
		return rep
	}
	r.set("zone-2", report("Enforced", "a", "b"))
	r.set("zone-1", report("PartiallyEnforced", "a"))
	got := r.get("MeshTimeout", "default", "a")
	if len(got) != 2 || got[0].Zone != "zone-1" || got[0].Conditions[0].Reason != "PartiallyEnforced" || got[1].Zone != "zone-2" {
		t.Fatalf("a: %+v", got)
	}
	r.set("zone-2", report("Enforced")) // an empty report clears zone-2's
	if got := r.get("MeshTimeout", "default", "b"); len(got) != 0 {
		t.Fatalf("b after zone-2's empty report: %+v", got)
	}
}

// TestReportsShareEqualConditions: statuses with equal conditions keep one
// list, and each keeps what its zone reported.
func TestReportsShareEqualConditions(t *testing.T) {
	var r reports
	rep := &syncv1.PolicyStatusReport{}
	cond := func(typ, reason string) *syncv1.Condition {
		return &syncv1.Condition{Type: typ, Status: "True", Reason: reason, Message: "m " + reason}
	}
	add := func(name string, conds ...*syncv1.Condition) {
		rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: name}, Conditions: conds})
	}
	add("a", cond("Accepted", "Accepted"), cond("Enforced", "Enforced"))
	add("b", cond("Accepted", "Accepted"), cond("Enforced", "Enforced"))
	add("c", cond("Accepted", "Accepted"), cond("Enforced", "NotEnforced"))
	add("d", cond("Accepted", "Accepted"))
	add("e")
	add("f", cond("A", "1"), cond("B", "2"), cond("C", "3"))
	add("g", cond("A", "1"), cond("B", "2"), cond("C", "3"))
	r.set("zone-1", rep)
	get := func(name string) []ReportCondition {
		t.Helper()
		got := r.get("MeshTimeout", "default", name)
		if len(got) != 1 || got[0].Zone != "zone-1" {
			t.Fatalf("%s: %+v", name, got)
		}
		return got[0].Conditions
	}
	for i, st := range rep.Statuses {
		got := get(st.Key.Name)
		if len(got) != len(st.Conditions) {
			t.Fatalf("%s: %d conditions, want %d", st.Key.Name, len(got), len(st.Conditions))
		}
		for j, c := range st.Conditions {
			if want := (ReportCondition{c.Type, c.Status, c.Reason, c.Message}); got[j] != want {
				t.Errorf("status %d condition %d: %+v, want %+v", i, j, got[j], want)
			}
		}
	}
	if a, b := get("a"), get("b"); &a[0] != &b[0] {
		t.Error("a and b report equal conditions but keep two lists")
	}
	if a, c := get("a"), get("c"); &a[0] == &c[0] {
		t.Error("a and c report different conditions but share a list")
	}
}

// TestReportsShareNamesAcrossZones: every zone reporting a policy refers to
// one copy of its name, and the copies of names no report carries any more
// are dropped once they outnumber the reported ones.
func TestReportsShareNamesAcrossZones(t *testing.T) {
	var r reports
	report := func(from, n int) *syncv1.PolicyStatusReport {
		rep := &syncv1.PolicyStatusReport{}
		for i := from; i < from+n; i++ {
			// strings.Clone: every decoded report carries its own copies.
			rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{
				Key:        &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: strings.Clone("p-" + strconv.Itoa(i))},
				Conditions: []*syncv1.Condition{{Type: "Accepted", Status: "True"}}})
		}
		return rep
	}
	r.set("zone-1", report(0, 10))
	r.set("zone-2", report(0, 10))
	nameIn := func(zone string) *byte {
		for n := range r.byZone[zone].byName[typeMesh{"MeshTimeout", "default"}] {
			if n == "p-3" {
				return unsafe.StringData(n)
			}
		}
		t.Fatalf("%s: no p-3", zone)
		return nil
	}
	if nameIn("zone-1") != nameIn("zone-2") {
		t.Error("two zones keep two copies of one policy's name")
	}
	for round := range 200 {
		r.set("zone-1", report(round*100, 100))
		r.set("zone-2", report(round*100, 100))
		if len(r.names) > 2*100+1024 {
			t.Fatalf("round %d: %d names kept for reports of 100", round, len(r.names))
		}
	}
	if got := r.get("MeshTimeout", "default", "p-19950"); len(got) != 2 || got[0].Conditions[0].Type != "Accepted" {
		t.Fatalf("p-19950: %+v", got)
	}
	if got := r.get("MeshTimeout", "default", "p-3"); len(got) != 0 {
		t.Fatalf("p-3 after reports without it: %+v", got)
	}
}

// TestReportTakesEffectWhenDone: a report taken in chunk by chunk replaces
// the zone's previous one only once done; one left unfinished (the session
// ended) changes nothing.
func TestReportTakesEffectWhenDone(t *testing.T) {
	var r reports
	statuses := func(reason string, names ...string) []*syncv1.PolicyStatus {
		var out []*syncv1.PolicyStatus
		for _, n := range names {
			out = append(out, &syncv1.PolicyStatus{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: n},
				Conditions: []*syncv1.Condition{{Type: "Enforced", Status: "True", Reason: reason}}})
		}
		return out
	}
	reason := func(name string) string {
		got := r.get("MeshTimeout", "default", name)
		if len(got) == 0 {
			return ""
		}
		return got[0].Conditions[0].Reason
	}
	first := r.assemble("zone-1", nil)
	first.add(statuses("one", "a"))
	first.add(statuses("one", "b"))
	if reason("a") != "" {
		t.Fatal("a report shows before its last chunk")
	}
	first.done()
	if reason("a") != "one" || reason("b") != "one" {
		t.Fatalf("after the first report: a %q, b %q", reason("a"), reason("b"))
	}
	unfinished := r.assemble("zone-1", nil)
	unfinished.add(statuses("two", "a"))
	if reason("a") != "one" || reason("b") != "one" {
		t.Fatalf("an unfinished report changed the zone's: a %q, b %q", reason("a"), reason("b"))
	}
	second := r.assemble("zone-1", nil)
	second.add(statuses("three", "b"))
	second.done()
	if reason("a") != "" || reason("b") != "three" {
		t.Fatalf("after the second report: a %q, b %q", reason("a"), reason("b"))
	}
}

// bigReporter reports n statuses once, each message padded to pad bytes.
type bigReporter struct{ n, pad int }

func (r bigReporter) message(s string) string {
	if len(s) >= r.pad {
		return s
	}
	return s + strings.Repeat(".", r.pad-len(s))
}

func (r bigReporter) PolicyStatusReport() (*syncv1.PolicyStatusReport, <-chan struct{}) {
	rep := &syncv1.PolicyStatusReport{}
	for i := range r.n {
		rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{
			Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: "policy-" + itoa(i)},
			Conditions: []*syncv1.Condition{
				{Type: "Accepted", Status: "True", Reason: "Accepted", Message: r.message("the policy is valid and its references resolve")},
				{Type: "Enforced", Status: "True", Reason: "Enforced", Message: r.message("the policy applies to at least one Dataplane")},
			}})
	}
	return rep, make(chan struct{})
}

// TestLargeStatusReportArrivesInChunks: a zone holding many of the global's
// policies reports more than a gRPC message may carry (100,000 policies
// make ~20 MB); the report travels in chunks and takes effect whole. A
// single message this size used to break the stream at every connection,
// so nothing the zone wrote reached the global any more.
func TestLargeStatusReportArrivesInChunks(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	// 5,000 statuses of two 500-byte messages (the global keeps messages
	// of at most 512 bytes): over gRPC's 4 MiB default receive limit.
	const n = 5000
	reporter := bigReporter{n: n, pad: 500}
	if rep, _ := reporter.PolicyStatusReport(); proto.Size(rep) <= 4<<20 {
		t.Fatalf("the report is %d bytes: not over gRPC's limit", proto.Size(rep))
	}
	// The global keeps statuses of its own policies only.
	var batch storage.Batch
	for i := range n {
		r := timeout("policy-"+itoa(i), "", "")
		r.Labels.Set(resource.LabelOrigin, resource.OriginGlobal)
		setRole(t, r, "")
		batch.Puts = append(batch.Puts, r)
	}
	if _, err := c.global.Apply(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	z := c.zone("zone-1", zoneOpts{reporter: reporter}).start()
	eventually(t, wait, "connected", z.connected)
	// Written while the report's chunks are leaving: its batch travels
	// between them, and the report is still reassembled whole.
	writeZone(t, z.store, "zone-1", timeout("during-report", "", ""))
	eventually(t, wait, "the whole report on the global", func() bool {
		first := c.server.PolicyStatuses("MeshTimeout", "default", "policy-0")
		last := c.server.PolicyStatuses("MeshTimeout", "default", "policy-"+itoa(n-1))
		return len(first) == 1 && len(last) == 1
	})
	writeZone(t, z.store, "zone-1", timeout("after-report", "", ""))
	eventually(t, wait, "the zone's writes still reach the global", func() bool {
		return exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "during-report", "zone-1")) &&
			exists(c.global, "MeshTimeout", "default", mapping.HashedName("default", "after-report", "zone-1"))
	})
}

func TestChunkReport(t *testing.T) {
	rep, _ := bigReporter{n: 1000}.PolicyStatusReport()
	chunks := chunkReport(rep, 16<<10)
	total := 0
	for i, ch := range chunks {
		total += len(ch.GetStatuses())
		if ch.GetMore() != (i < len(chunks)-1) {
			t.Errorf("chunk %d of %d: more=%v", i, len(chunks), ch.GetMore())
		}
		if size := proto.Size(ch); size > 16<<10 {
			t.Errorf("chunk %d is %d bytes", i, size)
		}
	}
	if total != 1000 || len(chunks) < 2 {
		t.Errorf("%d statuses in %d chunks", total, len(chunks))
	}
	if got := chunkReport(&syncv1.PolicyStatusReport{}, 1024); len(got) != 1 || got[0].GetMore() {
		t.Errorf("an empty report: %v", got)
	}
}

// TestReportChunksYieldToOtherMessages: report chunks leave only when
// nothing else waits (a change is not queued behind megabytes of
// statuses); a new report replaces a queued one that has not begun to
// leave, and follows the rest of one that has.
func TestReportChunksYieldToOtherMessages(t *testing.T) {
	report := func(prefix string, n int) *syncv1.PolicyStatusReport {
		rep := &syncv1.PolicyStatusReport{}
		for i := range n {
			rep.Statuses = append(rep.Statuses, &syncv1.PolicyStatus{
				Key:        &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: prefix + itoa(i)},
				Conditions: []*syncv1.Condition{{Type: "Enforced", Status: "True", Reason: "Enforced", Message: "applies"}}})
		}
		return rep
	}
	// sendAll takes what the loop would offer the sender, in order: a
	// report chunk as "<first name>..<more>", anything else by kind.
	sendAll := func(s *session, n int) []string {
		var out []string
		for range n {
			m := s.nextToSend()
			if m == nil {
				break
			}
			if r := m.GetPolicyStatusReport(); r != nil {
				out = append(out, r.GetStatuses()[0].GetKey().GetName()+"/more="+strconv.FormatBool(r.GetMore()))
			} else {
				out = append(out, "batch")
			}
			s.sent()
		}
		return out
	}
	s := &session{maxChunk: 1024}
	s.queueReport(report("old-", 30))
	chunks := len(s.reportQueue)
	if chunks < 3 {
		t.Fatalf("want a report of at least 3 chunks, got %d", chunks)
	}
	s.queueReport(report("new-", 30)) // replaces the old one: none of it left
	if got := sendAll(s, 1); len(got) != 1 || !strings.HasPrefix(got[0], "new-0/") {
		t.Fatalf("first chunk after replacing an unsent report: %v", got)
	}
	s.enqueue(msgBatch(&syncv1.DeltaBatch{Nonce: "1"}))
	if got := sendAll(s, 1); got[0] != "batch" {
		t.Fatalf("a batch queued during a report leaves before the report's next chunk, got %v", got)
	}
	s.queueReport(report("newer-", 30)) // the one under way finishes first
	got := sendAll(s, 1000)
	if len(got) != 2*chunks-1 {
		t.Fatalf("sent %d chunks, want %d: %v", len(got), 2*chunks-1, got)
	}
	for i, c := range got {
		wantNew := i < chunks-1
		if strings.HasPrefix(c, "new-") != wantNew || strings.HasPrefix(c, "newer-") == wantNew {
			t.Fatalf("chunk %d is %s: want the rest of new-, then newer- (%v)", i, c, got)
		}
	}
	if !strings.HasSuffix(got[chunks-2], "/more=false") || s.reportMidway {
		t.Fatalf("the report under way must end before the next starts: %v (midway %v)", got, s.reportMidway)
	}
}

// countingAssembly counts what a session hands it.
type countingAssembly struct{ added, dones int }

func (c *countingAssembly) add(s []*syncv1.PolicyStatus) { c.added += len(s) }
func (c *countingAssembly) done()                        { c.dones++ }

// TestReportChunksAreBounded: a zone streaming chunks past
// maxReportStatuses breaks the protocol before the excess is taken in.
func TestReportChunksAreBounded(t *testing.T) {
	a := &countingAssembly{}
	s := &session{onReport: func() reportAssembly { return a }}
	part := make([]*syncv1.PolicyStatus, maxReportStatuses/16) // 128 KiB encoded
	for range 16 {
		if err := s.onReportChunk(&syncv1.PolicyStatusReport{Statuses: part, More: true}); err != nil {
			t.Fatal(err)
		}
	}
	err := s.onReportChunk(&syncv1.PolicyStatusReport{Statuses: part[:1]})
	if !errors.Is(err, errProtocol) {
		t.Fatalf("a report of %d statuses: %v, want a protocol error", maxReportStatuses+1, err)
	}
	if a.added != maxReportStatuses || a.dones != 0 {
		t.Fatalf("taken in %d statuses, done %d times", a.added, a.dones)
	}
}

// set replaces zone's report with rep (one that arrived whole).
func (r *reports) set(zone string, rep *syncv1.PolicyStatusReport) {
	a := r.assemble(zone, nil)
	a.add(rep.GetStatuses())
	a.done()
}

// TestReportBytesAreBounded: a chunk over maxReportChunkBytes, or a report
// whose chunks together pass maxReportBytes, breaks the protocol before it
// is taken in; statuses of policies the global does not hold are dropped,
// and conditions are kept short.
func TestReportBytesAreBounded(t *testing.T) {
	big := strings.Repeat("x", 900<<10)
	a := &countingAssembly{}
	s := &session{onReport: func() reportAssembly { return a }}
	huge := &syncv1.PolicyStatusReport{Statuses: []*syncv1.PolicyStatus{{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Name: big + big}}}}
	if err := s.onReportChunk(huge); !errors.Is(err, errProtocol) {
		t.Errorf("a 1.8 MB chunk: %v, want a protocol error", err)
	}
	s = &session{onReport: func() reportAssembly { return a }}
	chunk := &syncv1.PolicyStatusReport{More: true, Statuses: []*syncv1.PolicyStatus{{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Name: big}}}}
	var err error
	for i := 0; i < maxReportBytes/len(big)+2 && err == nil; i++ {
		err = s.onReportChunk(chunk)
	}
	if !errors.Is(err, errProtocol) {
		t.Errorf("a report past %d bytes: %v, want a protocol error", maxReportBytes, err)
	}

	var r reports
	known := func(typ, mesh, name string) bool { return name == "real" }
	asm := r.assemble("zone-1", known)
	asm.add([]*syncv1.PolicyStatus{
		{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: "real"},
			Conditions: []*syncv1.Condition{{Type: "Enforced", Status: "True", Reason: "Enforced", Message: strings.Repeat("m", 10000)}}},
		{Key: &syncv1.ResourceKey{Type: "MeshTimeout", Mesh: "default", Name: "invented"},
			Conditions: []*syncv1.Condition{{Type: "Enforced", Status: "True"}}},
	})
	asm.done()
	got := r.get("MeshTimeout", "default", "real")
	if len(got) != 1 || len(got[0].Conditions[0].Message) > maxConditionMessage {
		t.Errorf("the real policy's status: %+v", got)
	}
	if got := r.get("MeshTimeout", "default", "invented"); len(got) != 0 {
		t.Errorf("a status of a policy the global does not hold was kept: %+v", got)
	}
}
