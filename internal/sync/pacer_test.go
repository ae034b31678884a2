package sync

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tests := []struct {
		name string
		p    pacer
		// at each time a batch is ready; want the wait the pacer asks for
		// (a batch that may leave is taken).
		at   []time.Time
		want []time.Duration
	}{
		{"disabled", pacer{}, []time.Time{ms(0), ms(0), ms(0)}, []time.Duration{0, 0, 0}},
		{"burst then interval", pacer{interval: 10 * time.Millisecond, burst: 3},
			[]time.Time{ms(0), ms(0), ms(0), ms(0), ms(4), ms(10)},
			[]time.Duration{0, 0, 0, 10 * time.Millisecond, 6 * time.Millisecond, 0}},
		{"a quiet stream refills", pacer{interval: 10 * time.Millisecond, burst: 2},
			[]time.Time{ms(0), ms(0), ms(100), ms(100), ms(100)},
			[]time.Duration{0, 0, 0, 0, 10 * time.Millisecond}},
		{"burst of one", pacer{interval: 10 * time.Millisecond, burst: 1},
			[]time.Time{ms(0), ms(5), ms(10), ms(15)},
			[]time.Duration{0, 5 * time.Millisecond, 0, 5 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			for i, now := range tt.at {
				got := p.wait(now)
				if got != tt.want[i] {
					t.Fatalf("batch %d at %s: wait %s, want %s", i, now.Sub(t0), got, tt.want[i])
				}
				if got == 0 {
					p.take(now)
				}
			}
		})
	}
}
