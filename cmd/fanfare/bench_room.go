package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/limiter"
)

// benchRoom runs the VIP surge scenario on the in-process waiting room with
// a virtual clock (deterministic, seconds of CPU for hours of queue): normal
// users arrive evenly, then VIPs arrive at once; it reports the wait
// distribution per level and the longest normal wait against max_wait.
// simulationNote says, in bench room's output, what its numbers are.
const simulationNote = "a simulation: the waiting room in this process on a virtual clock, no server contacted"

func benchRoom(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench room", "[-normal N] [-vips N] [-spread D] [-admit-rate R] [-max-wait D] [-json]", `
A simulation, not a load test: it runs the waiting room's admission
algorithm (the code fanfared runs) in this process on a virtual clock, so
hours of queue take seconds of CPU and no server is contacted. -normal users
arrive evenly over -spread, then -vips VIPs arrive at once; it reports the
wait per level, the longest wait per level against -max-wait, the
max-wait violations (always 0: the room refuses room_full whoever it could
not admit within max_wait) and the refusals.`)
	normal := fs.Int("normal", 20000, "normal users queued before the surge")
	vips := fs.Int("vips", 3000, "VIPs arriving at once (levels 1/2/3 in 50/30/20%)")
	spread := fs.Duration("spread", 200*time.Second, "time over which the normal users arrive")
	rate := fs.Float64("admit-rate", 15, "admissions per second")
	maxWait := fs.Duration("max-wait", 20*time.Minute, "max-wait guarantee")
	smoothing := fs.Duration("smoothing", 0, "VIP smooth insertion time (0 = default 15s, negative = immediate)")
	shareCap := fs.Float64("vip-share-cap", 0, "VIP share cap (0 = default 0.3)")
	defShare := limiter.DefaultRules()[limiter.RoomAdmit]
	admitShare := fs.Float64("vip-admit-share", defShare.VIPShare(), "most of the admissions VIPs get while normal users wait (default: the server's, from limits rule room_admit; 0 or negative = off)")
	jsonOut := fs.Bool("json", false, "print the result as JSON")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	start := time.Now()
	room := waitroom.RoomConfig{AdmitRate: *rate, MaxWait: *maxWait, Smoothing: *smoothing, VIPShareCap: *shareCap,
		VIPAdmitShare: *admitShare}
	res, err := waitroom.VIPSurge(ctx, waitroom.SurgeConfig{Room: room, Normal: *normal, VIPs: *vips, NormalSpread: *spread})
	if err != nil {
		return err
	}
	room = room.WithDefaults()
	capacity, reserve := waitroom.Capacity(&room), waitroom.VIPReserve(&room)
	const step = 100 * time.Millisecond // VIPSurge's admission step
	if *jsonOut {
		return json.NewEncoder(e.stdout).Encode(struct {
			Simulation     string
			PerLevel       [waitroom.MaxTier + 1]waitroom.WaitStats
			MaxNormalWait  time.Duration
			MaxWait        time.Duration
			MaxWaitByLevel [waitroom.MaxTier + 1]time.Duration
			Violations     int
			RejectedFull   int
			Capacity       int64
			Overdue        int
			Admissions     int
			Virtual        time.Duration
		}{simulationNote, res.PerTier, res.MaxNormalWait, *maxWait, res.MaxPromiseWait, res.Violations, res.RejectedFull,
			capacity, res.Overdue, len(res.Admissions), res.Duration})
	}
	fmt.Fprintf(e.stdout, "fanfare bench room (%s)\n", simulationNote)
	fmt.Fprintf(e.stdout, "  %d normal users over %v, then %d VIPs at once; admit %.1f/s, max_wait %v, vip_admit_share %.3g\n",
		*normal, *spread, *vips, *rate, *maxWait, *admitShare)
	fmt.Fprintf(e.stdout, "  %-7s %7s %10s %10s %10s %10s %10s\n", "level", "users", "mean", "p50", "p90", "p99", "max")
	for lvl, w := range res.PerTier {
		if w.Count == 0 {
			continue
		}
		fmt.Fprintf(e.stdout, "  %-7d %7d %10v %10v %10v %10v %10v\n", lvl, w.Count,
			w.Mean.Round(time.Second), w.P50.Round(time.Second), w.P90.Round(time.Second), w.P99.Round(time.Second), w.Max.Round(time.Second))
	}
	if vip, all := res.VIPPart(); all > 0 {
		fmt.Fprintf(e.stdout, "  from the first VIP admission to the last: %d admissions by rank, %.1f%% VIP, %.1f%% normal\n",
			all, 100*float64(vip)/float64(all), 100*float64(all-vip)/float64(all))
	}
	fmt.Fprintf(e.stdout, "  max-wait guarantee: capacity %d admissions within max_wait, %d kept for VIPs; %d refused room_full (longest retry hint %v)\n",
		capacity, reserve, res.RejectedFull, res.MaxRetry)
	for lvl, w := range res.MaxPromiseWait {
		if res.PerTier[lvl].Count == 0 && w == 0 {
			continue
		}
		verdict := "within"
		if w > *maxWait+step {
			verdict = "BEYOND"
		}
		fmt.Fprintf(e.stdout, "  level %d longest wait %v (%s max_wait %v + one %v admission step)\n", lvl, w.Round(100*time.Millisecond), verdict, *maxWait, step)
	}
	fmt.Fprintf(e.stdout, "  max-wait violations: %d (backend counted %d); overdue admissions %d\n", res.Violations, res.BackendLate, res.Overdue)
	fmt.Fprintf(e.stdout, "  %d admissions over %v of virtual time, simulated in %v\n",
		len(res.Admissions), res.Duration.Round(time.Second), time.Since(start).Round(time.Millisecond))
	return nil
}
