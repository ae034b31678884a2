package boltstore

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestGatherReturning: a group waits for the writers the previous group
// answered only until they are back (want), never past the wait, and never
// beyond MaxWriteGroup.
func TestGatherReturning(t *testing.T) {
	tests := []struct {
		name     string
		maxGroup int
		senders  int
		want     int
		wait     time.Duration
		wantLen  int
	}{
		{"writers come back", 16, 3, 4, time.Hour, 4},
		{"capped by MaxWriteGroup", 2, 3, 4, time.Hour, 2},
		{"nobody comes back", 16, 0, 4, 5 * time.Millisecond, 1},
		{"no wait allowed", 16, 3, 4, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Store{writes: make(chan *writeReq), closing: make(chan struct{}), cfg: Config{MaxWriteGroup: tt.maxGroup}}
			stop := make(chan struct{})
			defer close(stop)
			for range tt.senders {
				go func() {
					select {
					case s.writes <- &writeReq{ctx: context.Background()}:
					case <-stop:
					}
				}()
			}
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			done := make(chan int, 1)
			go func() {
				done <- len(s.gatherReturning([]*writeReq{{}}, tt.want, tt.wait, timer))
			}()
			select {
			case got := <-done:
				if got != tt.wantLen {
					t.Fatalf("group of %d, want %d", got, tt.wantLen)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("gatherReturning did not return")
			}
		})
	}
}

// TestGatherReturningEndsOnClose: a store closing does not wait for
// writers that may come back.
func TestGatherReturningEndsOnClose(t *testing.T) {
	s := &Store{writes: make(chan *writeReq), closing: make(chan struct{}), cfg: Config{MaxWriteGroup: 16}}
	close(s.closing)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	if got := len(s.gatherReturning([]*writeReq{{}}, 4, time.Hour, timer)); got != 1 {
		t.Fatalf("group of %d, want 1", got)
	}
}

// TestLastGroupTarget: when the next group waits for the writers the last
// one answered, and for how many.
func TestLastGroupTarget(t *testing.T) {
	ended := time.Unix(1000, 0)
	const took = 800 * time.Microsecond
	tests := []struct {
		name     string
		last     lastGroup
		have     int
		arrived  time.Time
		maxWait  time.Duration
		wantN    int
		wantWait time.Duration
	}{
		{"nothing committed yet", lastGroup{}, 1, ended, time.Millisecond, 0, 0},
		{"queued: the answered writers join the queued ones",
			lastGroup{answered: 8, took: took, ended: ended, queued: true}, 3, time.Time{}, time.Millisecond, 11, took},
		{"queued after a lone writer: it may come back",
			lastGroup{answered: 1, took: took, ended: ended, queued: true}, 1, time.Time{}, time.Millisecond, 2, took},
		{"first of a cohort back soon: wait for the rest",
			lastGroup{answered: 8, took: took, ended: ended}, 1, ended.Add(100 * time.Microsecond), time.Millisecond, 8, took},
		{"wait capped by maxWait",
			lastGroup{answered: 8, took: 5 * time.Millisecond, ended: ended}, 1, ended.Add(time.Millisecond), 2 * time.Millisecond, 8, 2 * time.Millisecond},
		{"a lone writer never waits for itself",
			lastGroup{answered: 1, took: took, ended: ended}, 1, ended.Add(10 * time.Microsecond), time.Millisecond, 0, 0},
		{"a write after a pause does not wait",
			lastGroup{answered: 8, took: took, ended: ended}, 1, ended.Add(time.Second), time.Millisecond, 0, 0},
		{"no wait configured", lastGroup{answered: 8, took: 0, ended: ended, queued: true}, 1, time.Time{}, time.Millisecond, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, wait := tt.last.target(tt.have, tt.arrived, tt.maxWait)
			// Only a want above have makes the group wait; then the
			// want and the wait must be exact.
			waits, wantWaits := n > tt.have, tt.wantN > tt.have
			if waits != wantWaits || wantWaits && (n != tt.wantN || wait != tt.wantWait) {
				t.Fatalf("target = %d writes, wait %v; want %d, %v", n, wait, tt.wantN, tt.wantWait)
			}
		})
	}
}

// commitCounter is a CommitObserver that sums what it is told.
type commitCounter struct {
	mu              sync.Mutex
	commits, writes int
}

func (c *commitCounter) ObserveCommit(writes int, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commits++
	c.writes += writes
}

// TestCohortSharesCommits: eight writers that write again as soon as they are
// answered share commits instead of splitting into a group of one and a
// group of seven in turn: with alternating cohorts 8 writers × 50 writes took
// about 100 commits; sharing takes close to 50. The observer also sees every
// write once.
func TestCohortSharesCommits(t *testing.T) {
	var counted commitCounter
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "c.db"), Commits: &counted})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, _, err := s.Put(ctx, benchResource(w*each+i, i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// The committer observes a commit after answering its writers: the
	// last one may still be on its way.
	var commits, writes int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		counted.mu.Lock()
		commits, writes = counted.commits, counted.writes
		counted.mu.Unlock()
		if writes >= writers*each || time.Now().After(deadline) {
			break
		}
	}
	if writes != writers*each {
		t.Fatalf("the observer saw %d writes, want %d", writes, writers*each)
	}
	if limit := writers * each / 5; commits > limit {
		t.Fatalf("%d writes took %d commits, want at most %d (about %d when the writers share commits)", writers*each, commits, limit, each)
	}
	t.Logf("%d writes in %d commits", writers*each, commits)
}
