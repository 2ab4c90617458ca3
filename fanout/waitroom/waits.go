package waitroom

import "time"

// WaitLogSize is how many of the latest waits a room keeps per tier for
// the wait distribution of its status (RoomStatus.WaitByTier): at most
// this many samples per tier within WaitWindow.
const WaitLogSize = 512

// WaitWindow is how far back the wait distribution of a room's status
// looks, on this node's clock: the admission-rate window.
const WaitWindow = RateWindow * time.Second

// waitLog is one room's admissions made by this node: a count per tier
// since the Room was created here, and the latest WaitLogSize waits per
// tier with when they were recorded. Its memory is fixed once a tier's
// ring exists (allocated at that tier's first admission); recording
// allocates nothing. Guarded by Room.mu.
type waitLog struct {
	admitted [MaxTier + 1]int64
	rings    [MaxTier + 1]*waitRing
}

// waitRing holds the latest waits of one tier; n counts every wait ever
// recorded, so the newest is at (n-1) % WaitLogSize.
type waitRing struct {
	at   [WaitLogSize]int64 // local Unix ns of the recording
	wait [WaitLogSize]time.Duration
	n    int64
}

// recordLocked counts one admission of tier with its wait, seen at now.
// Room.mu must be held.
func (l *waitLog) recordLocked(tier int, wait time.Duration, now time.Time) {
	tier = clampTier(tier)
	l.admitted[tier]++
	rg := l.rings[tier]
	if rg == nil {
		rg = new(waitRing)
		l.rings[tier] = rg
	}
	i := rg.n % WaitLogSize
	rg.at[i], rg.wait[i] = now.UnixNano(), max(wait, 0)
	rg.n++
}

// summaryLocked is the distribution of tier's waits recorded within
// WaitWindow before now (Mean, P50, P90, P99 by nearest rank, Max; zero
// with Count 0 when there are none). Room.mu must be held.
func (l *waitLog) summaryLocked(tier int, now time.Time) WaitStats {
	rg := l.rings[tier]
	if rg == nil {
		return WaitStats{}
	}
	from := now.Add(-WaitWindow).UnixNano()
	var buf [WaitLogSize]time.Duration
	ws := buf[:0]
	for i := range min(rg.n, WaitLogSize) {
		if rg.at[i] > from {
			ws = append(ws, rg.wait[i])
		}
	}
	return summarize(ws)
}
