// Package integration starts the real binaries and drives them over their
// APIs and the CLI. TestMain builds the binaries once.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-mesh/meridian/internal/launcher"
)

var bins launcher.Binaries

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	wd, _ := os.Getwd()
	root, err := launcher.ModuleRoot(wd)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "meridian-it-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bins, err = launcher.Build(ctx, root, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// node is one control plane process under test.
type node struct {
	t       *testing.T
	proc    *launcher.Process
	api     string // http://host:port
	dataDir string
	log     *logBuffer
	xds     string // a zone's xDS address
}

// logBuffer collects a child's output; the child's copier goroutine writes
// while the test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logBuffer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

func (s *logBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// startNode starts bin with a fresh API address and the given args, and
// waits for /readyz. The process is stopped when the test ends.
func startNode(t *testing.T, name, bin, dataDir string, args ...string) *node {
	t.Helper()
	addr, err := launcher.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, dataDir: dataDir, api: "http://" + addr, log: &logBuffer{}}
	full := append([]string{"--data-dir", dataDir, "--api-address", addr, "--log-level", "debug"}, args...)
	if bin == bins.Zone && !slices.Contains(args, "--xds-address") {
		// Each zone its own xDS address: several run side by side.
		if n.xds, err = launcher.FreeAddress(); err != nil {
			t.Fatal(err)
		}
		full = append(full, "--xds-address", n.xds)
	}
	n.proc = &launcher.Process{Name: name, Path: bin, Args: full, Log: n.log}
	n.start()
	t.Cleanup(func() {
		_ = n.proc.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("%s log:\n%s", name, n.log.String())
		}
	})
	return n
}

// eventually retries check until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *node) start() {
	n.t.Helper()
	if err := n.proc.Start(); err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.proc.WaitHTTP(ctx, n.api+"/readyz"); err != nil {
		n.t.Fatalf("%v\n%s", err, n.log.String())
	}
}

func (n *node) request(method, path, body string) (int, []byte) {
	n.t.Helper()
	req, err := http.NewRequest(method, n.api+path, strings.NewReader(body))
	if err != nil {
		n.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", contentType(body))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// ctlToken runs a meridianctl command that prints a token on stdout (its
// id goes to stderr) and returns the token, or fails the test.
func (n *node) ctlToken(args ...string) string {
	n.t.Helper()
	cmd := exec.Command(bins.Meridianctl, append([]string{"--api-address", n.api}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		n.t.Fatalf("meridianctl %v: %v: %s", args, err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "token id ") {
		n.t.Errorf("meridianctl %v: no token id on stderr: %q", args, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// ctl runs meridianctl against n and returns its combined output and exit code.
func (n *node) ctl(stdin string, args ...string) (string, int) {
	n.t.Helper()
	cmd := exec.Command(bins.Meridianctl, append([]string{"--api-address", n.api}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		if !ok {
			n.t.Fatalf("meridianctl %v: %v", args, err)
		}
		code = exitErr.ExitCode()
	}
	return string(out), code
}

func examplePath(t *testing.T, name string) string {
	t.Helper()
	wd, _ := os.Getwd()
	root, err := launcher.ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "examples", name)
}

// contentType is what a client states for a test's body: JSON or YAML.
func contentType(body string) string {
	if b := strings.TrimSpace(body); strings.HasPrefix(b, "{") || strings.HasPrefix(b, "[") {
		return "application/json"
	}
	return "application/yaml"
}
