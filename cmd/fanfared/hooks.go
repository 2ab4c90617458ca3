// This file wires the application hooks (docs/protocol.md §13,
// docs/architecture.md §17): their flags, their validation, and the
// before-send client, event stream and journal the engine is given.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/hooks/pebblejournal"
	"github.com/fanfare-im/fanfare/fanout/hooks/redisjournal"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// hookConfig holds the hook settings of fanfared (the "hooks" flag group).
type hookConfig struct {
	HookSecret           string
	HookBeforeSendURL    string
	HookBeforeSendTO     time.Duration
	HookBeforeSendOpen   bool
	HookBeforeSendGroups string
	HookEventsURL        string
	HookEventsDir        string
	HookEventsBatch      int
	HookEventsTimeout    time.Duration
	HookEventsBackoff    time.Duration
	HookEventsMaxBackoff time.Duration
	HookEventsAttempts   int
	HookEventsCapacity   int
	HookEventsDrop       bool
	HookEventsBodyMax    int
	HookEventsOffline    int
	HookEventsAsync      int
	HookEventsReorder    time.Duration
	HookEventsDrain      time.Duration
}

// hookFlagNames are the flags of hookFlags, in usage order.
var hookFlagNames = []string{"hook-secret", "hook-before-send-url", "hook-before-send-timeout", "hook-before-send-fail-open",
	"hook-before-send-groups", "hook-events-url", "hook-events-dir", "hook-events-batch", "hook-events-timeout",
	"hook-events-backoff", "hook-events-max-backoff", "hook-events-max-attempts", "hook-events-capacity",
	"hook-events-drop-when-full", "hook-events-body-max", "hook-events-offline-max", "hook-events-async-queue",
	"hook-events-reorder", "hook-events-drain"}

// Bounds of the hook flags.
const (
	maxHookTimeout   = 10 * time.Second
	maxHookBatch     = 1000
	maxHookBodyMax   = store.DefaultMaxBodyBytes
	maxHookOffline   = 10000
	minHookCapacity  = 1024
	maxHookCapacity  = 100_000_000
	maxHookAsync     = 1_000_000
	maxHookReorder   = 10 * time.Second
	minHookBackoff   = time.Millisecond
	maxHookAttempts  = 1000
	defaultHookDrain = 5 * time.Second
)

func (c *hookConfig) hookFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.HookSecret, "hook-secret", "", "shared secret (>= 16 bytes) signing every hook request (HMAC-SHA256 of timestamp.body in Fanfare-Signature); required with a hook URL")
	fs.StringVar(&c.HookBeforeSendURL, "hook-before-send-url", "", "URL asked about every send before it is stored (allow, reject with a code, rewrite), one POST per group per commit batch; empty = no before-send hook")
	fs.DurationVar(&c.HookBeforeSendTO, "hook-before-send-timeout", 200*time.Millisecond, "bound of one before-send POST (the batch's sends wait for it); past it the hook has failed; 1ms..10s")
	fs.BoolVar(&c.HookBeforeSendOpen, "hook-before-send-fail-open", false, "when the before-send hook fails (timeout, error status, bad answer), store the sends as sent; false = refuse them (unavailable, retryable)")
	fs.StringVar(&c.HookBeforeSendGroups, "hook-before-send-groups", "all", "groups the before-send hook applies to: all, or gids and inclusive ranges (7,100-199), at most 1024")
	fs.StringVar(&c.HookEventsURL, "hook-events-url", "", "URL receiving the after-commit event stream (messages with their offline members, connect, disconnect, join, leave), at least once, in order; empty = no events")
	fs.StringVar(&c.HookEventsDir, "hook-events-dir", "", "embedded mode: directory of the event journal; empty = hooks/ in -data-dir (cluster mode: a Redis Stream)")
	fs.IntVar(&c.HookEventsBatch, "hook-events-batch", 100, "events in one POST; 1..1000")
	fs.DurationVar(&c.HookEventsTimeout, "hook-events-timeout", 5*time.Second, "bound of one event POST; 1ms..10s")
	fs.DurationVar(&c.HookEventsBackoff, "hook-events-backoff", 100*time.Millisecond, "wait before the first retry of a failed event POST, doubled per retry up to -hook-events-max-backoff")
	fs.DurationVar(&c.HookEventsMaxBackoff, "hook-events-max-backoff", 30*time.Second, "longest wait between retries of an event POST")
	fs.IntVar(&c.HookEventsAttempts, "hook-events-max-attempts", 0, "drop an event batch (counted) after this many failed POSTs; 0 = retry forever (the journal holds the events, then slows the sends)")
	fs.IntVar(&c.HookEventsCapacity, "hook-events-capacity", 1_000_000, "undelivered events the journal holds; past it sends wait for room (or events are dropped with -hook-events-drop-when-full); 1024..100000000")
	fs.BoolVar(&c.HookEventsDrop, "hook-events-drop-when-full", false, "drop events (counted) when the journal is full instead of holding the sends")
	fs.IntVar(&c.HookEventsBodyMax, "hook-events-body-max", 4096, "largest message body an event carries; a longer one is left out (body_omitted, body_bytes); 0..32768")
	fs.IntVar(&c.HookEventsOffline, "hook-events-offline-max", 1000, "offline members listed in a message event (offline_truncated past it); 0..10000")
	fs.IntVar(&c.HookEventsAsync, "hook-events-async-queue", 10000, "connect and disconnect events waiting to be journaled; past it they are dropped (counted); 1..1000000")
	fs.DurationVar(&c.HookEventsReorder, "hook-events-reorder", 250*time.Millisecond, "cluster mode: an event is read once it is this old, so that one group's events appended by several nodes are delivered in seq order; 1ms..10s")
	fs.DurationVar(&c.HookEventsDrain, "hook-events-drain", defaultHookDrain, "at shutdown, how long the node keeps delivering the journal (what is left stays journaled for the next start)")
}

