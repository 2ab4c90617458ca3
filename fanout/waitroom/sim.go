package waitroom

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// SimArrival is one user arriving in a simulation.
type SimArrival struct {
	UID  string
	Tier int
	At   time.Duration // since the start
	// AwayAt, when non-zero, disconnects the user at that offset (waiting
	// or admitted); BackAt, when non-zero, reconnects it. A user away past
	// the hard timeout is dropped and does not come back.
	AwayAt, BackAt time.Duration
}

// SimConfig describes a simulation on the in-process backend with a
// virtual clock: no goroutines, no sleeping, deterministic.
type SimConfig struct {
	Room     RoomConfig
	Arrivals []SimArrival
	// ServiceTime is how long an admitted user stays before leaving
	// (0 = until the session expires).
	ServiceTime time.Duration
	// Step is the admission tick. 0 means 100 ms.
	Step time.Duration
	// Horizon stops the simulation (0 = when nobody is left, at most 48 h).
	Horizon time.Duration
	// Start is the virtual start time (zero = 2025-01-01 UTC).
	Start time.Time
	// Nodes is how many nodes share the backend (0 = 1): arrival i holds
	// its socket on node i mod Nodes, and every node runs its own
	// admission step and maintenance each Step, as fanfared nodes sharing
	// Redis do.
	Nodes int
}

// VIPPart counts the admissions made by rank (not overdue) from the first
// VIP admission to the last: all of them and the VIPs'. Under the
// admission quota vip/all is about the room's VIPAdmitShare while normal
// users wait.
func (r *SimResult) VIPPart() (vip, all int) {
	first, last := -1, -1
	for i, a := range r.Admissions {
		if a.Tier > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return 0, 0
	}
	for _, a := range r.Admissions[first : last+1] {
		if !a.Overdue {
			all++
			if a.Tier > 0 {
				vip++
			}
		}
	}
	return vip, all
}

// SimAdmission is one admission in a simulation.
type SimAdmission struct {
	UID     string
	Tier    int
	First   time.Time // first join
	Join    time.Time // effective join (after decay)
	At      time.Time // admission, virtual time at sub-second precision
	Back    time.Time // last return from away before it (zero = none)
	Overdue bool
	Late    bool // the backend counted it as a max-wait violation
	Seq     int  // admission order
	Away    bool
}

// PromiseWait is the wait the max-wait promise bounds: from max(Join,
// Back) to the admission.
func (a *SimAdmission) PromiseWait() time.Duration {
	from := a.Join
	if a.Back.After(from) {
		from = a.Back
	}
	return a.At.Sub(from)
}

// WaitStats summarizes waits: in a simulation's SimResult admission -
// first join, in RoomStatus.WaitByTier the wait the max-wait promise
// bounds. Quantiles are by nearest rank; all zero when Count is 0.
type WaitStats struct {
	Count                    int
	Mean, P50, P90, P99, Max time.Duration
}

// SimResult is what a simulation observed.
type SimResult struct {
	Admissions []SimAdmission
	Rejected   map[string]RejectReason
	Dropped    []string
	// PerTier summarizes the waits of users never disconnected.
	PerTier [MaxTier + 1]WaitStats
	// MaxNormalWait is the longest wait of a never-disconnected normal user.
	MaxNormalWait time.Duration
	// MaxActiveSeen is the most sessions seen active at once.
	MaxActiveSeen int
	// Overdue is the number of admissions made by the max-wait rule.
	Overdue int
	// MaxPromiseWait is the longest PromiseWait per tier, every admitted
	// user included (returners too); Violations counts the admissions
	// whose PromiseWait exceeded MaxWait + Step (the guarantee's bound),
	// BackendLate those the backend itself counted as violations.
	MaxPromiseWait [MaxTier + 1]time.Duration
	Violations     int
	BackendLate    int
	// RejectedFull counts room_full refusals; MaxRetry is the longest
	// retry hint among them.
	RejectedFull int
	MaxRetry     time.Duration
	Duration     time.Duration
	Start        time.Time
}

