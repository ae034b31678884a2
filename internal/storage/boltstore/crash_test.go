package boltstore

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// crashChildEnv, when set, turns TestCrashSafety into the writer child:
// its value is the data directory.
const crashChildEnv = "BOLTSTORE_CRASH_CHILD_DIR"

// TestCrashSafety re-executes this test binary as a child that writes in a
// loop (concurrent puts, batches with meta, create+delete pairs) and prints
// each acknowledged write; the parent SIGKILLs it mid-write, reopens the
// file and checks that no acknowledged write is lost and the store is
// consistent.
func TestCrashSafety(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		runCrashChild(dir)
		return
	}
	for round, acksBeforeKill := range []int{40, 300, 900} {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			dir := t.TempDir()
			acks := runAndKill(t, dir, acksBeforeKill)
			verifyAfterCrash(t, dir, acks)
		})
	}
}

// crashAcks is what the child acknowledged.
type crashAcks struct {
	puts    map[string]uint64 // name -> highest acknowledged version
	deleted []string
	batches int    // acknowledged batches (one revision each)
	batchNo uint64 // highest acknowledged batch number (its meta value)
	writes  uint64 // acknowledged writes, i.e. revisions
}

func runAndKill(t *testing.T, dir string, acksBeforeKill int) *crashAcks {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashSafety$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acks := &crashAcks{puts: map[string]uint64{}}
	r := bufio.NewReader(stdout)
	n := 0
	for n < acksBeforeKill {
		line, err := r.ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("child ended after %d acks: %v; stderr:\n%s", n, err, stderr.String())
		}
		if acks.add(t, line) {
			n++
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no deferred code, no Close
		t.Fatal(err)
	}
	// Lines the child wrote before dying were acknowledged too; a final
	// line without its newline was not.
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		acks.add(t, line)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Exited() {
		t.Fatalf("child was not killed by the signal: %v; stderr:\n%s", err, stderr.String())
	}
	t.Logf("killed the child after %d acknowledged writes", acks.writes)
	return acks
}

// add records one line of child output; it reports whether it was an ack.
func (a *crashAcks) add(t *testing.T, line string) bool {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "ack" {
		return false
	}
	switch {
	case f[1] == "put" && len(f) == 4:
		a.putAck(t, f[2], f[3])
		a.writes++
	case f[1] == "del" && len(f) == 3:
		a.deleted = append(a.deleted, f[2])
		a.writes += 2 // the create and the delete
	case f[1] == "batch" && len(f) >= 3:
		no, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			t.Fatalf("bad ack %q", line)
		}
		a.batchNo = max(a.batchNo, no)
		for _, nv := range f[3:] {
			name, ver, _ := strings.Cut(nv, ":")
			a.putAck(t, name, ver)
		}
		a.batches++
		a.writes++
	default:
		t.Fatalf("bad ack %q", line)
	}
	return true
}

func (a *crashAcks) putAck(t *testing.T, name, version string) {
	v, err := strconv.ParseUint(version, 10, 64)
	if err != nil {
		t.Fatalf("bad version in ack %q", version)
	}
	a.puts[name] = max(a.puts[name], v)
}

func crashKey(name string) resource.Key {
	return resource.Key{Type: "MeshTimeout", Mesh: "default", Name: name}
}

func verifyAfterCrash(t *testing.T, dir string, acks *crashAcks) {
	ctx := t.Context()
	s, err := Open(Config{Path: filepath.Join(dir, "meridian.db"), Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("open after crash: %v", err)
	}
	defer s.Close()
	checkBolt(t, s)
	for name, v := range acks.puts {
		r, err := s.Get(ctx, crashKey(name))
		if err != nil || r.Version < v {
			t.Errorf("acknowledged put %s v%d lost: got %+v, %v", name, v, r, err)
		}
	}
	for _, name := range acks.deleted {
		if _, err := s.Get(ctx, crashKey(name)); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("acknowledged delete of %s lost: %v", name, err)
		}
	}
	if acks.batches > 0 {
		m, err := s.Meta(ctx, "batch")
		no, _ := strconv.ParseUint(string(m), 10, 64)
		if err != nil || no < acks.batchNo {
			t.Errorf("meta of acknowledged batch %d lost: %q, %v", acks.batchNo, m, err)
		}
	}
	rev, _ := s.Revision(ctx)
	if rev < acks.writes {
		t.Errorf("revision %d below the %d acknowledged writes", rev, acks.writes)
	}
	checkWatchReplay(t, s)
}