func (c *hookConfig) validateHooks() error {
	var errs []error
	on := c.HookBeforeSendURL != "" || c.HookEventsURL != ""
	if on && len(c.HookSecret) < hooks.MinSecretBytes {
		errs = append(errs, fmt.Errorf("hook-secret must be at least %d bytes with a hook URL", hooks.MinSecretBytes))
	}
	if c.HookBeforeSendURL != "" {
		if err := (hooks.BeforeSendConfig{URL: c.HookBeforeSendURL, Secret: []byte(c.HookSecret)}).Validate(); err != nil && len(c.HookSecret) >= hooks.MinSecretBytes {
			errs = append(errs, fmt.Errorf("hook-before-send-url: %w", err))
		}
	}
	if c.HookEventsURL != "" {
		if err := (hooks.StreamConfig{URL: c.HookEventsURL, Secret: []byte(c.HookSecret), Journal: nopJournal{}}).Validate(); err != nil && len(c.HookSecret) >= hooks.MinSecretBytes {
			errs = append(errs, fmt.Errorf("hook-events-url: %w", err))
		}
	}
	if _, err := hooks.ParseGIDSet(c.HookBeforeSendGroups); err != nil {
		errs = append(errs, fmt.Errorf("hook-before-send-groups: %w", err))
	}
	dur := func(name string, v, lo, hi time.Duration) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("%s must be in %v..%v, got %v", name, lo, hi, v))
		}
	}
	num := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("%s must be in %d..%d, got %d", name, lo, hi, v))
		}
	}
	dur("hook-before-send-timeout", c.HookBeforeSendTO, time.Millisecond, maxHookTimeout)
	dur("hook-events-timeout", c.HookEventsTimeout, time.Millisecond, maxHookTimeout)
	dur("hook-events-backoff", c.HookEventsBackoff, minHookBackoff, c.HookEventsMaxBackoff)
	dur("hook-events-max-backoff", c.HookEventsMaxBackoff, minHookBackoff, time.Hour)
	dur("hook-events-reorder", c.HookEventsReorder, time.Millisecond, maxHookReorder)
	dur("hook-events-drain", c.HookEventsDrain, 0, time.Hour)
	num("hook-events-batch", c.HookEventsBatch, 1, maxHookBatch)
	num("hook-events-max-attempts", c.HookEventsAttempts, 0, maxHookAttempts)
	num("hook-events-capacity", c.HookEventsCapacity, minHookCapacity, maxHookCapacity)
	num("hook-events-body-max", c.HookEventsBodyMax, 0, maxHookBodyMax)
	num("hook-events-offline-max", c.HookEventsOffline, 0, maxHookOffline)
	num("hook-events-async-queue", c.HookEventsAsync, 1, maxHookAsync)
	return errors.Join(errs...)
}

// nopJournal lets validateHooks check a StreamConfig before the journal
// is opened.
type nopJournal struct{}

func (nopJournal) Append(context.Context, [][]byte) error            { return nil }
func (nopJournal) Read(context.Context, int) ([]hooks.Record, error) { return nil, nil }
func (nopJournal) Ack(context.Context, string) error                 { return nil }
func (nopJournal) Pending(context.Context) (int64, error)            { return 0, nil }

// hookSet is what newHooks built: the stream and its journal's closer.
type hookSet struct {
	stream  *hooks.Stream
	closeFn func() error
	release func(context.Context) error // cluster: give up the delivery lease
}

