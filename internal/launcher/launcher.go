// Package launcher builds Meridian's binaries and runs them as real child
// processes. The integration tests and the local multizone runner share it,
// so the README's main job and the tests start processes the same way.
package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Binaries are the paths of the built commands.
type Binaries struct {
	Global      string
	Zone        string
	Meridianctl string
	// MeridianDP is the workloads' agent; Greeter the example gRPC
	// workload (examples/greeter).
	MeridianDP string
	Greeter    string
}

// Build compiles the module's commands (and the example workload) rooted
// at moduleRoot into outDir. extraArgs go to `go build` (e.g. -race).
func Build(ctx context.Context, moduleRoot, outDir string, extraArgs ...string) (Binaries, error) {
	b := Binaries{
		Global:      filepath.Join(outDir, "global-cp"),
		Zone:        filepath.Join(outDir, "zone-cp"),
		Meridianctl: filepath.Join(outDir, "meridianctl"),
		MeridianDP:  filepath.Join(outDir, "meridian-dp"),
		Greeter:     filepath.Join(outDir, "greeter"),
	}
	args := append([]string{"build", "-o", outDir + string(os.PathSeparator)}, extraArgs...)
	args = append(args, "./cmd/global", "./cmd/zone", "./cmd/meridianctl", "./cmd/meridian-dp", "./examples/greeter")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return b, fmt.Errorf("go build: %w: %s", err, out)
	}
	// go build names the outputs after the package directories.
	for from, to := range map[string]string{"global": b.Global, "zone": b.Zone} {
		if err := os.Rename(filepath.Join(outDir, from), to); err != nil {
			return b, fmt.Errorf("rename %s: %w", from, err)
		}
	}
	return b, nil
}

// ModuleRoot walks up from dir to the directory holding go.mod.
func ModuleRoot(dir string) (string, error) {
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found")
		}
		dir = parent
	}
}

// FreeAddress returns a loopback address with a port that was free a moment
// ago.
func FreeAddress() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Process is one running (or stopped) child. It can be restarted with the
// same arguments after Kill or Stop.
type Process struct {
	Name string
	Path string
	Args []string
	// Log receives the child's stdout and stderr.
	Log io.Writer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start launches the process.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s: already running", p.Name)
		}
	}
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Stdout = p.Log
	cmd.Stderr = p.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.err = cmd, done, nil
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// PID is the current run's process id (0 before Start).
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited is closed when the current run ends.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ExitErr is the current run's exit error (nil before exit or on status 0).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() error { return p.signal(syscall.SIGKILL, 10*time.Second) }

// Stop sends SIGTERM and waits up to timeout for a graceful exit.
func (p *Process) Stop(timeout time.Duration) error { return p.signal(syscall.SIGTERM, timeout) }

func (p *Process) signal(sig syscall.Signal, timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within %s after %s", p.Name, timeout, sig)
	}
}

// WaitHTTP polls url until it answers 200, the process exits, or ctx ends.
func (p *Process) WaitHTTP(ctx context.Context, url string) error {
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w", p.Name, url, ctx.Err())
		case <-p.Exited():
			return fmt.Errorf("%s exited before ready: %v", p.Name, p.ExitErr())
		case <-tick.C:
		}
	}
}

// PrefixWriter prefixes every line written to W, for interleaved logs.
type PrefixWriter struct {
	Prefix string
	W      io.Writer

	mu      sync.Mutex
	partial []byte
}

func (w *PrefixWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, b...)
	for {
		i := strings.IndexByte(string(w.partial), '\n')
		if i < 0 {
			break
		}
		if _, err := fmt.Fprintf(w.W, "%s%s\n", w.Prefix, w.partial[:i]); err != nil {
			return 0, err
		}
		w.partial = w.partial[i+1:]
	}
	return len(b), nil
}
