package boltstore

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// TestReleaseMap: after a list of every resource the store's file is
// resident in the process; ReleaseMap takes it out of the resident set, and
// the store reads and writes as before.
func TestReleaseMap(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "r.db")
	s, err := Open(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 20000
	batch := storage.Batch{Puts: make([]*resource.Resource, n)}
	for i := range batch.Puts {
		batch.Puts[i] = benchResource(i, 0)
	}
	if _, err := s.Apply(ctx, batch); err != nil {
		t.Fatal(err)
	}
	listAll := func() int {
		t.Helper()
		res, err := s.List(ctx, storage.ListOptions{Type: "MeshTimeout"})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Items)
	}
	if got := listAll(); got != n {
		t.Fatalf("listed %d resources, want %d", got, n)
	}
	before := mappedRSS(t, path)
	if before < 1<<20 {
		t.Fatalf("store map resident after a full list: %d KiB, want at least 1 MiB", before>>10)
	}
	if err := s.ReleaseMap(ctx); err != nil {
		t.Fatal(err)
	}
	after := mappedRSS(t, path)
	// The meta pages and what the committer or expiry loop touched since
	// may be back; the bulk must be gone.
	if after > before/10 {
		t.Errorf("store map resident: %d KiB before ReleaseMap, %d KiB after; want a tenth at most", before>>10, after>>10)
	}
	if got := listAll(); got != n {
		t.Fatalf("after ReleaseMap: listed %d resources, want %d", got, n)
	}
	if _, _, err := s.Put(ctx, benchResource(n, 0)); err != nil {
		t.Fatalf("put after ReleaseMap: %v", err)
	}
	got, err := s.Get(ctx, benchResource(7, 0).Key())
	if err != nil || got.Name != benchResource(7, 0).Name {
		t.Fatalf("get after ReleaseMap: %v, %v", got, err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseMap(ctx); err == nil {
		t.Error("ReleaseMap on a closed store: no error")
	}
}

// mappedRSS is the resident size of this process's mappings of path, from
// /proc/self/smaps.
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	var total int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		switch {
		case len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			in = len(fields) >= 6 && fields[5] == path
		case in && fields[0] == "Rss:":
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			total += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}
