package syncv1_test

import (
	"maps"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

func TestDeltaBatchRoundTrip(t *testing.T) {
	now := timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC))
	in := &syncv1.StreamRequest{Message: &syncv1.Message{Kind: &syncv1.Message_DeltaBatch{DeltaBatch: &syncv1.DeltaBatch{
		Nonce:        "n-1",
		Revision:     42,
		BaseRevision: 40,
		Upserts: []*syncv1.Resource{{
			Type:             "MeshTimeout",
			Mesh:             "default",
			Name:             "default-timeout-zone-1-c58w24w4vw27f454",
			Namespace:        "kuma-system",
			Labels:           []*syncv1.Label{{Key: "kuma.io/origin", Value: "zone"}, {Key: "kuma.io/zone", Value: "zone-1"}},
			Spec:             []byte(`{"to":[{"targetRef":{"kind":"Mesh"}}]}`),
			CreationTime:     now,
			ModificationTime: now,
			Version:          3,
		}},
		Removals:   []*syncv1.ResourceKey{{Type: "MeshRetry", Mesh: "default", Name: "old"}},
		ChunkIndex: 0,
		LastChunk:  true,
	}}}}

	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	out := &syncv1.StreamRequest{}
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("round trip mismatch:\n in: %v\nout: %v", in, out)
	}
	batch := out.GetMessage().GetDeltaBatch()
	if got := batch.GetUpserts()[0].GetModificationTime().AsTime(); !got.Equal(now.AsTime()) {
		t.Fatalf("modification_time = %v, want %v", got, now.AsTime())
	}
	if got := string(batch.GetUpserts()[0].GetSpec()); got != `{"to":[{"targetRef":{"kind":"Mesh"}}]}` {
		t.Fatalf("spec = %s", got)
	}

	// The same Message type flows global -> zone.
	resp := &syncv1.StreamResponse{Message: &syncv1.Message{Kind: &syncv1.Message_Ack{Ack: &syncv1.Ack{Nonce: batch.GetNonce(), Revision: batch.GetRevision()}}}}
	b, err = proto.Marshal(resp)
	if err != nil {
		t.Fatalf("marshal ack: %v", err)
	}
	gotResp := &syncv1.StreamResponse{}
	if err := proto.Unmarshal(b, gotResp); err != nil {
		t.Fatalf("unmarshal ack: %v", err)
	}
	if ack := gotResp.GetMessage().GetAck(); ack.GetNonce() != "n-1" || ack.GetRevision() != 42 {
		t.Fatalf("ack = %v", ack)
	}
}

// TestLabelsReadAsAMap: Resource.labels, a repeated Label, is encoded as a
// map<string, string> field 5 is, so a peer whose schema declares that map
// reads the labels, and its encoding reads back as Labels here. The map's
// schema is built at run time (the shape Meridian's schema had before).
func TestLabelsReadAsAMap(t *testing.T) {
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	msg := descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	rep := descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("old.proto"), Package: proto.String("old"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Resource"),
			Field: []*descriptorpb.FieldDescriptorProto{{Name: proto.String("labels"), Number: proto.Int32(5), Label: rep, Type: msg,
				TypeName: proto.String(".old.Resource.LabelsEntry"), JsonName: proto.String("labels")}},
			NestedType: []*descriptorpb.DescriptorProto{{
				Name: proto.String("LabelsEntry"),
				Field: []*descriptorpb.FieldDescriptorProto{
					{Name: proto.String("key"), Number: proto.Int32(1), Label: opt, Type: str, JsonName: proto.String("key")},
					{Name: proto.String("value"), Number: proto.Int32(2), Label: opt, Type: str, JsonName: proto.String("value")},
				},
				Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
			}},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldType := fd.Messages().ByName("Resource")
	labels := map[string]string{"kuma.io/origin": "zone", "kuma.io/zone": "zone-1", "team": "payments"}

	ours := &syncv1.Resource{Labels: []*syncv1.Label{
		{Key: "kuma.io/origin", Value: "zone"}, {Key: "kuma.io/zone", Value: "zone-1"}, {Key: "team", Value: "payments"}}}
	b, err := proto.Marshal(ours)
	if err != nil {
		t.Fatal(err)
	}
	asMap := dynamicpb.NewMessage(oldType)
	if err := proto.Unmarshal(b, asMap); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	asMap.Get(oldType.Fields().ByNumber(5)).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		got[k.String()] = v.String()
		return true
	})
	if !maps.Equal(got, labels) {
		t.Errorf("a map<string, string> schema reads %v, want %v", got, labels)
	}

	b, err = proto.MarshalOptions{Deterministic: true}.Marshal(asMap)
	if err != nil {
		t.Fatal(err)
	}
	back := &syncv1.Resource{}
	if err := proto.Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, ours) {
		t.Errorf("the map's encoding reads back as %v, want %v", back.GetLabels(), ours.GetLabels())
	}
}
