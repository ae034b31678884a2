package kds

import (
	"compress/flate"
	"compress/gzip"
	"io"
	"sync"

	"google.golang.org/grpc/encoding"
)

// GzipName is the grpc-encoding of the sync streams' compression.
const GzipName = "gzip"

// DefaultDeflateFrom is the message size from which GzipCompressor
// deflates. Smaller messages (acknowledgements, batches of a few changes)
// are what a busy stream mostly carries; snapshot chunks are far larger.
const DefaultDeflateFrom = 4 << 10

// GzipCompressor is the sync streams' gzip, a grpc encoding.Compressor
// registered under "gzip" in place of grpc-go's. It deflates a message of
// at least deflateFrom bytes at level 1 and writes a smaller one as stored
// (uncompressed) deflate blocks. Either is a gzip stream that any gzip
// reader takes, so the peer needs nothing new. Why: deflating a one-change
// batch of 186 bytes costs about 8 µs and a stored block 0.2 µs
// (BenchmarkSyncGzip), the gain is a few dozen bytes, and a global pays it
// once per zone session for every change it fans out.
//
// Safe for concurrent use: gRPC calls Compress and Decompress from every
// stream.
type GzipCompressor struct {
	deflateFrom int
	gated       sync.Pool // *gatedWriter
	deflaters   sync.Pool // *gzip.Writer at flate.BestSpeed
	storers     sync.Pool // *gzip.Writer at gzip.NoCompression
	readers     sync.Pool // *gzipReader
}

// RegisterGzip makes this package's compressor gRPC's "gzip" for the whole
// process: a message of 4 KiB or more is deflated at level 1, as RPC stacks
// commonly do (at the default level every message resets 640 KB of match
// tables); a smaller one is sent in stored blocks, since deflating the many
// small batches and acknowledgements of a stream cost more than it saved.
// gRPC's compressor registry is process-wide, so the binaries call it
// first, before any stream.
func RegisterGzip() {
	encoding.RegisterCompressor(NewGzipCompressor(DefaultDeflateFrom))
}

// NewGzipCompressor returns a compressor that deflates messages of at least
// deflateFrom bytes (DefaultDeflateFrom when not positive).
func NewGzipCompressor(deflateFrom int) *GzipCompressor {
	if deflateFrom <= 0 {
		deflateFrom = DefaultDeflateFrom
	}
	c := &GzipCompressor{deflateFrom: deflateFrom}
	c.deflaters.New = func() any { return newGzipWriter(flate.BestSpeed) }
	c.storers.New = func() any { return newGzipWriter(gzip.NoCompression) }
	return c
}

func newGzipWriter(level int) *gzip.Writer {
	w, err := gzip.NewWriterLevel(io.Discard, level)
	if err != nil {
		panic(err) // the levels above are constants gzip accepts
	}
	return w
}

// Name implements encoding.Compressor.
func (c *GzipCompressor) Name() string { return GzipName }

// Compress implements encoding.Compressor. The writer holds a message's
// first bytes until they reach deflateFrom, so the choice is made on the
// message's size; gRPC writes a message and closes the writer.
func (c *GzipCompressor) Compress(w io.Writer) (io.WriteCloser, error) {
	g, _ := c.gated.Get().(*gatedWriter)
	if g == nil {
		g = &gatedWriter{c: c, held: make([]byte, 0, c.deflateFrom)}
	}
	g.dst = w
	return g, nil
}

// gatedWriter is one message being compressed.
type gatedWriter struct {
	c    *GzipCompressor
	dst  io.Writer
	held []byte       // the message so far, while under deflateFrom
	gz   *gzip.Writer // the deflater, once the message reached deflateFrom
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	if g.gz == nil && len(g.held)+len(p) < g.c.deflateFrom {
		g.held = append(g.held, p...)
		return len(p), nil
	}
	if g.gz == nil {
		g.gz = g.c.deflaters.Get().(*gzip.Writer)
		g.gz.Reset(g.dst)
		if _, err := g.gz.Write(g.held); err != nil {
			return 0, err
		}
		g.held = g.held[:0]
	}
	return g.gz.Write(p)
}

// Close finishes the gzip stream and returns the writers to their pools.
func (g *gatedWriter) Close() error {
	var err error
	if g.gz != nil {
		err = g.gz.Close()
		g.gz.Reset(io.Discard) // do not keep the stream's buffer
		g.c.deflaters.Put(g.gz)
	} else {
		st := g.c.storers.Get().(*gzip.Writer)
		st.Reset(g.dst)
		if _, err = st.Write(g.held); err == nil {
			err = st.Close()
		}
		st.Reset(io.Discard)
		g.c.storers.Put(st)
	}
	g.gz, g.dst, g.held = nil, nil, g.held[:0]
	g.c.gated.Put(g)
	return err
}

// Decompress implements encoding.Compressor. Both kinds of stream (and any
// other gzip a peer sends) are read by compress/gzip.
func (c *GzipCompressor) Decompress(r io.Reader) (io.Reader, error) {
	if z, _ := c.readers.Get().(*gzipReader); z != nil {
		if err := z.Reset(r); err != nil {
			c.readers.Put(z)
			return nil, err
		}
		return z, nil
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	return &gzipReader{Reader: zr, pool: &c.readers}, nil
}

// gzipReader goes back to the pool when gRPC closes it, after reading the
// message (gRPC closes a decompressed reader that is an io.Closer).
type gzipReader struct {
	*gzip.Reader
	pool *sync.Pool
}

func (z *gzipReader) Close() error {
	err := z.Reader.Close()
	z.pool.Put(z)
	return err
}