// checkBolt runs bbolt's own consistency check of every page.
func checkBolt(t *testing.T, s *Store) {
	t.Helper()
	err := s.db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() { // drained fully: the checker reads pages of this tx
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatalf("bbolt consistency check: %v", err)
	}
}

// checkWatchReplay: a watch from 0, replayed, equals the listed content.
func checkWatchReplay(t *testing.T, s *Store) {
	ctx := t.Context()
	ch, err := s.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	sentinel, _, err := s.Put(ctx, &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: "sentinel"})
	if err != nil {
		t.Fatal(err)
	}
	head, _ := s.Revision(ctx)
	got := map[resource.Key]uint64{}
	for ev := range ch {
		if ev.Kind == storage.EventDelete {
			delete(got, ev.Resource.Key())
		} else {
			got[ev.Resource.Key()] = ev.Resource.Version
		}
		if ev.Revision == head {
			break
		}
	}
	list, err := s.List(ctx, storage.ListOptions{Type: "MeshTimeout"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(got) {
		t.Errorf("watch replay holds %d resources, list %d", len(got), len(list.Items))
	}
	for _, r := range list.Items {
		if got[r.Key()] != r.Version {
			t.Errorf("%s: watch replay has version %d, store %d", r.Key(), got[r.Key()], r.Version)
		}
	}
	if got[sentinel.Key()] != 1 {
		t.Errorf("watch did not reach the sentinel")
	}
}

// runCrashChild writes until killed. It exits by itself after a minute in
// case the parent died without killing it.
func runCrashChild(dir string) {
	time.AfterFunc(time.Minute, func() { os.Exit(3) })
	s, err := Open(Config{Path: filepath.Join(dir, "meridian.db")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	ack := func(format string, args ...any) {
		// One write(2) per line, after the write returned: an ack on
		// stdout always follows its commit.
		mu.Lock()
		defer mu.Unlock()
		_, _ = os.Stdout.WriteString("ack " + fmt.Sprintf(format, args...) + "\n")
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child write:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	for g := range 4 {
		go crashPutter(ctx, s, g, ack, fail)
	}
	go crashBatcher(ctx, s, ack, fail)
	go crashDeleter(ctx, s, ack, fail)
	select {}
}

type ackFunc func(format string, args ...any)

func crashPutter(ctx context.Context, s *Store, g int, ack ackFunc, fail func(error)) {
	for i := 0; ; i++ {
		name := fmt.Sprintf("p%d-%d", g, i%25)
		r := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: name, Spec: fmt.Appendf(nil, `{"i":%d}`, i)}
		out, _, err := s.Put(ctx, r)
		if err != nil {
			fail(err)
		}
		ack("put %s %d", name, out.Version)
	}
}

func crashBatcher(ctx context.Context, s *Store, ack ackFunc, fail func(error)) {
	for no := 1; ; no++ {
		b := storage.Batch{Meta: map[string][]byte{"batch": fmt.Append(nil, no)}}
		for k := range 5 {
			b.Puts = append(b.Puts, &resource.Resource{Type: "MeshTimeout", Mesh: "default",
				Name: fmt.Sprintf("b-%d", (no*5+k)%40), Spec: fmt.Appendf(nil, `{"batch":%d}`, no)})
		}
		if _, err := s.Apply(ctx, b); err != nil {
			fail(err)
		}
		// Only this goroutine writes b-*, so these reads see this batch.
		var vs []string
		for _, p := range b.Puts {
			r, err := s.Get(ctx, p.Key())
			if err != nil {
				fail(err)
			}
			vs = append(vs, fmt.Sprintf("%s:%d", r.Name, r.Version))
		}
		ack("batch %d %s", no, strings.Join(vs, " "))
	}
}

func crashDeleter(ctx context.Context, s *Store, ack ackFunc, fail func(error)) {
	for i := 0; ; i++ {
		r := &resource.Resource{Type: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("d-%d", i), Labels: resource.NewLabels(map[string]string{"gone": "yes"})}
		if _, err := s.Create(ctx, r); err != nil {
			fail(err)
		}
		if err := s.Delete(ctx, r.Key(), 1); err != nil {
			fail(err)
		}
		ack("del %s", r.Name)
	}
}
