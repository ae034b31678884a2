package sync

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// stored is r as the global's store returns it (a version and times).
func stored(r *resource.Resource, version uint64) *resource.Resource {
	c := r.Clone()
	c.Labels = map[string]string{resource.LabelOrigin: resource.OriginGlobal, "team": "a"}
	c.Version, c.CreationTime, c.ModificationTime = version, time.Unix(1700000000, 0).UTC(), time.Unix(1700000000+int64(version), 0).UTC()
	return c
}

// TestCodecFieldNumbers: the codec's field numbers are the schema's.
func TestCodecFieldNumbers(t *testing.T) {
	if n := (&syncv1.DeltaBatch{}).ProtoReflect().Descriptor().Fields().ByName("upserts").Number(); n != upsertsField {
		t.Errorf("DeltaBatch.upserts is field %d, the codec writes %d", n, upsertsField)
	}
	if n := (&syncv1.Message{}).ProtoReflect().Descriptor().Fields().ByName("delta_batch").Number(); n != batchField {
		t.Errorf("Message.delta_batch is field %d, the codec writes %d", n, batchField)
	}
	if n := (&syncv1.StreamResponse{}).ProtoReflect().Descriptor().Fields().ByName("message").Number(); n != responseField {
		t.Errorf("StreamResponse.message is field %d, the codec writes %d", n, responseField)
	}
}

// TestCodecTakesWhatTheStreamSends: the global's stream sends each Message
// wrapped in a StreamResponse (server.go), and that is what the codec
// writes from the cache. Until this test, it only recognized a bare
// Message, and every batch the binaries sent went through the proto codec.
func TestCodecTakesWhatTheStreamSends(t *testing.T) {
	batch := msgBatch(&syncv1.DeltaBatch{Nonce: "n", Upserts: []*syncv1.Resource{toWire(stored(timeout("a", "", ""), 1))}})
	for _, tt := range []struct {
		name        string
		v           any
		want, wrapd bool
	}{
		{"a StreamResponse holding a batch", &syncv1.StreamResponse{Message: batch}, true, true},
		{"a bare batch", batch, true, false},
		{"a StreamResponse holding an ack", &syncv1.StreamResponse{Message: msgAck(&syncv1.Ack{Nonce: "n"})}, false, false},
		{"an empty StreamResponse", &syncv1.StreamResponse{}, false, false},
		{"a StreamRequest", &syncv1.StreamRequest{Message: batch}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, wrapped := batchMessage(tt.v)
			if (m != nil) != tt.want || wrapped != tt.wrapd {
				t.Errorf("batchMessage: message %v, wrapped %v; want %v, %v", m != nil, wrapped, tt.want, tt.wrapd)
			}
		})
	}
}

// cachedUpserts maps n MeshTimeouts (t-00000, t-00001, ...) through copies
// and returns their cached wire forms.
func cachedUpserts(tb testing.TB, copies *zoneCopies, n int) []*syncv1.Resource {
	tb.Helper()
	d, _ := testRegistry.Lookup("MeshTimeout")
	var ups []*syncv1.Resource
	for i := range n {
		up, _ := copies.wire(copies.toZone(d, stored(timeout(fmt.Sprintf("t-%05d", i), "", ""), 1)))
		if up == nil {
			tb.Fatalf("t-%05d: no cached wire form", i)
		}
		ups = append(ups, up)
	}
	return ups
}

