package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
)

// benchTuning is the part of the server's engine tuning (GET
// /admin/v1/tuning, defaults filled in) that can hold a benchmark's
// group back. The limits document does not cover it, so -limits off
// leaves it in force; fanfared's flags of the same names turn it off.
type benchTuning struct {
	LargeGroup       int     `json:"large_group_members"`
	GroupRate        float64 `json:"group_rate"`
	DownlinkRate     float64 `json:"downlink_rate"`
	DownlinkFraction float64 `json:"downlink_fraction"`
	HotFactor        float64 `json:"hot_factor"`
	HotMinRate       float64 `json:"hot_min_rate"`
	HotBaselineFloor float64 `json:"hot_baseline_floor"`
	HotGroupRate     float64 `json:"hot_group_rate"`
}

// senderRules are the limits rules the server checks on each of a
// benchmark's senders (one user, one connection, one group each): the
// send rules and the frame rules of the chat socket.
var senderRules = []string{limiter.UserGroup, limiter.UserAll, limiter.FrameSend, limiter.FrameUser}

// serverThrottle reads the server's limits and tuning. A 404 (a server
// without runtime limits or without the tuning route) leaves that part nil.
func (a *adminClient) serverThrottle(ctx context.Context) (*limiter.Limits, *benchTuning, error) {
	var lim limiter.Limits
	if err := a.do(ctx, http.MethodGet, "/admin/v1/limits", nil, &lim); err != nil {
		if !isNotFound(err) {
			return nil, nil, fmt.Errorf("reading the server's limits: %w", err)
		}
	} else {
		lim = lim.Normalize()
	}
	var tn benchTuning
	var tp *benchTuning
	if err := a.do(ctx, http.MethodGet, "/admin/v1/tuning", nil, &tn); err != nil {
		if !isNotFound(err) {
			return nil, nil, fmt.Errorf("reading the server's tuning: %w", err)
		}
	} else {
		tp = &tn
	}
	var lp *limiter.Limits
	if lim.Rules != nil {
		lp = &lim
	}
	return lp, tp, nil
}

func isNotFound(err error) bool {
	var se *statusError
	return errors.As(err, &se) && se.status == http.StatusNotFound
}

// perSecond is a rule's average rate in units per second (0 = off).
func perSecond(r limiter.Rule) float64 {
	w := time.Duration(r.Window)
	if r.Limit <= 0 || w <= 0 {
		return 0
	}
	return float64(r.Limit) / w.Seconds()
}

// throttleWarnings says, one sentence each, what in the server's limits
// (lim, nil = none) and tuning (tn, nil = unknown) would hold back the run
// f asks for: a run past a limit measures the limit, not the fan-out.
func throttleWarnings(f *broadcastFlags, lim *limiter.Limits, tn *benchTuning) []string {
	var out []string
	perSender := f.rate / float64(f.senders)
	if lim != nil && f.limits == "keep" {
		if isDefaultLimits(*lim) {
			out = append(out, "the server runs its default rate limits (made for people, not load generators) and -limits is keep: pass -limits off to measure the fan-out")
		}
		for _, name := range senderRules {
			r, ok := lim.Rules[name]
			ps := perSecond(r)
			if !ok || ps <= 0 || perSender <= ps {
				continue
			}
			out = append(out, fmt.Sprintf("each sender sends %.4g msg/s, above the server's %s limit (%d per %v): sends past it are refused (rate_limited); pass -limits off, or -senders %d or more",
				perSender, name, r.Limit, time.Duration(r.Window), int(math.Ceil(f.rate/ps))))
		}
	}
	if tn == nil {
		return out
	}
	members := f.members + f.senders
	if tn.LargeGroup > 1 && members < tn.LargeGroup {
		return out // group limits and triggers start at large_group_members
	}
	large := fmt.Sprintf("the group has %d members (large from %d)", members, tn.LargeGroup)
	if tn.GroupRate > 0 && f.rate > tn.GroupRate {
		out = append(out, fmt.Sprintf("%s: sends above its group_rate %.4g msg/s are held back and dropped (fanfared -group-rate -1 turns it off)", large, tn.GroupRate))
	}
	if tn.DownlinkRate > 0 && f.rate > tn.DownlinkFraction*tn.DownlinkRate {
		out = append(out, fmt.Sprintf("%s: above %.4g msg/s (downlink_fraction %.3g of downlink_rate %.4g) it goes to L1 and its pushes are merged, so latency includes the merge window (fanfared -downlink-rate -1)",
			large, tn.DownlinkFraction*tn.DownlinkRate, tn.DownlinkFraction, tn.DownlinkRate))
	}
	if hot := max(tn.HotMinRate, tn.HotFactor*tn.HotBaselineFloor); tn.HotFactor > 0 && f.rate > hot {
		out = append(out, fmt.Sprintf("%s: above %.4g msg/s (hot_min_rate, hot_factor x baseline) it may turn hot, and hot groups are held to hot_group_rate %.4g msg/s (fanfared -hot-factor -1)",
			large, hot, tn.HotGroupRate))
	}
	return out
}

// isDefaultLimits reports whether lim is the server's default document.
func isDefaultLimits(lim limiter.Limits) bool {
	a, err1 := json.Marshal(lim.Normalize())
	b, err2 := json.Marshal(limiter.Default())
	return err1 == nil && err2 == nil && bytes.Equal(a, b)
}
