package waitroom_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// scenario draws a random room and arrival sequence: levels, times,
// disconnects within and beyond grace, binding or non-binding MaxActive.
func scenario(seed uint64) waitroom.SimConfig {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	rc := waitroom.RoomConfig{
		Name:        "prop",
		AdmitRate:   []float64{0.5, 1, 2, 5, 12}[rng.IntN(5)],
		MaxWait:     time.Duration(60+rng.IntN(540)) * time.Second,
		Grace:       time.Duration(10+rng.IntN(120)) * time.Second,
		HardTimeout: time.Duration(200+rng.IntN(600)) * time.Second,
		VIPShareCap: []float64{0.1, 0.3, 0.6, 1}[rng.IntN(4)],
		Smoothing:   []time.Duration{-1, 5 * time.Second, 15 * time.Second}[rng.IntN(3)],
		TargetWait:  10 * time.Hour,
		Shards:      1 + rng.IntN(4),
		DecayRate:   []float64{0.5, 1, 3}[rng.IntN(3)],
		// The admission quota never lets a VIP pass a normal user the
		// score ranks ahead, so every property holds with it on or off.
		VIPAdmitShare: []float64{-1, 0.5, 2.0 / 3, 0.9}[rng.IntN(4)],
	}
	rc.AdmitBurst = math.Max(1, rc.AdmitRate*float64(1+rng.IntN(3)))
	binding := rng.IntN(2) == 0
	rc.MaxActive = 1_000_000
	var service time.Duration
	if binding {
		rc.MaxActive = 1 + rng.IntN(20)
		service = time.Duration(1+rng.IntN(30)) * time.Second
	}
	n := 300 + rng.IntN(1200)
	spread := time.Duration(float64(n)/rc.AdmitRate*(0.5+rng.Float64())) * time.Second
	arr := make([]waitroom.SimArrival, n)
	for i := range arr {
		lvl := 0
		switch x := rng.Float64(); {
		case x < 0.1:
			lvl = 1
		case x < 0.17:
			lvl = 2
		case x < 0.22:
			lvl = 3
		}
		at := time.Duration(rng.Int64N(int64(spread) + 1))
		if rng.IntN(10) == 0 { // bursts
			at = spread / 2
		}
		a := waitroom.SimArrival{UID: fmt.Sprintf("u%05d", i), Tier: lvl, At: at}
		if rng.IntN(8) == 0 {
			a.AwayAt = at + time.Duration(rng.IntN(600))*time.Second
			if rng.IntN(3) > 0 {
				a.BackAt = a.AwayAt + time.Duration(rng.IntN(int(rc.HardTimeout/time.Second)+60))*time.Second
			}
		}
		arr[i] = a
	}
	return waitroom.SimConfig{Room: rc, Arrivals: arr, ServiceTime: service, Step: 100 * time.Millisecond}
}

// TestPropertyFairness checks, over random arrival sequences on a virtual
// clock:
//   - nobody is admitted twice, MaxActive is never exceeded, and the token
//     bucket holds (at most burst + rate*T admissions in any T);
//   - once a connected user's wait reaches MaxWait, only users who joined
//     no later than it are admitted before it, and its wait exceeds MaxWait
//     by at most the time to admit those (when MaxActive does not bind);
//   - a VIP never passes a connected normal user who joined more than
//     VIPBias/1.3 seconds before it.
func TestPropertyFairness(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			sc := scenario(seed)
			res, err := waitroom.Simulate(t.Context(), sc)
			if err != nil {
				t.Fatal(err)
			}
			checkFairness(t, sc, res)
		})
	}
}