// newHooks builds the configured hooks into ecfg; the returned set is nil
// when no event stream is configured.
func (s *server) newHooks(ecfg *fanout.Config, pres *presence.Local[fanout.Conn], reg prometheus.Registerer) (*hookSet, error) {
	cfg := s.cfg
	if cfg.HookBeforeSendURL == "" && cfg.HookEventsURL == "" {
		return nil, nil
	}
	met := hooks.NewMetrics(reg)
	if cfg.HookBeforeSendURL != "" {
		groups, err := hooks.ParseGIDSet(cfg.HookBeforeSendGroups)
		if err != nil {
			return nil, err
		}
		bcfg := hooks.BeforeSendConfig{URL: cfg.HookBeforeSendURL, Secret: []byte(cfg.HookSecret), Timeout: cfg.HookBeforeSendTO,
			FailOpen: cfg.HookBeforeSendOpen, Groups: groups, MaxBody: store.DefaultMaxBodyBytes, Metrics: met, Logger: s.log}
		if err := bcfg.Validate(); err != nil {
			return nil, err
		}
		ecfg.BeforeSend = hooks.NewBeforeSend(bcfg)
	}
	if cfg.HookEventsURL == "" {
		return nil, nil
	}
	hs := &hookSet{}
	var j hooks.Journal
	if s.rdb != nil {
		rj, err := redisjournal.New(redisjournal.Config{Client: s.rdb, Prefix: cfg.RedisPrefix + "hooks:", Node: cfg.NodeID,
			Capacity: cfg.HookEventsCapacity, Reorder: cfg.HookEventsReorder})
		if err != nil {
			return nil, err
		}
		j, hs.closeFn, hs.release = rj, func() error { return nil }, rj.Release
	} else {
		dir := cfg.HookEventsDir
		if dir == "" {
			dir = filepath.Join(cfg.DataDir, "hooks")
		}
		pj, err := pebblejournal.Open(dir, cfg.HookEventsCapacity)
		if err != nil {
			return nil, err
		}
		j, hs.closeFn = pj, pj.Close
	}
	body := cfg.HookEventsBodyMax
	if body == 0 {
		body = -1 // hooks: 0 = its default, negative = none; the flag's 0 = none
	}
	scfg := hooks.StreamConfig{URL: cfg.HookEventsURL, Secret: []byte(cfg.HookSecret), Journal: j,
		Audience: &audience{s: s, pres: pres}, Node: cfg.NodeID, Batch: cfg.HookEventsBatch, Timeout: cfg.HookEventsTimeout,
		Backoff: cfg.HookEventsBackoff, MaxBackoff: cfg.HookEventsMaxBackoff, MaxAttempts: cfg.HookEventsAttempts,
		DropWhenFull: cfg.HookEventsDrop, BodyMax: body, OfflineMax: cfg.HookEventsOffline, AsyncQueue: cfg.HookEventsAsync,
		Metrics: met, Logger: s.log}
	if cfg.HookEventsOffline == 0 {
		scfg.Audience = nil
	}
	if err := scfg.Validate(); err != nil {
		hs.closeFn()
		return nil, err
	}
	hs.stream = hooks.NewStream(scfg)
	ecfg.Events = hs.stream
	return hs, nil
}

// audience lists a group's offline members for message events: its
// members active within the engine's active window (the tier-2 set) that
// are online on no node (embedded: this node's presence; cluster: the
// Redis presence view, which lags each node by a flush, and this node's).
type audience struct {
	s    *server
	pres *presence.Local[fanout.Conn]
}

func (a *audience) Offline(ctx context.Context, gid int64, dst []string, limit int) ([]string, bool, error) {
	since := time.Now().Add(-a.s.eng.Tuning().ActiveWindow)
	uids, err := a.s.st.ActiveMembersSince(ctx, gid, since)
	if err != nil {
		return dst, false, err
	}
	if a.s.view == nil {
		for _, uid := range uids {
			if !a.pres.UserOnline(uid) {
				if len(dst) == limit {
					return dst, true, nil
				}
				dst = append(dst, uid)
			}
		}
		return dst, false, nil
	}
	for len(uids) > 0 {
		n := min(len(uids), store.DefaultMaxAddMembers)
		ms, _, err := a.s.st.MembersOf(ctx, gid, uids[:n])
		if err != nil {
			return dst, false, err
		}
		uids = uids[n:]
		ords := make([]uint32, len(ms))
		for i, m := range ms {
			ords[i] = m.Ordinal
		}
		online, err := a.s.view.OnlineAnywhere(ctx, gid, ords, nil)
		if err != nil {
			return dst, false, err
		}
		for i, m := range ms {
			// The view lags this node by a flush: its own users count too.
			if !online[i] && !a.pres.UserOnline(m.UID) {
				if len(dst) == limit {
					return dst, true, nil
				}
				dst = append(dst, m.UID)
			}
		}
	}
	return dst, false, nil
}

// drainHooks delivers what the event journal holds for at most
// -hook-events-drain; what is left stays journaled for the next start
// (cluster mode: for the node that takes the delivery lease, at once).
func (s *server) drainHooks() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HookEventsDrain)
	defer cancel()
	if err := s.hooks.stream.Shutdown(ctx); err != nil {
		s.log.Warn("hook events: drain ended with events left in the journal; they are delivered after the next start",
			"drain", s.cfg.HookEventsDrain.String(), "err", err)
	}
	if s.hooks.release != nil {
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		defer rcancel()
		if err := s.hooks.release(rctx); err != nil {
			s.log.Warn("hook events: delivery lease not released; another node takes it after its TTL", "err", err)
		}
	}
}
