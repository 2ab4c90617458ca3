// This file holds the engine's configuration: Config (fixed at New, with
// the reloadable Tuning embedded, see tuning.go), its defaults and
// validation. New (engine.go) takes it.

package fanout

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Config configures an Engine. The zero value of every field but Store
// works. Rates are per second; "negative disables" where said. The
// embedded Tuning may be changed on a running engine with
// Engine.SetTuning; the other fields are fixed at New.
type Config struct {
	// Tuning holds the settings that reload at runtime (merge windows,
	// queue bound, group limits, triggers, hot groups, tier 2), each
	// described by its tags (see Tuning).
	Tuning

	Store    store.Store
	Presence Presence // nil = nobody is online (no pushes)
	Pusher   Pusher   // nil = no pushes
	// Bus carries committed batches and membership changes to the other
	// nodes (cluster mode); nil = one node. Remote batches come back
	// through Engine.Remote, remote membership changes through
	// Engine.RemoteMembers.
	Bus Bus
	// HotSet shares hot groups and group limits with the other nodes
	// (cluster mode): this node's hot groups are published, and a group
	// any node marks hot is hot here too (docs/architecture.md §9); so is the offered
	// rate of each limited group, and this node enforces the part of the
	// group's limit in proportion to its own offered rate (docs/architecture.md §8);
	// nil = hot status and group limits are per node.
	HotSet HotSet
	// NodeID names this node in the HotSet; required with HotSet.
	NodeID string
	// HotSync is how often this node's marks are published and the
	// cluster's read (one HotSet call); 0 = 1 s.
	HotSync time.Duration
	// HotTTL is how long a published mark lives without a refresh (a dead
	// node's marks expire after it); 0 = 10 s; must exceed 2 x HotSync.
	HotTTL time.Duration
	// AtAllQuota counts @all messages per group per UTC day for the
	// whole cluster (docs/architecture.md §8); nil = each node counts its own. While
	// it fails the node counts its own (see AtAllQuota).
	AtAllQuota AtAllQuota

	// Shards is the number of ordinary shard workers; 0 = 4.
	Shards int
	// HotShards is the number of workers of the hot pool; 0 = 2.
	HotShards int
	// MaxBatch bounds the messages committed in one transaction; 0 = 512.
	MaxBatch int
	// Linger is how long a worker waits for more sends before committing a
	// batch that is not full; 0 = commit what is queued at once (batches
	// still grow under load: sends queue while the previous commit runs).
	Linger time.Duration
	// QueueCap is the hard capacity of each ordinary shard queue (tasks);
	// 0 = 8192.
	QueueCap int
	// HotQueueCap is the hard capacity of each hot shard queue; 0 =
	// QueueCap/4.
	HotQueueCap int
	// CommitTimeout bounds one store commit; 0 = 5 s.
	CommitTimeout time.Duration
	// Levels holds the degradation levels; nil = a new table on Now.
	Levels *Levels
	// Now is the clock of levels, rate windows, limits and triggers; nil =
	// time.Now.
	Now func() time.Time

	// RateWindow is the sliding window of group rates; 0 = 1 s.
	RateWindow time.Duration
	// EvalInterval is how often every group's triggers are evaluated (they
	// are also evaluated as sends arrive); 0 = 500 ms.
	EvalInterval time.Duration
	// NodeInterval is how often node triggers are evaluated and the store
	// probed; 0 = 1 s.
	NodeInterval time.Duration

	// MemberCache bounds the senders whose membership is remembered per
	// large or hot group (sends of non-members and muted members are
	// refused before the group's limits, triggers and @all quota count
	// them; the store is asked once per sender and MemberCacheTTL); 0 =
	// 4096; negative = no such check (Append alone refuses them, after
	// they were counted).
	MemberCache int
	// MemberCacheTTL is how long a remembered answer is used (a change
	// made on the group's worker forgets it at once; this bounds one made
	// elsewhere, e.g. a mute, or an addition on another node); 0 = 10 s.
	MemberCacheTTL time.Duration

	// MemberFeedInterval is how often, in cluster mode, the node reads
	// the store's feed of membership additions to repair those the bus
	// lost for members online here (members.go); it also reads at once
	// when a loss shows (a membership version hole, a dropped remote
	// change, a bus reconnect). 0 = 1 s.
	MemberFeedInterval time.Duration
	// MemberFeedPage bounds the additions of one feed read (pages are
	// read until the feed is caught up); 0 = 1000, at most the store's
	// Limits.MaxAddMembers.
	MemberFeedPage int
	// MemberFeedGrace is how long an addition the feed found missing here
	// is left to its hint on the bus before it is repaired (members.go):
	// the feed often reads a row between its commit and its hint's apply
	// here, and that addition was not lost; 0 = 2 s.
	MemberFeedGrace time.Duration
	// MemberFeedKickGap is the least time between the start of a feed
	// read and a kicked one: kicks come per batch behind its view, per
	// dropped change and per reconnect, and many at once (startup, a store
	// or a bus coming back) must not make the feed read back to back;
	// 0 = 100 ms.
	MemberFeedKickGap time.Duration
	// MemberFeedPendingMax bounds the additions waiting out their grace;
	// beyond it an addition found missing is repaired at once; 0 = 100000.
	MemberFeedPendingMax int

	// TouchInterval is how often the users' last-active times of connects
	// (Store.TouchUsers) are written: a connect only records its user's
	// time in memory, and every TouchInterval each user touched is written
	// once, with its latest time (touch.go). So a user's last_active_at
	// lags its latest connect by at most TouchInterval plus the write
	// (longer only while the store fails); Shutdown writes what is left.
	// 0 = 1 s; at most MaxTouchInterval.
	TouchInterval time.Duration
	// TouchPendingMax bounds the users waiting for that write; a connect
	// of another user while it is full loses its touch (counted) and
	// makes the write start at once. 0 = 100000.
	TouchPendingMax int

	// BeforeSend is the before-send hook (hooks.go); nil = none. Its
	// calls hold the worker's batch up to the hook's timeout.
	BeforeSend BeforeSendHook
	// Events takes the after-commit events (hooks.go); nil = none. With
	// it, a send is acked only once its event is journaled.
	Events EventSink

	Metrics *Metrics // nil = not exported
	Logger  *slog.Logger
}

