package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestReleaser: a release follows a burst of at least `after` upgrades once
// a quiet period passes without one; fewer upgrades, or upgrades that do not
// pause, release nothing; a second release needs a second burst.
func TestReleaser(t *testing.T) {
	const quiet = time.Second
	type step struct {
		upgrades uint64 // added at the start of this period
		want     int    // releases so far at the end of it
	}
	cases := []struct {
		name  string
		after uint64
		gap   time.Duration
		steps []step
	}{
		{"one short of a burst", 1000, 0, []step{{999, 0}, {0, 0}, {0, 0}}},
		{"a burst, then quiet", 1000, 0, []step{{1000, 0}, {0, 1}, {0, 1}, {0, 1}}},
		{"a burst in pieces", 1000, 0, []step{{400, 0}, {600, 0}, {0, 1}}},
		{"no pause, no release", 1000, 0, []step{{1000, 0}, {1, 0}, {1, 0}, {1, 0}, {0, 1}}},
		{"a second burst", 10, 0, []step{{10, 0}, {0, 1}, {9, 1}, {0, 1}, {1, 1}, {0, 2}}},
		{"off", 0, 0, []step{{5000, 0}, {0, 0}, {0, 0}}},
		{"bursts closer than the gap", 10, 3 * quiet, []step{{10, 0}, {0, 1}, {10, 1}, {0, 1}, {0, 2}, {10, 2}, {0, 2}, {0, 3}, {0, 3}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var n atomic.Uint64
				var released atomic.Int32
				r := &releaser{upgrades: n.Load, after: tc.after, gap: tc.gap, quiet: quiet, release: func() { released.Add(1) }, log: slog.New(slog.DiscardHandler)}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- r.Run(ctx) }()
				synctest.Wait()
				for i, s := range tc.steps {
					n.Add(s.upgrades)
					time.Sleep(quiet)
					synctest.Wait()
					if got := int(released.Load()); got != s.want {
						t.Fatalf("period %d: got %d releases, want %d", i, got, s.want)
					}
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("Run: %v", err)
				}
			})
		})
	}
}

// TestConfigMemRelease: -mem-release-upgrades and -mem-release-quiet at and
// past their bounds, and from the environment.
func TestConfigMemRelease(t *testing.T) {
	cases := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{nil, ""},
		{[]string{"-mem-release-upgrades", "0"}, ""},
		{[]string{"-mem-release-upgrades", "-1"}, "mem-release-upgrades -1 is negative"},
		{[]string{"-mem-release-quiet", "10ms"}, ""},
		{[]string{"-mem-release-quiet", "9ms"}, "mem-release-quiet 9ms is under 10ms"},
		{[]string{"-mem-release-gap", "0s"}, ""},
		{[]string{"-mem-release-gap", "1h"}, ""},
		{[]string{"-mem-release-gap", "61m"}, "mem-release-gap must be in 0..1h"},
		{[]string{"-mem-release-gap", "-1s"}, "mem-release-gap must be in 0..1h"},
	}
	for _, tc := range cases {
		_, err := loadConfig(tc.args, func(string) string { return "" }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Fatalf("%v: got %v, want valid", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Fatalf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		}
	}
	c, err := loadConfig(nil, func(k string) string {
		return map[string]string{"FANFARE_MEM_RELEASE_UPGRADES": "50", "FANFARE_MEM_RELEASE_QUIET": "2s"}[k]
	}, io.Discard)
	if err != nil || c.MemReleaseUpgrades != 50 || c.MemReleaseQuiet != 2*time.Second {
		t.Fatalf("from env: %v %d %v, want 50 2s", err, c.MemReleaseUpgrades, c.MemReleaseQuiet)
	}
	if c, _ := loadConfig(nil, func(string) string { return "" }, io.Discard); c.MemReleaseUpgrades != 1000 || c.MemReleaseQuiet != time.Second {
		t.Fatalf("defaults: %d %v, want 1000 1s", c.MemReleaseUpgrades, c.MemReleaseQuiet)
	}
}
