package limiter_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
)

func TestDefaults(t *testing.T) {
	d := limiter.Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	cases := []struct {
		name  string
		alg   limiter.Algorithm
		limit int64
		win   time.Duration
		burst int64
	}{
		{limiter.UserGroup, limiter.GCRA, 5, time.Second, 10},
		{limiter.UserAll, limiter.SlidingWindow, 20, time.Second, 0},
		{limiter.Pull, limiter.SlidingWindow, 2000, time.Second, 0},
		{limiter.Connect, limiter.SlidingWindow, 1000, time.Second, 0},
		{limiter.RoomAdmit, limiter.SlidingWindow, 1, time.Minute, 0},
		{limiter.RoomEnter, limiter.GCRA, 1, time.Second, 5},
		{limiter.OnlineList, limiter.GCRA, 2, time.Second, 10},
		{limiter.FrameSend, limiter.GCRA, 50, time.Second, 100},
		{limiter.FramePull, limiter.GCRA, 20, time.Second, 100},
		{limiter.FrameRead, limiter.GCRA, 50, time.Second, 200},
		{limiter.FramePing, limiter.GCRA, 2, time.Second, 10},
		{limiter.FrameOther, limiter.GCRA, 5, time.Second, 20},
		{limiter.FrameUser, limiter.GCRA, 200, time.Second, 1000},
		{limiter.FrameDenied, limiter.GCRA, 10, time.Second, 50},
	}
	for _, c := range cases {
		r, ok := d.Rules[c.name]
		if !ok {
			t.Errorf("%s: missing", c.name)
			continue
		}
		if r.Algorithm != c.alg || r.Limit != c.limit || r.Window.D() != c.win || r.Burst != c.burst {
			t.Errorf("%s: got %s %d/%v burst %d, want %s %d/%v burst %d", c.name, r.Algorithm, r.Limit, r.Window.D(), r.Burst, c.alg, c.limit, c.win, c.burst)
		}
	}
	if len(d.Rules) != len(cases) {
		t.Errorf("got %d default rules, want %d", len(d.Rules), len(cases))
	}
	if w := d.Rules[limiter.Pull].Weighted; w == nil || w.VIP.Weight != 60 || w.Normal.Weight != 30 || w.Low.Weight != 10 || w.UserCap != 10 {
		t.Errorf("pull weights: got %+v, want 60/30/10 cap 10", w)
	}
	ra := d.Rules[limiter.RoomAdmit]
	if got := ra.VIPShare(); got != 2.0/3 {
		t.Errorf("room_admit VIP share: got %v, want 2/3 (60 of 60+30)", got)
	}
	ra.Limit = 0
	if got := ra.VIPShare(); got != 0 {
		t.Errorf("room_admit disabled: VIP share %v, want 0", got)
	}
}

