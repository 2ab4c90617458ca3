package gateway

// This file holds the member presence feed (docs/architecture.md §7.1):
// once per interval, each group with members online on this node gets its
// online count (and, for small groups, who came online and went offline)
// as one presence frame, encoded once and written to those members through
// the same broadcast as message pushes (docs/protocol.md §4.16).

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
)

// Defaults and bounds of PresenceFeedConfig.
const (
	DefaultPresenceInterval  = 2 * time.Second
	MinPresenceInterval      = 100 * time.Millisecond
	DefaultPresenceListMax   = 1000
	MaxPresenceListMax       = 10000
	DefaultPresenceEventsMax = 200
	DefaultPresenceMaxEvents = 64
	DefaultPresenceSizeTTL   = 30 * time.Second
	DefaultPresenceSizeReads = 256
)

// PresenceIndex is what the feed reads of this node's presence;
// *presence.Local[fanout.Conn] implements it.
type PresenceIndex interface {
	// AppendGroups appends every gid with a member online on this node.
	AppendGroups(dst []int64) []int64
	// OnlineCount returns the members of gid online on this node.
	OnlineCount(gid int64) int
	// AppendConns appends the connections of gid's online members.
	AppendConns(dst []fanout.Conn, gid int64) []fanout.Conn
	// ForEachOnline calls fn for each connection of each online member.
	ForEachOnline(gid int64, fn func(ordinal uint32, conn fanout.Conn) bool)
}

// PresenceCluster is the cluster-wide side of the feed (cluster mode);
// *redispresence.View implements it.
type PresenceCluster interface {
	// Occupancy answers qs in order, appended to dst.
	Occupancy(ctx context.Context, qs []presence.OccupancyQuery, dst []presence.Occupancy) ([]presence.Occupancy, error)
}

