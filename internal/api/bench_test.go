package api_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPutRate8Clients measures BENCHMARKS.md's "PUT rate on the global REST API,
// 8 clients": real HTTP over loopback into the bbolt store (fsync per commit
// group). Reported as puts/s.
// timeoutJSON is what API clients send: JSON, not YAML.
const timeoutJSON = `{"type":"MeshTimeout","mesh":"default","name":"t%d","spec":{"targetRef":{"kind":"Mesh"},` +
	`"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"%ds"}}]}}`

func BenchmarkPutRate8Clients(b *testing.B) {
	f := newFixture(b, testGlobal)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				body := fmt.Sprintf(timeoutJSON, i%2000, i)
				req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/meshes/default/meshtimeouts/t%d", f.srv.URL, i%2000), strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode >= 300 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "puts/s")
}