func TestLimitsJSONRoundTrip(t *testing.T) {
	d := limiter.Default()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"window":"1m0s"`) {
		t.Errorf("durations should be strings: %s", b)
	}
	var back limiter.Limits
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(back.Normalize())
	if string(b) != string(b2) {
		t.Errorf("round trip changed the document:\n%s\n%s", b, b2)
	}
	// A partial document: missing rules get defaults, windows read ms too.
	var p limiter.Limits
	if err := json.Unmarshal([]byte(`{"rules":{"mine":{"limit":50,"window":500},"hot":{"algorithm":"gcra","limit":3}}}`), &p); err != nil {
		t.Fatal(err)
	}
	n := p.Normalize()
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	if g := n.Rules["mine"]; g.Limit != 50 || g.Window.D() != 500*time.Millisecond || g.Algorithm != limiter.SlidingWindow {
		t.Errorf("mine: got %+v", g)
	}
	if h := n.Rules["hot"]; h.Burst != 3 || h.Window.D() != time.Second {
		t.Errorf("hot: got %+v, want burst 3 window 1s", h)
	}
	if _, ok := n.Rules[limiter.UserAll]; !ok || n.VIPFromTier != 1 {
		t.Errorf("defaults not filled: %+v", n)
	}
	if err := json.Unmarshal([]byte(`{"rules":{"x":{"window":"soon"}}}`), &p); err == nil {
		t.Error("bad duration accepted")
	}
}

func TestValidate(t *testing.T) {
	rule := func(mut func(r *limiter.Rule)) limiter.Limits {
		r := limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 5, Window: limiter.Duration(time.Second)}
		mut(&r)
		return limiter.Limits{VIPFromTier: 1, Rules: map[string]limiter.Rule{"r": r}}
	}
	cases := []struct {
		name string
		l    limiter.Limits
		want string // substring; "" = valid
	}{
		{"ok", rule(func(r *limiter.Rule) {}), ""},
		{"negative limit", rule(func(r *limiter.Rule) { r.Limit = -1 }), "negative"},
		{"short window", rule(func(r *limiter.Rule) { r.Window = limiter.Duration(time.Microsecond) }), "window"},
		{"long window", rule(func(r *limiter.Rule) { r.Window = limiter.Duration(40 * 24 * time.Hour) }), "window"},
		{"huge log", rule(func(r *limiter.Rule) { r.Limit = limiter.MaxSlidingLimit + 1 }), "use gcra"},
		{"burst on sliding", rule(func(r *limiter.Rule) { r.Burst = 3 }), "burst applies"},
		{"gcra no burst", rule(func(r *limiter.Rule) { r.Algorithm = limiter.GCRA }), "burst 0"},
		{"unknown algorithm", rule(func(r *limiter.Rule) { r.Algorithm = "leaky" }), "unknown algorithm"},
		{"weighted gcra", rule(func(r *limiter.Rule) {
			r.Algorithm, r.Burst = limiter.GCRA, 5
			w := limiter.DefaultWeighted()
			r.Weighted = &w
		}), "weighted quotas need"},
		{"reserve > 100", rule(func(r *limiter.Rule) {
			w := limiter.DefaultWeighted()
			w.VIP.ReservePct = 101
			r.Weighted = &w
		}), "reserve_pct"},
		{"zero weights", rule(func(r *limiter.Rule) { r.Weighted = &limiter.Weighted{} }), "sum to zero"},
		{"negative cap", rule(func(r *limiter.Rule) {
			w := limiter.DefaultWeighted()
			w.UserCap = -1
			r.Weighted = &w
		}), "user_cap"},
		{"share", rule(func(r *limiter.Rule) { r.FallbackShare = 1.5 }), "fallback_share"},
		{"bad name", limiter.Limits{VIPFromTier: 1, Rules: map[string]limiter.Rule{"a{b}": {Algorithm: limiter.SlidingWindow, Window: limiter.Duration(time.Second)}}}, "rule name"},
		{"vip level", limiter.Limits{}, "vip_from_level"},
	}
	for _, c := range cases {
		err := c.l.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: got %v, want valid", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, limiter.ErrInvalidLimits)):
			t.Errorf("%s: got %v, want an ErrInvalidLimits mentioning %q", c.name, err, c.want)
		}
	}
	// A retired rule is refused, naming where its setting lives now; the
	// document's other rules are still judged.
	for name, where := range limiter.RetiredRules {
		l := rule(func(r *limiter.Rule) { r.Limit = -1 })
		l.Rules[name] = limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 5, Window: limiter.Duration(time.Second)}
		err := l.Validate()
		if err == nil || !errors.Is(err, limiter.ErrInvalidLimits) || !strings.Contains(err.Error(), `rule "`+name+`" was removed`) ||
			!strings.Contains(err.Error(), where) || !strings.Contains(err.Error(), "-") || !strings.Contains(err.Error(), "negative") {
			t.Errorf("retired %s: got %v, want an ErrInvalidLimits naming %q and the other rule's problem", name, err, where)
		}
	}
	// All problems are reported at once.
	two := rule(func(r *limiter.Rule) { r.Limit = -1; r.Burst = 2 })
	if err := two.Validate(); err == nil || strings.Count(err.Error(), "\n") != 1 {
		t.Errorf("got %v, want two joined errors", err)
	}
}

func TestRetiredRules(t *testing.T) {
	for _, name := range []string{"group", "downlink", "at_all", "egress"} {
		where, ok := limiter.RetiredRules[name]
		if !ok || !strings.Contains(where, "fanfared -") || !strings.Contains(where, "tuning ") {
			t.Errorf("%s: got %q, want a retired rule naming its fanfared flag and tuning setting", name, where)
		}
		if _, ok := limiter.DefaultRules()[name]; ok {
			t.Errorf("%s: still a default rule", name)
		}
	}
	// A document an older node stored (its defaults included the retired
	// rules) loads once they are dropped.
	var old limiter.Limits
	if err := json.Unmarshal([]byte(`{"vip_from_level":1,"rules":{"user_all":{"limit":7},"group":{"limit":20},"egress":{"algorithm":"gcra","limit":1,"burst":1}}}`), &old); err != nil {
		t.Fatal(err)
	}
	if got := old.DropRetired(); len(got) != 2 || got[0] != "egress" || got[1] != "group" {
		t.Errorf("dropped %v, want [egress group]", got)
	}
	n := old.Normalize()
	if err := n.Validate(); err != nil || n.Rules[limiter.UserAll].Limit != 7 {
		t.Errorf("after DropRetired: %v, user_all %d; want valid, 7", err, n.Rules[limiter.UserAll].Limit)
	}
}

func TestClassesSharesReserves(t *testing.T) {
	l := limiter.Limits{VIPFromTier: 2}
	for level, want := range map[int]limiter.Class{-5: limiter.ClassLow, -1: limiter.ClassLow, 0: limiter.ClassNormal, 1: limiter.ClassNormal, 2: limiter.ClassVIP, 3: limiter.ClassVIP} {
		if got := l.ClassOf(level); got != want {
			t.Errorf("level %d: got %v, want %v", level, got, want)
		}
	}
	if got := (&limiter.Limits{}).ClassOf(1); got != limiter.ClassVIP {
		t.Errorf("default: level 1 is %v, want vip", got)
	}
	w := limiter.DefaultWeighted()
	r := limiter.Rule{Limit: 1000, Weighted: &w}
	if got, want := r.Shares(), [limiter.NumClasses]int64{100, 300, 600}; got != want {
		t.Errorf("shares: got %v, want %v", got, want)
	}
	if got, want := r.Reserves(), [limiter.NumClasses]int64{0, 150, 300}; got != want {
		t.Errorf("reserves: got %v, want %v", got, want)
	}
}

func TestScaled(t *testing.T) {
	l := limiter.Limits{Rules: map[string]limiter.Rule{
		"ten": {Algorithm: limiter.SlidingWindow, Limit: 10, Window: limiter.Duration(time.Second)},
	}}.Normalize()
	s := l.Scaled(0.25)
	cases := []struct {
		name       string
		limit, cap int64
	}{
		{"ten", 3, 0},              // ceil(2.5)
		{limiter.Pull, 500, 3},     // cap ceil(10/4)
		{limiter.UserGroup, 5, 0},  // fallback_share 1: a user's connection lives on one node
		{limiter.Connect, 1000, 5}, // per node anyway
	}
	for _, c := range cases {
		r := s.Rules[c.name]
		var cp int64
		if r.Weighted != nil {
			cp = r.Weighted.UserCap
		}
		if r.Limit != c.limit || cp != c.cap {
			t.Errorf("%s: got limit %d cap %d, want %d %d", c.name, r.Limit, cp, c.limit, c.cap)
		}
	}
	if l.Rules["ten"].Limit != 10 || l.Rules[limiter.Pull].Weighted.UserCap != 10 {
		t.Error("Scaled modified its receiver")
	}
}