// PresenceFeedConfig configures a PresenceFeed. Zero values take the
// defaults above.
type PresenceFeedConfig struct {
	// Index is this node's presence; required.
	Index PresenceIndex
	// Cluster aggregates every node's presence; nil = this node is the
	// cluster (embedded mode).
	Cluster PresenceCluster
	// Store gives group sizes (Group.MemberCount) and memberships (the
	// route); required.
	Store store.Store
	// Levels decides what is pushed per group (docs/architecture.md
	// §7.1); nil = always L0.
	Levels *fanout.Levels
	// Send writes one frame to conns (Chat.SendPresence); nil = nothing
	// is pushed (the route still answers).
	Send func(f *socket.Frame, conns []fanout.Conn)
	// Interval is the feed's period: at most one presence frame per group
	// per Interval, only when something changed. 0 = 2 s.
	Interval time.Duration
	// ListMax: groups of at most this many members are listed (the route
	// answers their online uids; cluster mode keeps their rosters in
	// Redis). 0 = 1000; negative = no group is listed.
	ListMax int
	// EventsMax: groups of at most this many members get joined/left
	// lists in their presence frames; larger ones get counts only. 0 =
	// 200; negative = no events; never above ListMax.
	EventsMax int
	// MaxEvents bounds the uids of one frame's joined and of its left
	// list (past it the frame says more). 0 = 64; at most
	// wire.MaxPresenceEvents.
	MaxEvents int
	// SizeTTL is how long a group's member count is trusted before it is
	// read again. 0 = 30 s.
	SizeTTL time.Duration
	// SizeReads bounds the store reads of group sizes per interval
	// (groups not yet sized get counts only meanwhile). 0 = 256.
	SizeReads int
	// Now is the clock of the frames' ts; nil = time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Validate reports every invalid field.
func (c PresenceFeedConfig) Validate() error {
	var errs []error
	if c.Index == nil || c.Store == nil {
		errs = append(errs, errors.New("gateway: PresenceFeedConfig needs Index and Store"))
	}
	if c.Interval != 0 && c.Interval < MinPresenceInterval {
		errs = append(errs, errors.New("gateway: presence interval must be at least 100ms"))
	}
	if c.ListMax > MaxPresenceListMax {
		errs = append(errs, errors.New("gateway: presence list threshold must be at most 10000"))
	}
	if c.MaxEvents < 0 || c.MaxEvents > wire.MaxPresenceEvents {
		errs = append(errs, errors.New("gateway: presence max events must be in 0..1024"))
	}
	if c.SizeTTL < 0 || c.SizeReads < 0 {
		errs = append(errs, errors.New("gateway: presence size TTL and reads must not be negative"))
	}
	return errors.Join(errs...)
}

func (c *PresenceFeedConfig) fill() {
	if c.Interval == 0 {
		c.Interval = DefaultPresenceInterval
	}
	if c.ListMax == 0 {
		c.ListMax = DefaultPresenceListMax
	}
	if c.EventsMax == 0 {
		c.EventsMax = DefaultPresenceEventsMax
	}
	c.EventsMax = min(c.EventsMax, c.ListMax)
	if c.MaxEvents == 0 {
		c.MaxEvents = DefaultPresenceMaxEvents
	}
	if c.SizeTTL == 0 {
		c.SizeTTL = DefaultPresenceSizeTTL
	}
	if c.SizeReads == 0 {
		c.SizeReads = DefaultPresenceSizeReads
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// PresenceFeed pushes groups' online counts (and small groups' joins and
// leaves) to their online members, coalesced per Interval. Its state is
// owned by the Run goroutine; Occupancy (the route) reads the index and
// the cluster directly.
type PresenceFeed struct {
	cfg PresenceFeedConfig

	groups map[int64]*feedGroup // Run's goroutine only
	round  uint64
	down   bool // the last cluster read failed (logged once per outage)

	// scratch of one round, reused (Run's goroutine only)
	gids    []int64
	conns   []fanout.Conn
	queries []presence.OccupancyQuery
	qgroups []*feedGroup
	// qwithdraw: the query only withdraws this node's roster (its answer
	// is not the group's occupancy).
	qwithdraw []bool
	answers   []presence.Occupancy
	buf       []byte

	stats feedStats
}

type feedStats struct {
	rounds, failures, frames, recipients, bytes, shed, sizeReads atomic.Int64
	lastRoundNs                                                  atomic.Int64
}

// feedGroup is the feed's memory of one group with members online here.
type feedGroup struct {
	gid    int64
	size   int64 // member count; -1 unknown
	sizeAt time.Time
	seen   uint64 // last round the group was active here
	sent   int64  // count in the last frame pushed; -1 none
	// roster is the group's online uids as of the last round (listed
	// groups), the base of the next round's joined/left; rostered says it
	// is a real base (not before the first round listing the group).
	roster   []string
	rostered bool
	// missed: events of a round were not pushed (level L2, or cut at
	// MaxEvents): the next frame says more.
	missed bool
	// local is this node's roster this round; published is what Redis
	// holds for this node (cluster mode).
	local     []string
	published []string
	count     int64 // this round's answer
	answer    []string
}

// NewPresenceFeed returns a feed; call Run.
func NewPresenceFeed(cfg PresenceFeedConfig) (*PresenceFeed, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	return &PresenceFeed{cfg: cfg, groups: map[int64]*feedGroup{}}, nil
}

// Interval returns the feed's period.
func (f *PresenceFeed) Interval() time.Duration { return f.cfg.Interval }

// ListMax returns the largest group size whose members are listed (<= 0:
// none).
func (f *PresenceFeed) ListMax() int { return f.cfg.ListMax }

// Run pushes presence every Interval until ctx is done.
func (f *PresenceFeed) Run(ctx context.Context) error {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			f.withdraw(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
			f.Round(ctx)
		}
	}
}

// withdraw removes this node's rosters from the cluster at shutdown (they
// would otherwise be pruned once the node's bitmaps expired).
func (f *PresenceFeed) withdraw(ctx context.Context) {
	if f.cfg.Cluster == nil {
		return
	}
	qs := f.queries[:0]
	for _, g := range f.groups {
		if len(g.published) > 0 {
			qs = append(qs, presence.OccupancyQuery{GID: g.gid, Roster: true, Publish: true})
		}
	}
	if len(qs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Interval)
	defer cancel()
	if _, err := f.cfg.Cluster.Occupancy(ctx, qs, nil); err != nil {
		f.cfg.Logger.Warn("presence feed: could not withdraw this node's rosters (pruned once its presence expires)", "err", err)
	}
}

// Round runs one interval's work: read every active group's occupancy,
// push a frame to each whose count or roster changed. Run calls it; tests
// and benchmarks call it directly (never concurrently with Run).
func (f *PresenceFeed) Round(ctx context.Context) {
	start := time.Now()
	f.round++
	now := f.cfg.Now()
	f.gids = f.cfg.Index.AppendGroups(f.gids[:0])
	reads := 0
	f.queries, f.qgroups, f.qwithdraw = f.queries[:0], f.qgroups[:0], f.qwithdraw[:0]
	for _, gid := range f.gids {
		g := f.groups[gid]
		if g == nil {
			g = &feedGroup{gid: gid, size: -1, sent: -1}
			f.groups[gid] = g
		}
		g.seen = f.round
		if f.cfg.ListMax > 0 && (g.size < 0 || now.Sub(g.sizeAt) >= f.cfg.SizeTTL) && reads < f.cfg.SizeReads {
			reads++
			if gr, err := f.cfg.Store.Group(ctx, gid); err == nil {
				g.size, g.sizeAt = gr.MemberCount, now
			} else if errors.Is(err, store.ErrGroupNotFound) {
				g.size, g.sizeAt = 0, now
			}
		}
		listed := f.listed(g.size)
		g.local = g.local[:0]
		if listed {
			g.local = f.localRoster(g.local, gid)
			g.count = int64(len(g.local))
		} else {
			g.count = int64(f.cfg.Index.OnlineCount(gid))
		}
		if f.cfg.Cluster != nil {
			q := presence.OccupancyQuery{GID: gid, Roster: listed}
			if listed && !slices.Equal(g.local, g.published) {
				q.Publish, q.UIDs = true, g.local
			}
			if !listed && len(g.published) > 0 {
				// The group grew past ListMax: withdraw its roster.
				f.queries = append(f.queries, presence.OccupancyQuery{GID: gid, Roster: true, Publish: true})
				f.qgroups = append(f.qgroups, g)
				f.qwithdraw = append(f.qwithdraw, true)
			}
			f.queries = append(f.queries, q)
			f.qgroups = append(f.qgroups, g)
			f.qwithdraw = append(f.qwithdraw, false)
		} else if listed {
			g.answer = append(g.answer[:0], g.local...)
		}
	}
	f.stats.sizeReads.Add(int64(reads))
	// Groups gone from this node: withdraw their rosters, forget them.
	for gid, g := range f.groups {
		if g.seen == f.round {
			continue
		}
		if f.cfg.Cluster != nil && len(g.published) > 0 {
			f.queries = append(f.queries, presence.OccupancyQuery{GID: gid, Roster: true, Publish: true})
			f.qgroups = append(f.qgroups, g)
			f.qwithdraw = append(f.qwithdraw, true)
			continue // forgotten once the withdrawal succeeded
		}
		delete(f.groups, gid)
	}
	if f.cfg.Cluster != nil && len(f.queries) > 0 {
		cctx, cancel := context.WithTimeout(ctx, f.cfg.Interval)
		var err error
		f.answers, err = f.cfg.Cluster.Occupancy(cctx, f.queries, f.answers[:0])
		cancel()
		if err != nil {
			// The counts are unknown this round: push nothing rather than
			// node-local counts that would jump back once Redis answers.
			f.stats.failures.Add(1)
			f.stats.rounds.Add(1)
			if !f.down { // once per outage, not once per round
				f.down = true
				f.cfg.Logger.Warn("presence feed: cluster occupancy unavailable, no presence pushed until Redis answers", "err", err)
			}
			return
		}
		if f.down {
			f.down = false
			f.cfg.Logger.Info("presence feed: cluster occupancy available again")
		}
		for i, q := range f.queries {
			g := f.qgroups[i]
			if q.Publish {
				g.published = append(g.published[:0], q.UIDs...)
			}
			if f.qwithdraw[i] {
				if g.seen != f.round {
					delete(f.groups, g.gid)
				}
				continue
			}
			a := &f.answers[i]
			if q.Roster {
				// This node's own members count even before Redis shows
				// them (its bitmaps are published on their own schedule).
				g.answer = mergeSorted(g.answer[:0], a.UIDs, g.local)
				g.count = int64(len(g.answer))
			} else {
				g.count = max(a.Count, g.count)
			}
		}
	}
	for _, gid := range f.gids {
		f.push(f.groups[gid], now)
	}
	f.stats.rounds.Add(1)
	f.stats.lastRoundNs.Store(int64(time.Since(start)))
}

func (f *PresenceFeed) listed(size int64) bool {
	return f.cfg.ListMax > 0 && size >= 0 && size <= int64(f.cfg.ListMax)
}

// push sends g's frame when its count or roster changed, at what its level
// allows (docs/architecture.md §7.1): L0 and L1 counts and events, L2
// counts only, L3 and L4 nothing.
func (f *PresenceFeed) push(g *feedGroup, now time.Time) {
	level := fanout.L0Normal
	if f.cfg.Levels != nil {
		level = f.cfg.Levels.Effective(g.gid)
	}
	events := f.listed(g.size) && g.size <= int64(f.cfg.EventsMax) && f.cfg.EventsMax > 0
	var joined, left []string
	if events && g.rostered {
		joined, left = diffSorted(g.roster, g.answer)
	}
	if events {
		g.roster = append(g.roster[:0], g.answer...)
		g.rostered = true
	} else {
		g.roster, g.rostered = g.roster[:0], false
	}
	if level >= fanout.L3WriteOnly {
		if len(joined)+len(left) > 0 {
			g.missed = true
		}
		if g.count != g.sent || len(joined)+len(left) > 0 {
			f.stats.shed.Add(1)
		}
		return
	}
	if level >= fanout.L2Summary && len(joined)+len(left) > 0 {
		joined, left, g.missed = nil, nil, true
	}
	if g.count == g.sent && len(joined)+len(left) == 0 {
		return
	}
	p := wire.Presence{GID: g.gid, Online: g.count, TS: now.UnixMilli(), More: g.missed}
	g.missed = false
	if len(joined) > f.cfg.MaxEvents || len(left) > f.cfg.MaxEvents {
		p.More = true
	}
	p.Joined, p.Left = joined[:min(len(joined), f.cfg.MaxEvents)], left[:min(len(left), f.cfg.MaxEvents)]
	g.sent = g.count
	if f.cfg.Send == nil {
		return
	}
	f.conns = f.cfg.Index.AppendConns(f.conns[:0], g.gid)
	if len(f.conns) == 0 {
		return
	}
	f.buf = wire.AppendPresence(f.buf[:0], &p)
	fr := socket.NewTextFrame(f.buf)
	f.cfg.Send(fr, f.conns)
	clear(f.conns)
	f.stats.frames.Add(1)
	f.stats.recipients.Add(int64(len(f.conns)))
	f.stats.bytes.Add(int64(fr.Len()) * int64(len(f.conns)))
}

// localRoster appends the distinct uids of gid's members online here,
// sorted.
func (f *PresenceFeed) localRoster(dst []string, gid int64) []string {
	start := len(dst)
	f.cfg.Index.ForEachOnline(gid, func(_ uint32, c fanout.Conn) bool {
		dst = append(dst, c.UID())
		return true
	})
	slices.Sort(dst[start:])
	return slices.Compact(dst)
}

// Occupancy answers the route: gid's online count and, when the group has
// at most ListMax members (size), its online uids, sorted; now from the
// index and, in cluster mode, one call to the cluster.
func (f *PresenceFeed) Occupancy(ctx context.Context, gid, size int64) (count int64, uids []string, listed bool, err error) {
	listed = f.listed(size)
	var local []string
	if listed {
		local = f.localRoster(nil, gid)
	}
	if f.cfg.Cluster == nil {
		if listed {
			return int64(len(local)), local, true, nil
		}
		return int64(f.cfg.Index.OnlineCount(gid)), nil, false, nil
	}
	as, err := f.cfg.Cluster.Occupancy(ctx, []presence.OccupancyQuery{{GID: gid, Roster: listed}}, nil)
	if err != nil {
		return 0, nil, listed, err
	}
	if listed {
		uids = mergeSorted(nil, as[0].UIDs, local)
		return int64(len(uids)), uids, true, nil
	}
	return max(as[0].Count, int64(f.cfg.Index.OnlineCount(gid))), nil, false, nil
}

// mergeSorted appends the union of sorted a and b, each without
// duplicates, to dst.
func mergeSorted(dst, a, b []string) []string {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] < b[j]:
			dst = append(dst, a[i])
			i++
		case a[i] > b[j]:
			dst = append(dst, b[j])
			j++
		default:
			dst = append(dst, a[i])
			i++
			j++
		}
	}
	dst = append(dst, a[i:]...)
	return append(dst, b[j:]...)
}

