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
		pending int           // changes waiting to leave
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
		{"while changes keep coming, batches are spaced by the interval", pacer{interval: 20 * time.Millisecond},
			[]batch{{ms(0), 1, 0}, {ms(3), 4, 0}, {ms(6), 2, quietWindow}, {ms(9), 3, quietWindow},
				{ms(13), 4, quietWindow}, {ms(17), 5, 6 * time.Millisecond}, {ms(23), 5, 0},
				{ms(26), 1, quietWindow}, {ms(36), 1, 0}, {ms(37), 1, 0}}},
		{"a burst's tail leaves once quiet, before the spacing", pacer{interval: 20 * time.Millisecond},
			[]batch{{ms(0), 6, 0}, {ms(1), 2, quietWindow}, {ms(4), 2, 7 * time.Millisecond}, {ms(11), 2, 0}}},
		{"a quiet stream does not wait", pacer{interval: 20 * time.Millisecond},
			[]batch{{ms(0), 6, 0}, {ms(100), 6, 0}}},
		{"a slow peer spaces batches by its answer time", pacer{interval: 20 * time.Millisecond, answer: 5 * time.Millisecond},
			[]batch{{ms(0), 6, 0}, {ms(20), 6, quietWindow}, {ms(28), 7, quietWindow}, {ms(36), 8, 4 * time.Millisecond},
				{ms(40), 8, 0}}},
		{"up to maxSpacing", pacer{interval: 20 * time.Millisecond, answer: time.Second},
			[]batch{{ms(0), 6, 0}, {ms(47), 6, 3 * time.Millisecond}, {ms(49), 7, time.Millisecond}, {ms(50), 7, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			for i, b := range tt.batches {
				got := p.wait(b.at, b.pending)
				if got != b.want {
					t.Fatalf("batch %d at %s: wait %s, want %s", i, b.at.Sub(t0), got, b.want)
				}
				if got == 0 {
					p.sent(b.at, b.pending)
				}
			}
		})
	}
}
