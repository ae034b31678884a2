// Package etcdtest starts real etcd servers on loopback for tests: the
// conformance suite of etcdstore and the HA scenarios of the integration
// suite. The server is Meridian's pinned etcd (tools/etcd), built once per
// version into the user's cache directory, or the binary named by
// MERIDIAN_ETCD_BIN.
package etcdtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary returns the etcd server binary, building it on first use.
func Binary() (string, error) {
	if p := os.Getenv("MERIDIAN_ETCD_BIN"); p != "" {
		return p, nil
	}
	buildOnce.Do(func() { buildPath, buildErr = build() })
	if buildErr != nil {
		return "", fmt.Errorf("building the pinned etcd server (tools/etcd): %w", buildErr)
	}
	return buildPath, nil
}

// build compiles tools/etcd into a cache directory keyed by its go.sum, so
// a pinned version is built once per machine (about a minute, from the Go
// module proxy) and reused by later test runs.
func build() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "tools", "etcd")
	sum, err := os.ReadFile(filepath.Join(src, "go.sum"))
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	h := sha256.Sum256(sum)
	out := filepath.Join(cache, "meridian", "etcd-"+hex.EncodeToString(h[:8]), "etcd")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, ".")
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in %s: %v\n%s", src, err, b)
	}
	return out, os.Rename(tmp, out)
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/meridian-mesh/meridian\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root (go.mod of github.com/meridian-mesh/meridian) not found above the working directory")
		}
		dir = parent
	}
}

// Member is one etcd server process.
type Member struct {
	Name       string
	ClientURL  string
	peerURL    string
	dataDir    string
	args       []string
	logFile    string
	bin        string
	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	restartArg string
}

// Cluster is a set of members started together.
type Cluster struct {
	Members []*Member
	// TLS is set with Options.TLS.
	TLS *TLSFiles
}

// Options tune the servers.
type Options struct {
	// ExtraArgs go to every member (e.g. "--max-txn-ops=64").
	ExtraArgs []string
	// TLS serves clients over HTTPS and requires client certificates
	// (Cluster.TLS has the files).
	TLS bool
}

// Start starts an n-member cluster on loopback and waits until it serves.
// The members are killed when the test ends.
func Start(t testing.TB, n int, o Options) *Cluster {
	t.Helper()
	c, err := Launch(t.TempDir(), n, o)
	if c != nil {
		t.Cleanup(c.Close)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Launch starts an n-member cluster with its data and logs in dir and waits
// until it serves; Close kills it. For tools (the benchmark command); tests
// use Start.
func Launch(dir string, n int, o Options) (*Cluster, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cluster{}
	scheme := "http://"
	if o.TLS {
		files, err := makeTLS(filepath.Join(dir, "tls"))
		if err != nil {
			return nil, err
		}
		c.TLS, scheme = files, "https://"
	}
	var initial []string
	for i := range n {
		client, err1 := freeAddr()
		peer, err2 := freeAddr()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		m := &Member{Name: fmt.Sprintf("m%d", i), ClientURL: scheme + client, peerURL: "http://" + peer,
			dataDir: filepath.Join(dir, fmt.Sprintf("m%d", i)), logFile: filepath.Join(dir, fmt.Sprintf("m%d.log", i)), bin: bin}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.peerURL)
	}
	for _, m := range c.Members {
		m.args = append([]string{
			"--name", m.Name, "--data-dir", m.dataDir,
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", filepath.Base(dir),
			"--log-level", "warn",
			// Loopback on a loaded 2-core machine: fast elections, still
			// tolerant of a slow fsync.
			"--heartbeat-interval", "100", "--election-timeout", "1000",
		}, o.ExtraArgs...)
		if c.TLS != nil {
			m.args = append(m.args, "--cert-file", c.TLS.ServerCertFile, "--key-file", c.TLS.ServerKeyFile,
				"--trusted-ca-file", c.TLS.CAFile, "--client-cert-auth")
		}
		m.restartArg = "new"
		if err := m.start(); err != nil {
			return c, err
		}
	}
	if err := c.WaitHealthy(60 * time.Second); err != nil {
		return c, err
	}
	for _, m := range c.Members {
		m.restartArg = "existing"
	}
	return c, nil
}

// Close kills every member.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.Kill()
	}
}

func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	log, err := os.OpenFile(m.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	args := append(append([]string{}, m.args...), "--initial-cluster-state", m.restartArg)
	cmd := exec.Command(m.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("start etcd %s: %w", m.Name, err)
	}
	m.cmd, m.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		_ = cmd.Wait()
		_ = log.Close()
		close(exited)
	}(m.exited)
	return nil
}

// Kill stops the member with SIGKILL and waits for it to exit.
func (m *Member) Kill() {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart starts a killed member again on its data.
func (m *Member) Restart(t testing.TB) {
	t.Helper()
	if err := m.start(); err != nil {
		t.Fatal(err)
	}
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// Client returns a client for every member, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := c.newClient(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func (c *Cluster) newClient(dial time.Duration) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: dial}
	if c.TLS != nil {
		t, err := c.TLS.Config()
		if err != nil {
			return nil, err
		}
		cfg.TLS = t
	}
	return clientv3.New(cfg)
}

// WaitHealthy waits until a linearizable read succeeds.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	cli, err := c.newClient(2 * time.Second)
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cli.Get(ctx, "health")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			var logs []string
			for _, m := range c.Members {
				b, _ := os.ReadFile(m.logFile)
				logs = append(logs, fmt.Sprintf("--- %s:\n%s", m.Name, tail(string(b), 2000)))
			}
			return fmt.Errorf("etcd cluster not healthy after %s: %v\n%s", timeout, err, strings.Join(logs, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Leader is the member that leads the cluster now.
func (c *Cluster) Leader(t testing.TB) *Member {
	t.Helper()
	cli, err := c.newClient(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, m := range c.Members {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, m.ClientURL)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return m
		}
	}
	t.Fatal("no etcd member says it leads")
	return nil
}

// Running reports whether the member's process is up (not killed).
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil
}
