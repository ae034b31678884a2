package integration

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// linkProxy is a TCP proxy on loopback between a zone and the global, for
// fault tests: it can cut every connection, stay down (a partition: cut and
// refuse new connections), stall them (the connections stay open but no
// byte moves, as with a dead middlebox) or throttle them (bytes per second,
// each direction).
type linkProxy struct {
	t      *testing.T
	ln     net.Listener
	target string

	mu      sync.Mutex
	stalled bool
	down    bool
	rate    int // bytes per second per direction; 0 = unlimited
	cond    *sync.Cond
	conns   []net.Conn
}

func startProxy(t *testing.T, target string) *linkProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &linkProxy{t: t, ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.setStalled(false)
		p.cut()
	})
	return p
}

func (p *linkProxy) addr() string { return p.ln.Addr().String() }

func (p *linkProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies src to dst in small chunks, waiting while the link is stalled.
func (p *linkProxy) pipe(src, dst net.Conn) {
	defer dst.Close()
	buf := make([]byte, 16<<10)
	for {
		p.mu.Lock()
		rate := p.rate
		p.mu.Unlock()
		chunk := buf
		if rate > 0 {
			chunk = buf[:min(len(buf), max(rate/20, 512))] // ~20 writes a second
		}
		n, err := src.Read(chunk)
		if n > 0 {
			p.mu.Lock()
			for p.stalled {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if rate > 0 {
				time.Sleep(time.Duration(n) * time.Second / time.Duration(rate))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
			return
		}
	}
}

// setStalled stops (or resumes) moving bytes on every connection.
func (p *linkProxy) setStalled(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = v
	p.cond.Broadcast()
}

// setDown partitions the link (cuts every connection and refuses new ones)
// or heals it.
func (p *linkProxy) setDown(v bool) {
	p.mu.Lock()
	p.down = v
	p.mu.Unlock()
	if v {
		p.cut()
	}
}

// setRate throttles every connection to bytes per second per direction
// (0: unlimited).
func (p *linkProxy) setRate(bytesPerSecond int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = bytesPerSecond
}

// cut closes every connection (new ones are still accepted).
func (p *linkProxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// waitFor polls until cond holds or the timeout passes, returning how long
// it took.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("after %s: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestStalledLinkIsDetectedAndRecovers (fault suite, first
// scenario): a link that stays open but moves no byte is detected by the
// heartbeats within their timeout on both sides; the zone redials, and what
// both sides wrote during the stall converges once the link moves again.
func TestStalledLinkIsDetectedAndRecovers(t *testing.T) {
	kds := freeAddress(t)
	hb := []string{"--kds-heartbeat-interval", "500ms", "--kds-heartbeat-timeout", "2s"}
	g := startNode(t, "global", bins.Global, t.TempDir(), append([]string{"--kds-address", kds}, hb...)...)
	proxy := startProxy(t, kds)
	tokenFile := filepath.Join(t.TempDir(), "zone-1.token")
	zoneTokenWithID(t, g, "zone-1", tokenFile)
	z := startNode(t, "zone-1", bins.Zone, t.TempDir(), append([]string{"--zone", "zone-1", "--environment", "universal",
		"--global-address", proxy.addr(), "--zone-token-file", tokenFile,
		"--kds-ca-file", filepath.Join(g.dataDir, "kds-server.crt")}, hb...)...)
	waitPresent(t, z, "/meshes/default")

	proxy.setStalled(true)
	took := waitFor(t, 10*time.Second, "the global to notice the stalled zone", func() bool { return !zoneConnected(t, g, "zone-1") })
	t.Logf("stall detected by the global after %s", took.Round(10*time.Millisecond))
	if took > 4*time.Second {
		t.Errorf("a stall went unnoticed for %s with a 2 s heartbeat timeout", took)
	}
	waitFor(t, 10*time.Second, "the zone to notice", func() bool {
		_, body := z.request("GET", "/", "")
		return strings.Contains(string(body), "silent")
	})
	apply(t, g, strings.ReplaceAll(globalTimeout, "default-timeout-global", "written-in-stall-global"))
	apply(t, z, strings.ReplaceAll(globalTimeout, "default-timeout-global", "written-in-stall-zone"))

	proxy.setStalled(false)
	took = waitFor(t, 20*time.Second, "convergence after the stall", func() bool {
		_, onZone := z.request("GET", "/meshes/default/meshtimeouts?filter[labels.kuma.io/display-name]=written-in-stall-global", "")
		_, onGlobal := g.request("GET", "/meshes/default/meshtimeouts?filter[labels.kuma.io/display-name]=written-in-stall-zone", "")
		return !strings.Contains(string(onZone), `"total":0`) && !strings.Contains(string(onGlobal), `"total":0`)
	})
	t.Logf("converged %s after the link moved again", took.Round(10*time.Millisecond))
}
