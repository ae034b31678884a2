package kds

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-mesh/meridian/internal/kds/mapping"
	"github.com/meridian-mesh/meridian/internal/resource"
	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// stored is r as the global's store returns it (a version and times).
func stored(r *resource.Resource, version uint64) *resource.Resource {
	c := r.Clone()
	c.Labels = resource.NewLabels(map[string]string{resource.LabelOrigin: resource.OriginGlobal, "team": "a"})
	c.Version, c.CreationTime, c.ModificationTime = version, time.Unix(1700000000, 0).UTC(), time.Unix(1700000000+int64(version), 0).UTC()
	return c
}

// TestEncodedCopy: a zone copy as the zone copies keep it (encodedCopy)
// marshals to a message equal to its wire form, whatever other fields a
// batch carries beside it, is the same size, and keeps its type readable.
func TestEncodedCopy(t *testing.T) {
	if n := (&syncv1.Resource{}).ProtoReflect().Descriptor().Fields().ByName("type").Number(); n != resourceTypeField {
		t.Fatalf("Resource.type is field %d, encodedCopy drops %d", n, resourceTypeField)
	}
	d, _ := testRegistry.Lookup("MeshTimeout")
	r := stored(timeout("t-1", "", ""), 3)
	r.Labels.Set(resource.LabelDisplayName, "shown")
	full := toWire(mapping.ToZone(d, r))
	enc := encodedCopy(full)
	if enc.GetType() != "MeshTimeout" || enc.GetName() != "" || enc.GetLabels() != nil || enc.GetSpec() != nil {
		t.Fatalf("encoded copy keeps %v beside its bytes; want the type alone", enc)
	}
	if a, b := proto.Size(enc), proto.Size(full); a != b {
		t.Errorf("encoded copy is %d bytes, its wire form %d", a, b)
	}
	msg := msgBatch(&syncv1.DeltaBatch{Nonce: "n-7", Revision: 42, BaseRevision: 40, Upserts: []*syncv1.Resource{enc, enc},
		Removals:     []*syncv1.ResourceKey{{Type: "MeshTimeout", Mesh: "default", Name: "gone"}},
		FullSnapshot: true, ChunkIndex: 3, LastChunk: true})
	want := msgBatch(&syncv1.DeltaBatch{Nonce: "n-7", Revision: 42, BaseRevision: 40, Upserts: []*syncv1.Resource{full, full},
		Removals:     []*syncv1.ResourceKey{{Type: "MeshTimeout", Mesh: "default", Name: "gone"}},
		FullSnapshot: true, ChunkIndex: 3, LastChunk: true})
	data, err := proto.Marshal(&syncv1.StreamResponse{Message: msg})
	if err != nil {
		t.Fatal(err)
	}
	got := &syncv1.StreamResponse{}
	if err := proto.Unmarshal(data, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.GetMessage(), want) {
		t.Fatalf("decoded\n%v\nwant\n%v", got.GetMessage(), want)
	}
	if r := fromWire(got.GetMessage().GetDeltaBatch().GetUpserts()[1]); r.Name != full.GetName() || r.DisplayName() != "shown" || string(r.Spec) != string(full.GetSpec()) {
		t.Errorf("the zone builds %+v", r)
	}
}

// TestZoneCopiesShareOneCopyPerVersion: every session gets the one copy of
// a version; a new version replaces it, a deletion drops it.
func TestZoneCopiesShareOneCopyPerVersion(t *testing.T) {
	d, _ := testRegistry.Lookup("MeshTimeout")
	copies := newZoneCopies()
	v1 := copies.toZone(d, stored(timeout("t-1", "", ""), 1))
	if again := copies.toZone(d, stored(timeout("t-1", "", ""), 1)); again != v1 {
		t.Error("the same version mapped twice")
	}
	if v1.key.Name == "t-1" || v1.key.Type != "MeshTimeout" || v1.size != proto.Size(v1.up)+entryOverhead {
		t.Errorf("copy %+v: want the zone's hashed name and the encoded size", v1)
	}
	v2 := copies.toZone(d, stored(timeout("t-1", "", ""), 2))
	if v2 == v1 || v1.up.GetType() != "MeshTimeout" {
		t.Error("a new version did not replace the copy, or changed the old one")
	}
	copies.forget(stored(timeout("t-1", "", ""), 2).Key())
	if len(copies.byKey) != 0 {
		t.Errorf("%d copies after the deletion", len(copies.byKey))
	}
}

// cachedUpserts maps n MeshTimeouts (t-00000, t-00001, ...) through copies
// and returns their cached wire forms.
func cachedUpserts(copies *zoneCopies, n int) []*syncv1.Resource {
	d, _ := testRegistry.Lookup("MeshTimeout")
	var ups []*syncv1.Resource
	for i := range n {
		ups = append(ups, copies.toZone(d, stored(timeout(fmt.Sprintf("t-%05d", i), "", ""), 1)).up)
	}
	return ups
}

// BenchmarkMarshalBatch40: one session's batch of 40 MeshTimeouts, in the
// StreamResponse the global's stream sends, as the proto codec marshals it
// from their wire forms and from the zone copies' encoded ones (what each
// of N sessions pays per batch).
func BenchmarkMarshalBatch40(b *testing.B) {
	d, _ := testRegistry.Lookup("MeshTimeout")
	var full []*syncv1.Resource
	for i := range 40 {
		full = append(full, toWire(mapping.ToZone(d, stored(timeout(fmt.Sprintf("t-%05d", i), "", ""), 1))))
	}
	codec := encoding.GetCodecV2(grpcproto.Name)
	for _, c := range []struct {
		name string
		ups  []*syncv1.Resource
	}{{"wire", full}, {"encoded", cachedUpserts(newZoneCopies(), 40)}} {
		msg := &syncv1.StreamResponse{Message: msgBatch(&syncv1.DeltaBatch{Nonce: "n", Revision: 9, Upserts: c.ups, LastChunk: true})}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := codec.Marshal(msg)
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
// 10,000 policies for its cached wire forms, so the wire keeps the map.
func BenchmarkReceiveBatch100(b *testing.B) {
	copies := newZoneCopies()
	msg := &syncv1.StreamResponse{Message: msgBatch(&syncv1.DeltaBatch{Nonce: "n", Revision: 9, Upserts: cachedUpserts(copies, 100), LastChunk: true})}
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
			if r := fromWire(up); r.Labels.Len() == 0 {
				b.Fatal("no labels")
			}
		}
	}
}
