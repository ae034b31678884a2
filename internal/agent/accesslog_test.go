package agent

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestAccessLogPipeForwards writes lines as Envoy's file logger does and
// reads the messages at their address: a plain message as written, a JSON
// message as one line; lines without an address or too long are dropped,
// as are lines for a backend that cannot be reached, and forwarding goes
// on.
func TestAccessLogPipeForwards(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 10)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			got <- sc.Text()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	f, err := ForwardAccessLogs(ctx, dir, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if st, err := os.Stat(f.Path()); err != nil || st.Mode()&os.ModeNamedPipe == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("pipe %v, %v", st, err)
	}
	w, err := os.OpenFile(filepath.Join(dir, AccessLogPipe), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	addr := ln.Addr().String()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	closed.Close()
	lines := []string{
		// An unreachable backend: its entries are dropped (the second
		// without trying again), and the others still flow.
		`{"address":"` + gone + `","message":"lost\n"}`,
		`{"address":"` + gone + `","message":"lost too\n"}`,
		`{"address":"` + addr + `","message":"GET /a 200\n"}`,
		`{"message":"no address"}`,
		`{"address":"` + addr + `","message":"` + string(make([]byte, maxLogLine)) + `"}`,
		`{"address":"` + addr + `","message":{"path":"/b","status":"200"}}`,
	}
	for _, l := range lines {
		if _, err := w.WriteString(l + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"GET /a 200", `{"path":"/b","status":"200"}`}
	for _, w := range want {
		select {
		case g := <-got:
			if g != w {
				t.Fatalf("got %q, want %q", g, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %q", w)
		}
	}
}
