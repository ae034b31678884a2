package boltstore

import (
	"context"
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