// Simulate runs cfg and reports every admission. It checks nothing;
// callers (tests, `fanfare bench room`) judge the result.
func Simulate(ctx context.Context, cfg SimConfig) (*SimResult, error) {
	rc := cfg.Room.WithDefaults()
	if err := rc.Validate(); err != nil {
		return nil, err
	}
	if cfg.Step <= 0 {
		cfg.Step = 100 * time.Millisecond
	}
	nodes := max(cfg.Nodes, 1)
	nodeOf := make(map[string]string, len(cfg.Arrivals))
	for i, a := range cfg.Arrivals {
		nodeOf[a.UID] = fmt.Sprintf("sim-%d", i%nodes)
	}
	horizon := cfg.Horizon
	if horizon <= 0 {
		horizon = 48 * time.Hour
	}
	start := cfg.Start
	if start.IsZero() {
		start = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	now := start
	mem := NewMemory(MemoryConfig{Clock: func() time.Time { return now }})

	type ev struct {
		at   time.Duration
		kind int // 0 arrive, 1 away, 2 back
		i    int
	}
	var evs []ev
	for i, a := range cfg.Arrivals {
		evs = append(evs, ev{a.At, 0, i})
		if a.AwayAt > 0 {
			evs = append(evs, ev{a.AwayAt, 1, i})
		}
		if a.BackAt > 0 {
			evs = append(evs, ev{a.BackAt, 2, i})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })

	res := &SimResult{Rejected: make(map[string]RejectReason), Start: start}
	away := make(map[string]bool)
	type session struct {
		uid string
		end time.Time
	}
	var sessions []session // admitted, to leave after ServiceTime
	active := 0
	pending := 0 // arrivals not yet admitted or gone
	gone := make(map[string]bool)
	next := 0
	nextMaintain := now
	for t := time.Duration(0); t <= horizon; t += cfg.Step {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		now = start.Add(t)
		for ; next < len(evs) && evs[next].at <= t; next++ {
			e := evs[next]
			a := cfg.Arrivals[e.i]
			switch e.kind {
			case 0, 2:
				if e.kind == 0 {
					pending++
				}
				if gone[a.UID] {
					continue
				}
				r, err := mem.Enter(ctx, &rc, EnterRequest{UID: a.UID, Tier: a.Tier, Node: nodeOf[a.UID]})
				if err != nil {
					return nil, err
				}
				if r.Status == EnterRejected {
					res.Rejected[a.UID] = r.Reject
					if r.Reject == RejectRoomFull {
						res.RejectedFull++
						res.MaxRetry = max(res.MaxRetry, r.RetryAfter)
					}
					gone[a.UID] = true
					pending--
				}
			case 1:
				if gone[a.UID] {
					continue
				}
				away[a.UID] = true
				d, err := mem.Disconnect(ctx, &rc, a.UID, nodeOf[a.UID])
				if err != nil {
					return nil, err
				}
				if d.Ended != nil {
					active--
				}
			}
		}
		if !now.Before(nextMaintain) {
			nextMaintain = nextMaintain.Add(time.Second)
			for n := range nodes {
				m, err := mem.Maintain(ctx, &rc, MaintainRequest{Node: fmt.Sprintf("sim-%d", n), NodeTimeout: time.Minute})
				if err != nil {
					return nil, err
				}
				active -= len(m.Ended)
				for _, u := range m.Dropped {
					if !gone[u] {
						gone[u] = true
						pending--
						res.Dropped = append(res.Dropped, u)
					}
				}
			}
		}
		if cfg.ServiceTime > 0 {
			kept := sessions[:0]
			for _, s := range sessions {
				if !now.Before(s.end) {
					d, err := mem.Leave(ctx, &rc, s.uid)
					if err != nil {
						return nil, err
					}
					if d.Ended != nil {
						active--
					}
					continue
				}
				kept = append(kept, s)
			}
			sessions = kept
		}
		var admitted []Admission
		for range nodes { // every node's step; the backend is atomic, as Redis is
			ar, err := mem.Admit(ctx, &rc, AdmitRequest{})
			if err != nil {
				return nil, err
			}
			admitted = append(admitted, ar.Admitted...)
		}
		for _, a := range admitted {
			sa := SimAdmission{UID: a.UID, Tier: a.Tier, First: a.First, Join: a.Join,
				At: now, Back: a.Back, Overdue: a.Overdue, Late: a.Late, Seq: len(res.Admissions), Away: away[a.UID]}
			res.Admissions = append(res.Admissions, sa)
			if w := sa.PromiseWait(); w > rc.MaxWait+cfg.Step {
				res.Violations++
			}
			res.MaxPromiseWait[a.Tier] = max(res.MaxPromiseWait[a.Tier], sa.PromiseWait())
			if a.Late {
				res.BackendLate++
			}
			if a.Overdue {
				res.Overdue++
			}
			if !gone[a.UID] {
				gone[a.UID] = true
				pending--
			}
			active++
			if cfg.ServiceTime > 0 {
				sessions = append(sessions, session{a.UID, now.Add(cfg.ServiceTime)})
			}
		}
		res.MaxActiveSeen = max(res.MaxActiveSeen, active)
		if next == len(evs) && pending <= 0 {
			break
		}
	}
	res.Duration = now.Sub(start)
	var waits [MaxTier + 1][]time.Duration
	for _, a := range res.Admissions {
		if a.Away {
			continue
		}
		w := a.At.Sub(a.First)
		waits[a.Tier] = append(waits[a.Tier], w)
		if a.Tier == 0 {
			res.MaxNormalWait = max(res.MaxNormalWait, w)
		}
	}
	for l := range waits {
		res.PerTier[l] = summarize(waits[l])
	}
	return res, nil
}

func summarize(ws []time.Duration) WaitStats {
	if len(ws) == 0 {
		return WaitStats{}
	}
	slices.Sort(ws)
	var sum time.Duration
	for _, w := range ws {
		sum += w
	}
	q := func(p float64) time.Duration { return ws[min(len(ws)-1, int(math.Ceil(p*float64(len(ws))))-1)] }
	return WaitStats{Count: len(ws), Mean: sum / time.Duration(len(ws)), P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: ws[len(ws)-1]}
}

// SurgeConfig describes the VIP surge benchmark: Normal users arrive
// evenly over NormalSpread, then VIPs users arrive at once at SurgeAt,
// split over levels 1-3 by LevelShare.
type SurgeConfig struct {
	Room         RoomConfig
	Normal       int           // 0 means 20000
	VIPs         int           // 0 means 3000
	NormalSpread time.Duration // 0 means 200 s
	SurgeAt      time.Duration // 0 means NormalSpread
	TierShare    [MaxTier]float64
	ServiceTime  time.Duration
	Step         time.Duration
}

// VIPSurge runs the surge scenario (the `fanfare bench room` simulation).
// A zero Room is admit_rate 15/s, max_active 100000 (so the rate binds),
// max_wait 20 min, target_wait 60 min (so nobody is refused), default
// bias, share cap and smoothing.
func VIPSurge(ctx context.Context, sc SurgeConfig) (*SimResult, error) {
	if sc.Normal == 0 {
		sc.Normal = 20000
	}
	if sc.VIPs == 0 {
		sc.VIPs = 3000
	}
	if sc.NormalSpread == 0 {
		sc.NormalSpread = 200 * time.Second
	}
	if sc.SurgeAt == 0 {
		sc.SurgeAt = sc.NormalSpread
	}
	if sc.TierShare == [MaxTier]float64{} {
		sc.TierShare = [MaxTier]float64{0.5, 0.3, 0.2}
	}
	if sc.Room.Name == "" {
		sc.Room.Name = "surge"
	}
	if sc.Room.AdmitRate == 0 {
		sc.Room.AdmitRate = 15
	}
	if sc.Room.MaxActive == 0 {
		sc.Room.MaxActive = 100000
	}
	if sc.Room.TargetWait == 0 {
		sc.Room.TargetWait = time.Hour
	}
	if sc.Normal < 0 || sc.VIPs < 0 {
		return nil, errors.New("waitroom: negative surge size")
	}
	arr := make([]SimArrival, 0, sc.Normal+sc.VIPs)
	for i := range sc.Normal {
		at := time.Duration(float64(sc.NormalSpread) * float64(i) / float64(max(sc.Normal, 1)))
		arr = append(arr, SimArrival{UID: fmt.Sprintf("n%06d", i), At: at})
	}
	for i := range sc.VIPs {
		level := MaxTier
		f, acc := float64(i)/float64(sc.VIPs), 0.0
		for l := range MaxTier {
			acc += sc.TierShare[l]
			if f < acc {
				level = l + 1
				break
			}
		}
		arr = append(arr, SimArrival{UID: fmt.Sprintf("v%d-%05d", level, i), Tier: level, At: sc.SurgeAt})
	}
	return Simulate(ctx, SimConfig{Room: sc.Room, Arrivals: arr, ServiceTime: sc.ServiceTime, Step: sc.Step})
}

// Table renders the per-level wait distribution (seconds) for reports.
func (r *SimResult) Table(maxWait time.Duration) string {
	var b []byte
	b = fmt.Appendf(b, "%-6s %7s %8s %8s %8s %8s %8s\n", "level", "users", "mean_s", "p50_s", "p90_s", "p99_s", "max_s")
	for l, w := range r.PerTier {
		if w.Count == 0 {
			continue
		}
		b = fmt.Appendf(b, "%-6d %7d %8.0f %8.0f %8.0f %8.0f %8.0f\n", l, w.Count, w.Mean.Seconds(), w.P50.Seconds(),
			w.P90.Seconds(), w.P99.Seconds(), w.Max.Seconds())
	}
	b = fmt.Appendf(b, "max normal wait %.0f s (max_wait %.0f s); overdue admissions %d; rejected %d; virtual duration %.0f s\n",
		r.MaxNormalWait.Seconds(), maxWait.Seconds(), r.Overdue, len(r.Rejected), r.Duration.Seconds())
	return string(b)
}
