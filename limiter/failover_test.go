package limiter_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/limitertest"
	"github.com/fanfare-im/fanfare/limiter/local"
)

// flaky is a primary whose backend can be switched off.
type flaky struct {
	*local.Limiter
	down  atomic.Bool
	calls atomic.Int64
}

func (f *flaky) Allow(ctx context.Context, checks ...limiter.Check) (limiter.Decision, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return limiter.Decision{Index: -1}, errors.Join(limiter.ErrUnavailable, errors.New("dial tcp: connection refused"))
	}
	return f.Limiter.Allow(ctx, checks...)
}

func (f *flaky) Ping(ctx context.Context) error {
	if f.down.Load() {
		return errors.New("connection refused")
	}
	return nil
}

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestFailover(t *testing.T) {
	clk := limitertest.NewClock()
	lim := limiter.Limits{Rules: map[string]limiter.Rule{
		"shared":  {Algorithm: limiter.SlidingWindow, Limit: 10, Window: limiter.Duration(time.Minute)},
		"pinned":  {Algorithm: limiter.SlidingWindow, Limit: 10, Window: limiter.Duration(time.Minute), FallbackShare: 1},
		"percent": {Algorithm: limiter.GCRA, Limit: 9, Window: limiter.Duration(time.Minute), Burst: 9},
	}}
	pl, err := local.New(local.Config{Limits: lim, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	primary := &flaky{Limiter: pl}
	fallback, err := local.New(local.Config{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := limiter.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	f, err := limiter.NewFailover(primary, fallback, limiter.FailoverConfig{
		Nodes:         4,
		ProbeInterval: time.Millisecond,
		Registerer:    reg,
		Metrics:       m,
		Logger:        slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := fallback.Limits().Rules["shared"].Limit; got != 3 {
		t.Fatalf("fallback limit %d, want ceil(10/4) = 3", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	count := func(rule string) int {
		n := 0
		for range 20 {
			d, err := f.Allow(context.Background(), limiter.Check{Rule: rule, Key: "k"})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	if got := count("shared"); got != 10 {
		t.Fatalf("primary: %d allowed, want 10", got)
	}
	primary.down.Store(true)
	if got := count("shared"); got != 3 {
		t.Fatalf("fallback: %d allowed, want the node's share 3", got)
	}
	if !f.Fallback() || value(f.ActiveGauge()) != 1 {
		t.Fatal("not on fallback")
	}
	if got := count("pinned"); got != 10 {
		t.Fatalf("fallback, fallback_share 1: %d allowed, want 10", got)
	}
	calls := primary.calls.Load()
	count("percent")
	if primary.calls.Load() != calls {
		t.Fatal("primary called while on fallback")
	}
	// Reload while down: primary gets the limits, fallback its share.
	next := f.Limits()
	next.Rules["shared"] = limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 40, Window: limiter.Duration(time.Minute)}
	if err := f.SetLimits(next); err != nil {
		t.Fatal(err)
	}
	if a, b := primary.Limits().Rules["shared"].Limit, fallback.Limits().Rules["shared"].Limit; a != 40 || b != 10 {
		t.Fatalf("after reload: primary %d fallback %d, want 40 and 10", a, b)
	}
	primary.down.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for f.Fallback() {
		if time.Now().After(deadline) {
			t.Fatal("did not switch back within 5s")
		}
		time.Sleep(time.Millisecond)
	}
	if got := count("shared") + count("shared"); got != 30 {
		t.Fatalf("back on primary: %d allowed, want 40 - 10 = 30", got)
	}
	if got := value(f.SwitchCounter().WithLabelValues("fallback")); got != 1 {
		t.Errorf("switches to fallback: %v, want 1", got)
	}
	if got := value(f.SwitchCounter().WithLabelValues("primary")); got != 1 {
		t.Errorf("switches to primary: %v, want 1", got)
	}
	for _, want := range []string{"Redis unreachable", "connection refused", "Redis reachable again"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	// Decisions were counted once each, by the failover.
	if got := value(m.Vec().WithLabelValues("shared", "normal", "allowed", "none")); got != 10+3+30 {
		t.Errorf("allowed shared: %v, want 43", got)
	}
	if got := value(m.Vec().WithLabelValues("shared", "normal", "denied", "limit")); got != 10+17+10 {
		t.Errorf("denied shared: %v, want 37", got)
	}
}

func TestFailoverPassesOtherErrors(t *testing.T) {
	pl, _ := local.New(local.Config{})
	fb, _ := local.New(local.Config{})
	f, err := limiter.NewFailover(&flaky{Limiter: pl}, fb, limiter.FailoverConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Allow(context.Background(), limiter.Check{Rule: "nope"}); !errors.Is(err, limiter.ErrUnknownRule) {
		t.Fatalf("got %v, want ErrUnknownRule", err)
	}
	if f.Fallback() {
		t.Fatal("an unknown rule switched to the fallback")
	}
	if _, err := limiter.NewFailover(&flaky{Limiter: pl}, fb, limiter.FailoverConfig{Share: 2}); err == nil {
		t.Fatal("share 2 accepted")
	}
}

func TestMetricsLabels(t *testing.T) {
	m, err := limiter.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	l := limiter.Default()
	checks := []limiter.Check{{Rule: limiter.UserGroup, Tier: 3}, {Rule: limiter.Pull, Tier: -1}}
	m.Observe(&l, checks, limiter.Decision{Allowed: true, Index: 0})
	m.Observe(&l, checks, limiter.Decision{Reason: limiter.ReasonReserve, Index: 1})
	cases := []struct {
		labels []string
		want   float64
	}{
		{[]string{limiter.UserGroup, "vip", "allowed", "none"}, 1},
		{[]string{limiter.Pull, "low", "allowed", "none"}, 1},
		{[]string{limiter.Pull, "low", "denied", "reserve"}, 1},
		{[]string{limiter.UserGroup, "vip", "denied", "limit"}, 0},
	}
	for _, c := range cases {
		if got := value(m.Vec().WithLabelValues(c.labels...)); got != c.want {
			t.Errorf("%v: got %v, want %v", c.labels, got, c.want)
		}
	}
	var nilM *limiter.Metrics
	nilM.Observe(&l, checks, limiter.Decision{Allowed: true}) // no panic
}

// value reads a counter or gauge.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
