package kds

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"fmt"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	syncv1 "github.com/meridian-mesh/meridian/proto/meridian/sync/v1"
)

// BenchmarkSyncGzip compresses sync messages as the KDS streams do (a
// pooled gzip writer reset per message) at the default level and at the
// level RegisterGzip deflates at, and through the compressor it
// registers (sync: stored blocks under 4 KiB): an acknowledgement, and
// batches of 1 to 1,000 MeshTimeouts. outB is the compressed size.
func BenchmarkSyncGzip(b *testing.B) {
	ack, err := proto.Marshal(&syncv1.Message{Kind: &syncv1.Message_Ack{Ack: &syncv1.Ack{Nonce: "17", Revision: 4242}}})
	if err != nil {
		b.Fatal(err)
	}
	messages := []struct {
		name string
		data []byte
	}{{"ack", ack}}
	for _, n := range []int{1, 8, 64, 1000} {
		batch := &syncv1.DeltaBatch{Revision: 4242}
		for i := range n {
			batch.Upserts = append(batch.Upserts, &syncv1.Resource{
				Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("t-%d", i),
				Labels: map[string]string{"kuma.io/origin": "global", "kuma.io/mesh": "default"},
				Spec:   fmt.Appendf(nil, `{"targetRef":{"kind":"Mesh"},"to":[{"default":{"idleTimeout":"%ds"},"targetRef":{"kind":"Mesh"}}]}`, i%7),
			})
		}
		data, err := proto.Marshal(&syncv1.Message{Kind: &syncv1.Message_DeltaBatch{DeltaBatch: batch}})
		if err != nil {
			b.Fatal(err)
		}
		messages = append(messages, struct {
			name string
			data []byte
		}{fmt.Sprintf("batch-%d", n), data})
	}
	for _, m := range messages {
		for _, level := range []int{gzip.DefaultCompression, flate.BestSpeed} {
			w, err := gzip.NewWriterLevel(io.Discard, level)
			if err != nil {
				b.Fatal(err)
			}
			benchCompress(b, fmt.Sprintf("%s/level%d", m.name, level), m.data, func(out io.Writer) io.WriteCloser {
				w.Reset(out)
				return w
			})
		}
		c := NewGzipCompressor(DefaultDeflateFrom)
		benchCompress(b, m.name+"/sync", m.data, func(out io.Writer) io.WriteCloser {
			w, err := c.Compress(out)
			if err != nil {
				b.Fatal(err)
			}
			return w
		})
	}
}

// benchCompress compresses data once per iteration with the writer open
// gives for the output, and reports the sizes.
func benchCompress(b *testing.B, name string, data []byte, open func(io.Writer) io.WriteCloser) {
	b.Run(name, func(b *testing.B) {
		var out bytes.Buffer
		for b.Loop() {
			out.Reset()
			w := open(&out)
			if _, err := w.Write(data); err != nil {
				b.Fatal(err)
			}
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(data)), "inB")
		b.ReportMetric(float64(out.Len()), "outB")
	})
}