func checkFairness(t *testing.T, sc waitroom.SimConfig, res *waitroom.SimResult) {
	t.Helper()
	rc := sc.Room.WithDefaults()
	if len(res.Admissions) == 0 {
		t.Fatalf("no admissions")
	}
	seen := make(map[string]bool)
	for _, a := range res.Admissions {
		if seen[a.UID] {
			t.Fatalf("%s admitted twice", a.UID)
		}
		seen[a.UID] = true
	}
	if res.MaxActiveSeen > rc.MaxActive {
		t.Fatalf("active sessions: got %d, want <= max_active %d", res.MaxActiveSeen, rc.MaxActive)
	}
	// Token bucket over windows of 1..30 s.
	for _, w := range []time.Duration{time.Second, 5 * time.Second, 30 * time.Second} {
		j := 0
		for i, a := range res.Admissions {
			for res.Admissions[j].At.Before(a.At.Add(-w)) {
				j++
			}
			bound := rc.AdmitBurst + rc.AdmitRate*w.Seconds() + 1e-9
			if float64(i-j+1) > bound {
				t.Fatalf("%d admissions within %v before %v, want <= burst+rate*T = %.1f", i-j+1, w, a.At, bound)
			}
		}
	}
	bindingActive := rc.MaxActive < 1000
	maxWait := rc.MaxWait
	for _, u := range res.Admissions {
		if u.Away {
			continue
		}
		t0 := u.Join.Add(maxWait)
		if !u.At.After(t0) {
			continue
		}
		// Everyone admitted after u became overdue and before u is older.
		n := 0
		for _, o := range res.Admissions[:u.Seq] {
			if o.At.After(t0) || (o.At.Equal(t0) && o.Overdue) {
				if o.Join.After(u.Join) {
					t.Fatalf("%s (join %v, overdue since %v) passed by %s (join %v) at %v",
						u.UID, u.Join, t0, o.UID, o.Join, o.At)
				}
				n++
			}
		}
		if !bindingActive {
			// Admissions run at the bucket rate; one step of slack for the tick
			// and one second for the whole-second clock.
			limit := maxWait + time.Duration(float64(n+1)/rc.AdmitRate*float64(time.Second)) + sc.Step + time.Second
			if w := u.At.Sub(u.Join); w > limit {
				t.Fatalf("%s waited %v, want <= max_wait %v + time to admit the %d overdue ahead (%v)", u.UID, w, maxWait, n, limit)
			}
		}
	}
	// VIPs never pass normal users who joined more than bias/1.3 earlier.
	type nj struct {
		join time.Time
		seq  int
	}
	var normals []nj
	for _, a := range res.Admissions {
		if a.Tier == 0 && !a.Away {
			normals = append(normals, nj{a.Join, a.Seq})
		}
	}
	sort.Slice(normals, func(i, j int) bool { return normals[i].join.Before(normals[j].join) })
	prefMax := make([]int, len(normals))
	for i, x := range normals {
		prefMax[i] = x.seq
		if i > 0 {
			prefMax[i] = max(prefMax[i], prefMax[i-1])
		}
	}
	for _, v := range res.Admissions {
		if v.Tier == 0 {
			continue
		}
		head := time.Duration(float64(rc.VIPBias[v.Tier]) / waitroom.ScoreFactor)
		limit := v.Join.Add(-head)
		k := sort.Search(len(normals), func(i int) bool { return !normals[i].join.Before(limit) })
		if k > 0 && prefMax[k-1] > v.Seq {
			t.Fatalf("VIP%d %s (join %v) admitted before a normal user who joined before %v (> %v earlier)",
				v.Tier, v.UID, v.Join, limit, head)
		}
	}
	// Everyone who stayed is eventually admitted.
	for _, a := range sc.Arrivals {
		if a.AwayAt == 0 && !seen[a.UID] && res.Rejected[a.UID] == "" {
			t.Fatalf("%s never admitted", a.UID)
		}
	}
}