// diffSorted returns the elements of sorted next missing from prev
// (joined) and those of prev missing from next (left).
func diffSorted(prev, next []string) (joined, left []string) {
	i, j := 0, 0
	for i < len(prev) && j < len(next) {
		switch {
		case prev[i] < next[j]:
			left = append(left, prev[i])
			i++
		case prev[i] > next[j]:
			joined = append(joined, next[j])
			j++
		default:
			i++
			j++
		}
	}
	left = append(left, prev[i:]...)
	joined = append(joined, next[j:]...)
	return joined, left
}

// PresenceFeedStats are the feed's counters.
type PresenceFeedStats struct {
	Rounds, Failures, Frames, Recipients, Bytes, Shed, SizeReads int64
	LastRound                                                    time.Duration
}

// Stats returns the feed's counters.
func (f *PresenceFeed) Stats() PresenceFeedStats {
	s := &f.stats
	return PresenceFeedStats{Rounds: s.rounds.Load(), Failures: s.failures.Load(), Frames: s.frames.Load(),
		Recipients: s.recipients.Load(), Bytes: s.bytes.Load(), Shed: s.shed.Load(), SizeReads: s.sizeReads.Load(),
		LastRound: time.Duration(s.lastRoundNs.Load())}
}

// PresenceFeedCollector exports the feed's counters.
func PresenceFeedCollector(f *PresenceFeed) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("fanfare_presence_feed_"+name, help, nil, nil)
	}
	descs := []*prometheus.Desc{
		d("rounds_total", "Rounds of the member presence feed (one per -presence-interval)."),
		d("failures_total", "Rounds that pushed nothing because the cluster occupancy could not be read."),
		d("frames_total", "Presence frames encoded (one per group per round with a change)."),
		d("recipients_total", "Connections handed a presence frame."),
		d("bytes_total", "Presence frame bytes handed to connections (frame size x recipients)."),
		d("shed_total", "Group changes not pushed because the group's level was L3 or L4."),
		d("round_seconds", "Duration of the last round."),
	}
	return &statsCollector{descs: descs, collect: func(ch chan<- prometheus.Metric, ds []*prometheus.Desc) {
		s := f.Stats()
		c := prometheus.CounterValue
		for i, v := range []int64{s.Rounds, s.Failures, s.Frames, s.Recipients, s.Bytes, s.Shed} {
			ch <- prometheus.MustNewConstMetric(ds[i], c, float64(v))
		}
		ch <- prometheus.MustNewConstMetric(ds[6], prometheus.GaugeValue, s.LastRound.Seconds())
	}}
}

// SendPresence writes f to conns: sockets through the socket layer's
// broadcast (the write path of pushes), event streams through their
// queues; the same bytes for every recipient. The frame carries no group
// seq, so a connection or stream over its outbound bound drops it without
// a resync (docs/protocol.md §4.16).
func (ch *Chat) SendPresence(f *socket.Frame, conns []fanout.Conn) {
	sc := scratchPool.Get().(*pushScratch)
	defer sc.release()
	sc.split(conns)
	if ch.srv != nil && len(sc.conns) > 0 {
		ch.srv.Broadcast(f, sc.conns)
	}
	if ch.events != nil && len(sc.streams) > 0 {
		frames := [1]*socket.Frame{f}
		ch.events.deliver(frames[:], sc.streams)
	}
}
