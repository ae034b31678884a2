package kds

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type batch struct {
		at      time.Time
		changes int
		want    time.Duration // the wait asked for; a batch that may leave is sent
	}
	tests := []struct {
		name    string
		p       pacer
		batches []batch
	}{
		{"disabled", pacer{}, []batch{{ms(0), 5, 0}, {ms(0), 5, 0}, {ms(1), 5, 0}}},
		{"single changes never wait", pacer{interval: 20 * time.Millisecond},
			[]batch{{ms(0), 1, 0}, {ms(1), 1, 0}, {ms(2), 1, 0}}},
		{"after several changes the next waits the interval", pacer{interval: 20 * time.Millisecond},
			[]batch{{ms(0), 1, 0}, {ms(3), 4, 0}, {ms(6), 2, 17 * time.Millisecond}, {ms(23), 2, 0},
				{ms(30), 1, 13 * time.Millisecond}, {ms(43), 1, 0}, {ms(44), 3, 0}}},
		{"a quiet stream does not wait", pacer{interval: 20 * time.Millisecond},
			[]batch{{ms(0), 6, 0}, {ms(100), 6, 0}}},
		{"a slow peer spaces batches by its answer time", pacer{interval: 20 * time.Millisecond, answer: 5 * time.Millisecond},
			[]batch{{ms(0), 6, 0}, {ms(20), 6, 20 * time.Millisecond}, {ms(40), 6, 0}}},
		{"up to maxSpacing", pacer{interval: 20 * time.Millisecond, answer: time.Second},
			[]batch{{ms(0), 6, 0}, {ms(1), 6, maxSpacing - time.Millisecond}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			for i, b := range tt.batches {
				got := p.wait(b.at)
				if got != b.want {
					t.Fatalf("batch %d at %s: wait %s, want %s", i, b.at.Sub(t0), got, b.want)
				}
				if got == 0 {
					p.sent(b.at, b.changes)
				}
			}
		})
	}
}