// TestVIPSurge is the surge scenario of the benchmark, small enough for a
// test: the max-wait guarantee holds for every normal user.
func TestVIPSurge(t *testing.T) {
	res, err := waitroom.VIPSurge(t.Context(), waitroom.SurgeConfig{Normal: 4000, VIPs: 600, NormalSpread: 40 * time.Second,
		Room: waitroom.RoomConfig{AdmitRate: 3, MaxWait: 10 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res.Admissions); got != 4600 {
		t.Fatalf("admitted: got %d, want 4600", got)
	}
	// 4600 users at 3/s need ~25 min: normals hit max_wait and are then
	// admitted oldest first; nobody waits beyond max_wait plus the backlog
	// of overdue users ahead (bounded here by a few minutes).
	if res.Overdue == 0 {
		t.Fatalf("no overdue admissions: scenario does not exercise max_wait")
	}
	if res.PerTier[3].P50 >= res.PerTier[0].P50 {
		t.Fatalf("VIP3 median wait %v not below normal %v", res.PerTier[3].P50, res.PerTier[0].P50)
	}
	sc := waitroom.SimConfig{Room: waitroom.RoomConfig{Name: "surge", AdmitRate: 3, MaxWait: 10 * time.Minute,
		MaxActive: 100000, TargetWait: time.Hour}, Step: 100 * time.Millisecond}
	checkFairness(t, sc, res)
}

// TestVIPSurgeQuota: during a VIP surge the admission quota holds the VIPs
// to their share while normal users wait, in the same scenario that
// without it gives the VIPs every admission until none is left; every
// fairness property still holds.
func TestVIPSurgeQuota(t *testing.T) {
	run := func(share float64) *waitroom.SimResult {
		res, err := waitroom.VIPSurge(t.Context(), waitroom.SurgeConfig{Normal: 4000, VIPs: 600, NormalSpread: 40 * time.Second,
			Room: waitroom.RoomConfig{AdmitRate: 3, MaxWait: 10 * time.Minute, VIPAdmitShare: share}})
		if err != nil {
			t.Fatal(err)
		}
		sc := waitroom.SimConfig{Room: waitroom.RoomConfig{Name: "surge", AdmitRate: 3, MaxWait: 10 * time.Minute,
			MaxActive: 100000, TargetWait: time.Hour, VIPAdmitShare: share}, Step: 100 * time.Millisecond}
		checkFairness(t, sc, res)
		return res
	}
	vipShare := func(res *waitroom.SimResult) float64 {
		vip, all := res.VIPPart()
		return float64(vip) / float64(all)
	}
	off, on := run(-1), run(2.0/3)
	if got := vipShare(off); got < 0.95 {
		t.Fatalf("quota off: VIP share of the surge's admissions %.2f, want ~1", got)
	}
	if got := vipShare(on); got < 0.62 || got > 0.71 {
		t.Fatalf("quota 2/3: VIP share of the surge's admissions %.3f, want 2/3", got)
	}
	if on.PerTier[3].P50 >= on.PerTier[0].P50 {
		t.Fatalf("quota 2/3: VIP3 median wait %v not below normal %v", on.PerTier[3].P50, on.PerTier[0].P50)
	}
	t.Logf("VIP3 p50 wait %v -> %v, normal p50 %v -> %v", off.PerTier[3].P50, on.PerTier[3].P50, off.PerTier[0].P50, on.PerTier[0].P50)
}

// TestQuotaAheadMatchesAdmission: QuotaAhead agrees with the admission
// rule (a VIP is admitted while v+0.01 < s*(v+n+1), counts from zero) for
// every position of queues of every mix, over shares from 0.01 to 0.99
// and beyond (no overflow at extreme shares).
func TestQuotaAheadMatchesAdmission(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	shares := []float64{1e-16, 0.01, 0.1, 1.0 / 3, 0.5, 0.55, 0.6, 2.0 / 3, 0.7, 0.75, 0.9, 0.99, 0.9999999999999999}
	for range 200 {
		shares = append(shares, 0.01+0.98*rng.Float64())
	}
	for _, s := range shares {
		nv, nn := int64(rng.IntN(60)), int64(rng.IntN(60))
		// All VIPs rank ahead of all normal users (the surge case).
		var order []bool // true = VIP
		v, n := 0.0, 0.0
		for lv, ln := nv, nn; lv+ln > 0; {
			vip := ln == 0 || lv > 0 && v+0.01 < s*(v+n+1)
			if vip {
				lv--
				v++
			} else {
				ln--
				n++
			}
			order = append(order, vip)
		}
		var vi, ni int64
		for pos, vip := range order {
			var got int64
			if vip {
				got = waitroom.QuotaAhead(true, vi, 0, nn, s)
				vi++
			} else {
				got = waitroom.QuotaAhead(false, nv, ni, nn, s)
				ni++
			}
			if got != int64(pos) {
				t.Fatalf("share %v, %d VIPs, %d normal: QuotaAhead(vip=%v) = %d, admitted at %d", s, nv, nn, vip, got, pos)
			}
		}
	}
}
