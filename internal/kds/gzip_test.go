package kds

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
)

// gzipRoundTrip compresses msg with c, written in pieces of at most piece
// bytes, and returns the stream.
func gzipRoundTrip(t *testing.T, c *GzipCompressor, msg []byte, piece int) []byte {
	t.Helper()
	var out bytes.Buffer
	w, err := c.Compress(&out)
	if err != nil {
		t.Fatal(err)
	}
	for rest := msg; len(rest) > 0; {
		n := min(piece, len(rest))
		if k, err := w.Write(rest[:n]); err != nil || k != n {
			t.Fatalf("Write = %d, %v; want %d, nil", k, err, n)
		}
		rest = rest[n:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// readGzip reads a gzip stream with compress/gzip (what any peer uses) and
// with the compressor's own Decompress.
func readGzip(t *testing.T, c *GzipCompressor, stream []byte) (std, own []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if std, err = io.ReadAll(zr); err != nil {
		t.Fatal(err)
	}
	r, err := c.Decompress(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if own, err = io.ReadAll(r); err != nil {
		t.Fatal(err)
	}
	if err := r.(io.Closer).Close(); err != nil {
		t.Fatal(err)
	}
	return std, own
}

// firstBlockStored reads the type of the first deflate block after the
// 10-byte gzip header (RFC 1951 3.2.3: bit 0 BFINAL, bits 1-2 BTYPE, 00 is
// stored).
func firstBlockStored(stream []byte) bool { return (stream[10]>>1)&3 == 0 }

// TestGzipCompressorStoresSmallAndDeflatesLarge: every message comes back
// intact through compress/gzip and through Decompress, whatever the size
// and however it was written; under the threshold it is sent in stored
// blocks, from it the message is deflated.
func TestGzipCompressorStoresSmallAndDeflatesLarge(t *testing.T) {
	const from = 64
	c := NewGzipCompressor(from)
	compressible := func(n int) []byte { return bytes.Repeat([]byte("meshtimeout "), n/12+1)[:n] }
	tests := []struct {
		size, piece int
		deflated    bool
	}{
		{0, 1, false},
		{1, 1, false},
		{from - 1, 1, false},
		{from - 1, from, false},
		{from, from, true},
		{from, 7, true},
		{from + 1, 1, true},
		{10 * from, 3, true},
		{200_000, 16 << 10, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d-in-pieces-of-%d", tt.size, tt.piece), func(t *testing.T) {
			msg := compressible(tt.size)
			stream := gzipRoundTrip(t, c, msg, tt.piece)
			std, own := readGzip(t, c, stream)
			if !bytes.Equal(std, msg) || !bytes.Equal(own, msg) {
				t.Fatalf("read back %d and %d bytes, want the %d written", len(std), len(own), len(msg))
			}
			if deflated := !firstBlockStored(stream); deflated != tt.deflated {
				t.Errorf("%d-byte message became a %d-byte stream: deflated %v, want %v", len(msg), len(stream), deflated, tt.deflated)
			}
		})
	}
}

// TestGzipCompressorReusesWriters: a writer from the pool starts clean; a
// large message after a small one (and the reverse) is not mixed with the
// previous message's bytes.
func TestGzipCompressorReusesWriters(t *testing.T) {
	c := NewGzipCompressor(32)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		msg := make([]byte, rng.IntN(100))
		for j := range msg {
			msg[j] = byte('a' + rng.IntN(3))
		}
		stream := gzipRoundTrip(t, c, msg, 1+rng.IntN(40))
		std, own := readGzip(t, c, stream)
		if !bytes.Equal(std, msg) || !bytes.Equal(own, msg) {
			t.Fatalf("message %d (%d bytes) read back as %q / %q", i, len(msg), std, own)
		}
	}
}

// TestGzipCompressorConcurrent: gRPC compresses and decompresses from
// every stream at once (run with -race).
func TestGzipCompressorConcurrent(t *testing.T) {
	c := NewGzipCompressor(DefaultDeflateFrom)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				msg := bytes.Repeat([]byte{byte('a' + g)}, (g*i*97)%(3*DefaultDeflateFrom))
				stream := gzipRoundTrip(t, c, msg, 1000)
				std, own := readGzip(t, c, stream)
				if !bytes.Equal(std, msg) || !bytes.Equal(own, msg) {
					t.Errorf("goroutine %d message %d: %d bytes read back as %d / %d", g, i, len(msg), len(std), len(own))
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestGzipCompressorRefusesWhatIsNotGzip: Decompress reports a stream that
// is not gzip (gRPC turns it into the stream's error).
func TestGzipCompressorRefusesWhatIsNotGzip(t *testing.T) {
	c := NewGzipCompressor(0)
	if _, err := c.Decompress(bytes.NewReader([]byte("not gzip at all"))); err == nil {
		t.Fatal("Decompress accepted a stream that is not gzip")
	}
	// The pool still hands out working readers afterwards.
	stream := gzipRoundTrip(t, c, []byte("after"), 5)
	if std, own := readGzip(t, c, stream); string(std) != "after" || string(own) != "after" {
		t.Fatalf("read back %q / %q", std, own)
	}
	if c.Name() != "gzip" {
		t.Fatalf("Name() = %q, want gzip (the grpc-encoding zone-cp asks for)", c.Name())
	}
}
