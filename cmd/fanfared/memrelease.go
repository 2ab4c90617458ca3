package main

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"
)

// releaser gives the heap the collector keeps free back to the operating
// system once a burst of WebSocket upgrades has settled (-mem-release-upgrades,
// -mem-release-quiet). An upgrade allocates a few kilobytes (the request, the
// token's claims, the registration) that are garbage a moment later; after
// thousands of them the runtime holds those pages, free, for minutes before
// its scavenger returns them, and an idle node's resident memory is up to
// twice what its connections use. One forced collection and release
// (runtime/debug.FreeOSMemory) after the burst gives them back at once.
//
// It costs one full collection (its mark work is the live heap: 49 ms of
// CPU at 9,000 idle connections, 75 ms at 19,000, docs/benchmarks.md
// "Idle memory per connection at 9,000") per burst of at least
// upgrades connections followed by quiet: a steady trickle of upgrades
// never fires it, and a node taking connections without pause releases
// only when they pause. Releases are at least gap apart
// (-mem-release-gap), so clients that reconnect in bursts on purpose
// cannot make the node collect more often than that.
type releaser struct {
	upgrades func() uint64 // upgrades since start (socket.Server.Stats)
	after    uint64        // upgrades since the last release that make a burst; 0 = never release
	quiet    time.Duration // upgrade-free time that ends a burst
	gap      time.Duration // least time between two releases
	release  func()        // debug.FreeOSMemory
	log      *slog.Logger
}

// Run checks every quiet period whether at least after upgrades happened
// since the last release, none during the last period, and gap has passed
// since the last release; then it releases.
func (r *releaser) Run(ctx context.Context) error {
	if r.after == 0 || r.quiet <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(r.quiet)
	defer t.Stop()
	base := r.upgrades()
	prev := base
	var last time.Time // of the last release
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n := r.upgrades()
		if n == prev && n-base >= r.after && (last.IsZero() || time.Since(last) >= r.gap) {
			r.releaseNow(n - base)
			base = n
			last = time.Now()
		}
		prev = n
	}
}

// releaseNow releases and logs what it cost: the wall time of the call and
// the process's CPU time meanwhile (the collection's workers run on other
// threads too).
func (r *releaser) releaseNow(upgrades uint64) {
	cpu0 := processCPU()
	t0 := time.Now()
	r.release()
	took := time.Since(t0)
	r.log.Info("free heap returned to the operating system after a burst of upgrades",
		"upgrades", upgrades, "took", took.String(), "cpu", (processCPU() - cpu0).String())
}

func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