// TestEncodedBatchCodecDecodesToTheSameMessage: a batch whose upserts come
// from the zone copies' cache, one replaced since, and one that never was
// cached, with removals and every scalar field set, decodes to a message
// equal to the one the codec was given; other messages are encoded as the
// proto codec encodes them.
func TestEncodedBatchCodecDecodesToTheSameMessage(t *testing.T) {
	copies := newZoneCopies()
	ups := cachedUpserts(t, copies, 3)
	d, _ := testRegistry.Lookup("MeshTimeout")
	copies.toZone(d, stored(timeout("t-00000", "", ""), 2)) // its cached form is replaced: ups[0] is not cached any more
	ups = append(ups, toWire(stored(timeout("uncached", "", ""), 1)))
	encs := make([][]byte, len(ups))
	copies.encoded(ups, encs)
	if encs[0] != nil || encs[1] == nil || encs[2] == nil || encs[3] != nil {
		t.Fatalf("cached encodings: replaced %v, cached %v %v, uncached %v; want only the two cached",
			encs[0] != nil, encs[1] != nil, encs[2] != nil, encs[3] != nil)
	}
	msg := msgBatch(&syncv1.DeltaBatch{Nonce: "n-7", Revision: 42, BaseRevision: 40, Upserts: ups,
		Removals:     []*syncv1.ResourceKey{{Type: "MeshTimeout", Mesh: "default", Name: "gone"}},
		FullSnapshot: true, ChunkIndex: 3, LastChunk: true})
	codec := newEncodedBatchCodec(copies)
	if got := decode(t, codec, msg, &syncv1.Message{}); !proto.Equal(got, msg) {
		t.Fatalf("decoded\n%v\nwant\n%v", got, msg)
	}
	resp := &syncv1.StreamResponse{Message: msg}
	if got := decode(t, codec, resp, &syncv1.StreamResponse{}); !proto.Equal(got, resp) {
		t.Fatalf("decoded\n%v\nwant\n%v", got, resp)
	}
	std := encoding.GetCodecV2(grpcproto.Name)
	for _, m := range []proto.Message{
		msgAck(&syncv1.Ack{Nonce: "n-7", Revision: 42}),
		msgBatch(&syncv1.DeltaBatch{Nonce: "empty", Revision: 43, LastChunk: true}),
		&syncv1.StreamResponse{Message: msgAck(&syncv1.Ack{Nonce: "n-7", Revision: 42})},
	} {
		a, err := codec.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b, err := std.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if string(a.Materialize()) != string(b.Materialize()) {
			t.Errorf("%v: encoded differently from the proto codec", m)
		}
	}
}

// decode marshals msg with codec and unmarshals the bytes into got.
func decode[M proto.Message](t *testing.T, codec encoding.CodecV2, msg proto.Message, got M) M {
	t.Helper()
	data, err := codec.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data.Materialize())}, got); err != nil {
		t.Fatal(err)
	}
	return got
}

// BenchmarkMarshalBatch40: one session's batch of 40 MeshTimeouts, in the
// StreamResponse the global's stream sends, as the proto codec marshals it and as the global's codec writes it from the
// zone copies' cache (what each of N sessions pays per batch).
func BenchmarkMarshalBatch40(b *testing.B) {
	copies := newZoneCopies()
	msg := &syncv1.StreamResponse{Message: msgBatch(&syncv1.DeltaBatch{Nonce: "n", Revision: 9, Upserts: cachedUpserts(b, copies, 40), LastChunk: true})}
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"proto", encoding.GetCodecV2(grpcproto.Name)}, {"cached", newEncodedBatchCodec(copies)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := c.codec.Marshal(msg)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}

// BenchmarkReceiveBatch100: what a zone does with a received batch of 100
// zone copies before validating them: unmarshal the message, then build
// each resource (fromWire). Most of the unmarshal is the labels map, which
// Go's protobuf runtime fills by reflection; labels as a repeated message
// measured 110–123 µs against 130 here, but cost the global 5 MiB of RSS at
// 10,000 policies for its cached wire forms, so session 14 kept the map.
func BenchmarkReceiveBatch100(b *testing.B) {
	copies := newZoneCopies()
	msg := &syncv1.StreamResponse{Message: msgBatch(&syncv1.DeltaBatch{Nonce: "n", Revision: 9, Upserts: cachedUpserts(b, copies, 100), LastChunk: true})}
	data, err := proto.Marshal(msg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		got := &syncv1.StreamResponse{}
		if err := proto.Unmarshal(data, got); err != nil {
			b.Fatal(err)
		}
		for _, up := range got.GetMessage().GetDeltaBatch().GetUpserts() {
			if r := fromWire(up); len(r.Labels) == 0 {
				b.Fatal("no labels")
			}
		}
	}
}
