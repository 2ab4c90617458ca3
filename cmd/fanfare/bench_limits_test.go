package main

import (
	"context"
	"strings"
	"testing"

	"github.com/fanfare-im/fanfare/limiter"
)

// defaultTuning is the engine's default tuning as GET /admin/v1/tuning
// answers it (the fields bench reads).
var defaultTuning = benchTuning{LargeGroup: 5000, GroupRate: 20, DownlinkRate: 10, DownlinkFraction: 0.8,
	HotFactor: 10, HotMinRate: 20, HotBaselineFloor: 1, HotGroupRate: 10}

func TestThrottleWarnings(t *testing.T) {
	def := limiter.Default()
	off := limiter.Default()
	for _, name := range senderRules {
		r := off.Rules[name]
		r.Limit = 0
		off.Rules[name] = r
	}
	noGroupLimits := benchTuning{LargeGroup: 5000, GroupRate: -1, DownlinkRate: -1, HotFactor: -1}
	flags := func(members, senders int, rate float64, limits string) *broadcastFlags {
		return &broadcastFlags{members: members, senders: senders, rate: rate, limits: limits}
	}
	for _, tc := range []struct {
		name string
		f    *broadcastFlags
		lim  *limiter.Limits
		tn   *benchTuning
		want []string // one substring per warning, in order
	}{
		{"defaults, within every limit", flags(100, 1, 4, "keep"), &def, &defaultTuning, []string{"default rate limits"}},
		{"defaults, the bench's own defaults", flags(1000, 1, 100, "keep"), &def, &defaultTuning,
			[]string{"default rate limits", "user_group limit (5 per 1s)", "user_all limit (20 per 1s)", "frame_send limit (50 per 1s)"}},
		{"senders share the rate", flags(1000, 25, 100, "keep"), &def, &defaultTuning, []string{"default rate limits"}},
		{"-senders needed", flags(1000, 2, 100, "keep"), &def, &defaultTuning,
			[]string{"default rate limits", "-senders 20 or more", "-senders 5 or more"}},
		{"-limits off skips the limits", flags(1000, 1, 100, "off"), &def, &defaultTuning, nil},
		{"limits off on the server", flags(1000, 1, 100, "keep"), &off, &defaultTuning, nil},
		{"large group, default tuning", flags(6000, 1, 100, "off"), &def, &defaultTuning,
			[]string{"group_rate 20", "downlink_rate 10", "hot_group_rate 10"}},
		{"large group within the tuning", flags(6000, 1, 7, "off"), &def, &defaultTuning, nil},
		{"large group, engine limits off", flags(6000, 1, 100, "off"), &def, &noGroupLimits, nil},
		{"every group large", flags(10, 1, 100, "off"), nil, &benchTuning{LargeGroup: 1, GroupRate: 20}, []string{"group_rate 20"}},
		{"server without limits or tuning", flags(6000, 1, 1000, "keep"), nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := throttleWarnings(tc.f, tc.lim, tc.tn)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d warnings, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d: got %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestBenchReadsServerThrottle: against a real fanfared (default limits
// and tuning), what bench reads gives the warnings of the defaults.
func TestBenchReadsServerThrottle(t *testing.T) {
	srv := startFanfared(t)
	adm := &adminClient{base: srv.http, token: srv.admin}
	lim, tn, err := adm.serverThrottle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if lim == nil || !isDefaultLimits(*lim) {
		t.Fatalf("got limits %+v, want the defaults", lim)
	}
	if tn == nil || *tn != defaultTuning {
		t.Fatalf("got tuning %+v, want %+v", tn, defaultTuning)
	}
	f := &broadcastFlags{members: 6000, senders: 1, rate: 100, limits: "keep"}
	if got := throttleWarnings(f, lim, tn); len(got) != 7 {
		t.Errorf("got %d warnings, want 7 (defaults, 3 sender rules, group rate, downlink, hot):\n%s", len(got), strings.Join(got, "\n"))
	}
}
