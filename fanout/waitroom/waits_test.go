package waitroom

import (
	"testing"
	"time"
)

// TestWaitLog: admissions are counted by tier (out-of-range tiers
// clamped); the distribution covers only the waits recorded within
// WaitWindow, and only the latest WaitLogSize of a tier.
func TestWaitLog(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	s := time.Second
	type rec struct {
		tier int
		wait time.Duration
		at   time.Duration // after t0
	}
	many := func(tier, n int, at time.Duration) []rec {
		rs := make([]rec, n)
		for i := range rs {
			rs[i] = rec{tier, time.Duration(i+1) * s, at}
		}
		return rs
	}
	tests := []struct {
		name     string
		recs     []rec
		now      time.Duration
		admitted [MaxTier + 1]int64
		want     [MaxTier + 1]WaitStats
	}{
		{name: "none"},
		{
			name:     "one tier",
			recs:     []rec{{0, 3 * s, 0}, {0, 1 * s, 0}, {0, 2 * s, 0}, {0, 10 * s, 0}},
			now:      time.Minute,
			admitted: [MaxTier + 1]int64{4, 0, 0, 0},
			want:     [MaxTier + 1]WaitStats{{Count: 4, Mean: 4 * s, P50: 2 * s, P90: 10 * s, P99: 10 * s, Max: 10 * s}},
		},
		{
			name:     "tiers apart, clamped, negative wait as 0",
			recs:     []rec{{0, 5 * s, 0}, {3, 1 * s, 0}, {7, 3 * s, 0}, {-1, -2 * s, 0}},
			now:      time.Second,
			admitted: [MaxTier + 1]int64{2, 0, 0, 2},
			want: [MaxTier + 1]WaitStats{{Count: 2, Mean: 2500 * time.Millisecond, P50: 0, P90: 5 * s, P99: 5 * s, Max: 5 * s},
				{}, {}, {Count: 2, Mean: 2 * s, P50: 1 * s, P90: 3 * s, P99: 3 * s, Max: 3 * s}},
		},
		{
			name:     "window: older waits drop out, the count stays",
			recs:     []rec{{2, 100 * s, 0}, {2, 4 * s, WaitWindow}, {2, 6 * s, WaitWindow + s}},
			now:      WaitWindow + 2*s,
			admitted: [MaxTier + 1]int64{0, 0, 3, 0},
			want:     [MaxTier + 1]WaitStats{{}, {}, {Count: 2, Mean: 5 * s, P50: 4 * s, P90: 6 * s, P99: 6 * s, Max: 6 * s}},
		},
		{
			name:     "everything old",
			recs:     []rec{{1, 7 * s, 0}},
			now:      WaitWindow,
			admitted: [MaxTier + 1]int64{0, 1, 0, 0},
		},
		{
			name:     "ring: the latest WaitLogSize",
			recs:     many(1, WaitLogSize+100, 0), // waits 1..612 s: the ring keeps 101..612
			now:      time.Second,
			admitted: [MaxTier + 1]int64{0, WaitLogSize + 100, 0, 0},
			want: [MaxTier + 1]WaitStats{{}, {Count: WaitLogSize, Mean: (101 + WaitLogSize + 100) * s / 2,
				P50: (100 + WaitLogSize/2) * s, P90: (100 + 461) * s, P99: (100 + 507) * s, Max: (WaitLogSize + 100) * s}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l waitLog
			for _, r := range tt.recs {
				l.recordLocked(r.tier, r.wait, t0.Add(r.at))
			}
			if l.admitted != tt.admitted {
				t.Errorf("admitted: got %v, want %v", l.admitted, tt.admitted)
			}
			for tier := range MaxTier + 1 {
				if got := l.summaryLocked(tier, t0.Add(tt.now)); got != tt.want[tier] {
					t.Errorf("tier %d: got %+v, want %+v", tier, got, tt.want[tier])
				}
			}
		})
	}
}

// TestWaitLogRecordAllocs: recording an admission allocates nothing once
// the tier's ring exists.
func TestWaitLogRecordAllocs(t *testing.T) {
	var l waitLog
	now := time.Now()
	l.recordLocked(0, time.Second, now)
	if n := testing.AllocsPerRun(1000, func() { l.recordLocked(0, time.Second, now) }); n != 0 {
		t.Errorf("recordLocked: %v allocations, want 0", n)
	}
}