// MaxTouchInterval bounds Config.TouchInterval: a user's last_active_at
// may lag by that much, which must stay far below the active window of
// tier 2 (7 days by default) and its re-read (ActiveRefresh, 1 min).
const MaxTouchInterval = time.Minute

func (c *Config) fill() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	c.Tuning.fill()
	def(&c.Shards, 4)
	def(&c.HotShards, 2)
	def(&c.MaxBatch, 512)
	def(&c.QueueCap, 8192)
	def(&c.HotQueueCap, max(c.QueueCap/4, 16))
	c.QueueMinBound = min(c.QueueMinBound, c.QueueCap)
	defD(&c.CommitTimeout, 5*time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
	defD(&c.RateWindow, time.Second)
	defD(&c.EvalInterval, 500*time.Millisecond)
	defD(&c.NodeInterval, time.Second)
	defD(&c.HotSync, time.Second)
	defD(&c.HotTTL, 10*time.Second)
	if c.MemberCache == 0 {
		c.MemberCache = 4096
	}
	defD(&c.MemberCacheTTL, 10*time.Second)
	defD(&c.MemberFeedInterval, time.Second)
	def(&c.MemberFeedPage, 1000)
	defD(&c.MemberFeedGrace, 2*time.Second)
	defD(&c.MemberFeedKickGap, 100*time.Millisecond)
	def(&c.MemberFeedPendingMax, 100000)
	defD(&c.TouchInterval, time.Second)
	def(&c.TouchPendingMax, 100000)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Levels == nil {
		c.Levels = NewLevels(c.Now, c.Logger)
	}
}

// Validate reports every problem of c (those of its Tuning wrapped in
// ErrInvalidTuning).
func (c Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("fanout: Store is required"))
	}
	if c.Shards < 0 || c.HotShards < 0 || c.MaxBatch < 0 || c.QueueCap < 0 || c.HotQueueCap < 0 {
		errs = append(errs, errors.New("fanout: Shards, HotShards, MaxBatch, QueueCap and HotQueueCap must not be negative"))
	}
	if c.Linger < 0 || c.CommitTimeout < 0 || c.RateWindow < 0 || c.EvalInterval < 0 || c.NodeInterval < 0 {
		errs = append(errs, errors.New("fanout: durations must not be negative"))
	}
	if c.MemberCacheTTL < 0 {
		errs = append(errs, errors.New("fanout: MemberCacheTTL must not be negative"))
	}
	if c.MemberFeedInterval < 0 || c.MemberFeedPage < 0 {
		errs = append(errs, errors.New("fanout: MemberFeedInterval and MemberFeedPage must not be negative"))
	}
	if c.MemberFeedGrace < 0 || c.MemberFeedKickGap < 0 || c.MemberFeedPendingMax < 0 {
		errs = append(errs, errors.New("fanout: MemberFeedGrace, MemberFeedKickGap and MemberFeedPendingMax must not be negative"))
	}
	if c.TouchInterval < 0 || c.TouchInterval > MaxTouchInterval {
		errs = append(errs, fmt.Errorf("fanout: TouchInterval must be 0 to %v, got %v", MaxTouchInterval, c.TouchInterval))
	}
	if c.TouchPendingMax < 0 {
		errs = append(errs, errors.New("fanout: TouchPendingMax must not be negative"))
	}
	if c.HotSync < 0 || c.HotTTL < 0 {
		errs = append(errs, errors.New("fanout: HotSync and HotTTL must not be negative"))
	}
	if c.HotSet != nil {
		if c.NodeID == "" {
			errs = append(errs, errors.New("fanout: NodeID is required with a HotSet"))
		}
		if sync, ttl := cmp.Or(c.HotSync, time.Second), cmp.Or(c.HotTTL, 10*time.Second); ttl <= 2*sync {
			errs = append(errs, fmt.Errorf("fanout: HotTTL (%v) must exceed 2 x HotSync (%v)", ttl, sync))
		}
	}
	if err := c.Tuning.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
