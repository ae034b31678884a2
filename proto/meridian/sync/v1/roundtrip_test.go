package syncv1_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
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
			Labels:           map[string]string{"kuma.io/origin": "zone", "kuma.io/zone": "zone-1"},
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
