package redisroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// Config configures the Redis backend.
type Config struct {
	// Client is the Redis (or Redis Cluster) client. Required.
	Client redis.UniversalClient
	// Prefix is prepended to every key and channel. "" means "fanfare:".
	// Tests use a random prefix each.
	Prefix string
	// MemoryHighRatio is the share of maxmemory (or MemoryLimit) above which
	// Health reports MemoryHigh (room degradation L1). 0 means 0.8.
	MemoryHighRatio float64
	// MemoryLimit in bytes is used when Redis has no maxmemory. 0 = none.
	MemoryLimit int64
	// NoPublish stops admission steps from publishing the admitted uids on
	// the room's channel (WatchAdmissions then sees nothing).
	NoPublish bool
	// EnterBatch is the most users one enter script call carries: the
	// Enters of a room that arrive while EnterInFlight calls of it are
	// under way go together in the next call (one after another inside
	// it, as that many calls would). 0 means 64; 1 sends every Enter alone.
	EnterBatch int
	// EnterInFlight is the most enter script calls of one room under way
	// at once. 0 means 4.
	EnterInFlight int
}

// Batch defaults (Config.EnterBatch, Config.EnterInFlight) and bounds.
const (
	DefaultEnterBatch    = 64
	DefaultEnterInFlight = 4
	MaxEnterBatch        = 1024
	MaxEnterInFlight     = 64
)

// Backend is the Redis implementation of waitroom.Backend: every operation
// is one Lua script on the room's keys, which share the hash tag
// {room:<name>} and so one cluster slot.
type Backend struct {
	c      redis.UniversalClient
	prefix string
	cfg    Config
	enters *enterQueue
}

var _ waitroom.Backend = (*Backend)(nil)

// New returns a Redis backend. It does not contact Redis.
func New(cfg Config) (*Backend, error) {
	if cfg.Client == nil {
		return nil, errors.New("redisroom: Config.Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "fanfare:"
	}
	if cfg.MemoryHighRatio == 0 {
		cfg.MemoryHighRatio = 0.8
	}
	if !(cfg.MemoryHighRatio > 0 && cfg.MemoryHighRatio <= 1) {
		return nil, fmt.Errorf("redisroom: MemoryHighRatio %v out of range (0, 1]", cfg.MemoryHighRatio)
	}
	if cfg.EnterBatch == 0 {
		cfg.EnterBatch = DefaultEnterBatch
	}
	if cfg.EnterInFlight == 0 {
		cfg.EnterInFlight = DefaultEnterInFlight
	}
	if cfg.EnterBatch < 1 || cfg.EnterBatch > MaxEnterBatch {
		return nil, fmt.Errorf("redisroom: EnterBatch %d out of range 1..%d", cfg.EnterBatch, MaxEnterBatch)
	}
	if cfg.EnterInFlight < 1 || cfg.EnterInFlight > MaxEnterInFlight {
		return nil, fmt.Errorf("redisroom: EnterInFlight %d out of range 1..%d", cfg.EnterInFlight, MaxEnterInFlight)
	}
	return &Backend{c: cfg.Client, prefix: cfg.Prefix, cfg: cfg, enters: newEnterQueue(cfg.EnterBatch, cfg.EnterInFlight)}, nil
}

// base is the key prefix of a room: every key of one room carries the hash
// tag {room:<name>}, so a room lives in one cluster slot and its scripts
// may touch all of its keys, the K queue shards included.
func (b *Backend) base(room string) string { return b.prefix + "{room:" + room + "}:" }

func (b *Backend) keys(cfg *waitroom.RoomConfig) []string {
	return roomKeys(b.base(cfg.Name), cfg.Shards)
}

// roomKeys is the KEYS list of a room with base p and the given number of
// queue shards (the layout is in scripts.go).
func roomKeys(p string, shards int) []string {
	ks := make([]string, 0, 9+shards)
	ks = append(ks, p+"e", p+"j", p+"aw", p+"a", p+"sm", p+"st", p+"r", p+"pl", p+"qv")
	for i := range shards {
		ks = append(ks, p+"q"+strconv.Itoa(i))
	}
	return ks
}

// Channel is the pub/sub channel on which a room's admission steps publish.
func (b *Backend) Channel(room string) string { return b.base(room) + "adm" }

func (b *Backend) configKey() string { return b.prefix + "{rooms}:cfg" }

func ff(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// secs0 is t in Unix seconds, "0" (meaning now to the script) when zero.
func secs0(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.Unix(), 10)
}

func secs(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) }

// args is ARGV 1-22: the configuration every script reads (18-22: the
// max-wait guarantee's Capacity, VIPReserve and GuaranteeRate, computed
// here once for both backends, and the schedule in Unix seconds).
func args(cfg *waitroom.RoomConfig, extra ...any) []any {
	smooth := "-1"
	if !cfg.ImmediateInsertion() {
		smooth = ff(math.Floor(cfg.Smoothing.Seconds()))
	}
	open := "0"
	if cfg.State == waitroom.StateOpen {
		open = "1"
	}
	share := "0"
	if cfg.QuotaOn() {
		share = ff(cfg.VIPAdmitShare)
	}
	a := make([]any, 0, 22+len(extra))
	a = append(a,
		strconv.Itoa(cfg.MaxActive), ff(cfg.AdmitRate), ff(cfg.AdmitBurst),
		secs(cfg.MaxWait), secs(cfg.Grace), secs(cfg.HardTimeout), ff(cfg.DecayRate),
		ff(cfg.VIPShareCap), smooth, ff(cfg.TargetWait.Seconds()), ff(cfg.SafetyFactor),
		secs(cfg.AccessTokenTTL), open, ff(cfg.Bias(1)), ff(cfg.Bias(2)), ff(cfg.Bias(3)),
		share, strconv.FormatInt(waitroom.Capacity(cfg), 10), strconv.FormatInt(waitroom.VIPReserve(cfg), 10),
		ff(waitroom.GuaranteeRate(cfg)), strconv.FormatInt(cfg.StartS(), 10), strconv.FormatInt(cfg.EndS(), 10))
	return append(a, extra...)
}

func unix(s int64) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(s, 0)
}

// decodeEntry parses an entry "level|state|join|first|bias|score|away|
// admitted|expires|shard|seq|node" (scripts.go; entries written before the
// seq have none: "...|shard|node"). node lists the nodes holding the user,
// the latest first; Entry.Node is that one. It splits by hand: the
// regular expression it replaces was a tenth of a node's CPU while
// entering users into a 1M room.
func decodeEntry(uid, s string) (waitroom.Entry, error) {
	var f [11]string
	rest := s
	for i := range 10 {
		j := strings.IndexByte(rest, '|')
		if j < 0 {
			return waitroom.Entry{}, fmt.Errorf("redisroom: bad entry %q for %q", s, uid)
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	if j := strings.IndexByte(rest, '|'); j >= 0 { // the seq
		if _, err := strconv.ParseUint(rest[:j], 10, 63); err != nil {
			return waitroom.Entry{}, fmt.Errorf("redisroom: bad entry %q for %q", s, uid)
		}
		rest = rest[j+1:]
	}
	f[10], _, _ = strings.Cut(rest, ",")
	var n [11]int64
	for _, i := range []int{0, 2, 3, 6, 7, 8, 9} {
		v, err := strconv.ParseUint(f[i], 10, 63)
		if err != nil {
			return waitroom.Entry{}, fmt.Errorf("redisroom: bad entry %q for %q", s, uid)
		}
		n[i] = int64(v)
	}
	bias, err1 := strconv.ParseFloat(f[4], 64)
	score, err2 := strconv.ParseFloat(f[5], 64)
	if err1 != nil || err2 != nil || len(f[1]) != 1 || !strings.Contains("waxp", f[1]) {
		return waitroom.Entry{}, fmt.Errorf("redisroom: bad entry %q for %q", s, uid)
	}
	e := waitroom.Entry{UID: uid, Tier: int(n[0]), Join: unix(n[2]), First: unix(n[3]), Bias: bias, Score: score,
		Admitted: unix(n[7]), Expires: unix(n[8]), Node: f[10]}
	e.State = stateOf(f[1])
	switch e.State {
	case waitroom.EntryAway:
		e.AwaySince = unix(n[6])
	case waitroom.EntryWaiting, waitroom.EntryActive:
		e.Back = unix(n[6]) // the away field of a waiting entry: back since
	}
	return e, nil
}

func stateOf(letter string) waitroom.EntryState {
	switch letter {
	case "w":
		return waitroom.EntryWaiting
	case "a":
		return waitroom.EntryAway
	case "x":
		return waitroom.EntryActive
	case "p":
		return waitroom.EntryScheduled
	}
	return waitroom.EntryNone
}

// reply helpers: scripts return nested arrays of int64, string and nil.
func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return 0
}

func toStr(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

func toSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func (b *Backend) sessionEnd(room, uid, raw string, reason waitroom.EndReason, now int64) (*waitroom.SessionEnd, error) {
	e, err := decodeEntry(uid, raw)
	if err != nil {
		return nil, err
	}
	return &waitroom.SessionEnd{Room: room, UID: uid, Tier: e.Tier, Reason: reason,
		First: e.First, Admitted: e.Admitted, Ended: unix(now)}, nil
}

// wrap classifies err: failures to reach or use Redis (network, timeouts,
// LOADING, BUSY, cluster down, OOM...) wrap waitroom.ErrUnavailable so the
// Manager may fall back; other server replies are plain errors. A
// cancelled context is returned as is.
func wrap(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, redis.ErrClosed) {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "OOM", "READONLY", "NOREPLICAS"} {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("redisroom: %w: %w", waitroom.ErrUnavailable, err)
			}
		}
		return fmt.Errorf("redisroom: %w", err)
	}
	return fmt.Errorf("redisroom: %w: %w", waitroom.ErrUnavailable, err)
}

func run(ctx context.Context, b *Backend, s *redis.Script, cfg *waitroom.RoomConfig, extra ...any) ([]any, error) {
	v, err := s.Run(ctx, b.c, b.keys(cfg), args(cfg, extra...)...).Result()
	if err != nil {
		return nil, wrap(ctx, err)
	}
	r, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("redisroom: unexpected script reply %T", v)
	}
	return r, nil
}

// Enter implements waitroom.Backend.
func (b *Backend) Enter(ctx context.Context, cfg *waitroom.RoomConfig, req waitroom.EnterRequest) (waitroom.EnterResult, error) {
	if !waitroom.ValidNode(req.Node) {
		return waitroom.EnterResult{}, fmt.Errorf("redisroom: bad node name %q", req.Node)
	}
	level := min(max(req.Tier, 0), waitroom.MaxTier)
	mode, join, first, bias, admitted, expires := "", "0", "0", "0", "0", "0"
	if rs := req.Restore; rs != nil {
		mode = "w"
		if rs.Active {
			mode = "x"
			admitted, expires = secs0(rs.Admitted), secs0(rs.Expires)
		}
		join, bias = secs0(rs.Join), strconv.FormatFloat(rs.Bias, 'f', 3, 64)
		if !rs.First.IsZero() {
			first = strconv.FormatInt(rs.First.Unix(), 10)
		}
	}
	r, err := b.enters.enter(ctx, b, cfg, []any{req.UID, strconv.Itoa(level),
		strconv.Itoa(waitroom.ShardOf(req.UID, cfg.Shards)), mode, join, first, bias, admitted, expires, req.Node,
		strconv.FormatFloat(waitroom.ShuffleKey(), 'g', 17, 64)})
	if err != nil {
		return waitroom.EnterResult{}, err
	}
	if len(r) != 12 {
		return waitroom.EnterResult{}, fmt.Errorf("redisroom: enter reply has %d fields", len(r))
	}
	now := toInt(r[7])
	res := waitroom.EnterResult{Status: waitroom.EnterStatus(toInt(r[0])), Ahead: toInt(r[3]), Waiting: toInt(r[4]),
		PlacementSeq: toInt(r[6]), PreQueue: toInt(r[10]), Now: unix(now)}
	if s, _ := toStr(r[1]); s != "" {
		res.Reject = waitroom.RejectReason(s)
		if res.Reject == waitroom.RejectRoomFull {
			if short := toInt(r[11]); short > 0 {
				res.RetryAfter = waitroom.FullRetry(cfg, short)
			} else {
				res.RetryAfter = waitroom.RetryAfter(cfg, res.Waiting, toInt(r[8]), toFloat(r[9]))
			}
		}
	}
	if s, _ := toStr(r[2]); s != "" {
		if res.Entry, err = decodeEntry(req.UID, s); err != nil {
			return res, err
		}
	}
	if ended := toSlice(r[5]); len(ended) == 2 {
		raw, _ := toStr(ended[1])
		if res.Ended, err = b.sessionEnd(cfg.Name, req.UID, raw, waitroom.EndExpired, now); err != nil {
			return res, err
		}
	}
	return res, nil
}

func (b *Backend) depart(ctx context.Context, cfg *waitroom.RoomConfig, uid, node string, reason waitroom.EndReason) (waitroom.Departure, error) {
	op := "disconnect"
	if reason == waitroom.EndLeave {
		op = "leave"
	}
	r, err := run(ctx, b, departScript, cfg, uid, op, node)
	if err != nil {
		return waitroom.Departure{}, err
	}
	if len(r) != 4 {
		return waitroom.Departure{}, fmt.Errorf("redisroom: depart reply has %d fields", len(r))
	}
	prev, _ := toStr(r[0])
	now := toInt(r[2])
	d := waitroom.Departure{Prev: stateOf(prev), Now: unix(now), Held: toInt(r[3]) == 1}
	if raw, ok := toStr(r[1]); ok {
		if d.Ended, err = b.sessionEnd(cfg.Name, uid, raw, reason, now); err != nil {
			return d, err
		}
	}
	return d, nil
}

// Disconnect implements waitroom.Backend.
func (b *Backend) Disconnect(ctx context.Context, cfg *waitroom.RoomConfig, uid, node string) (waitroom.Departure, error) {
	if !waitroom.ValidNode(node) {
		return waitroom.Departure{}, fmt.Errorf("redisroom: bad node name %q", node)
	}
	return b.depart(ctx, cfg, uid, node, waitroom.EndDisconnect)
}

// Holds implements waitroom.Backend: the node's set (<base>n:<node>).
func (b *Backend) Holds(ctx context.Context, cfg *waitroom.RoomConfig, node string) ([]string, error) {
	if node == "" || !waitroom.ValidNode(node) {
		return nil, fmt.Errorf("redisroom: bad node name %q", node)
	}
	uids, err := b.c.SMembers(ctx, b.base(cfg.Name)+"n:"+node).Result()
	if err != nil {
		return nil, err
	}
	sort.Strings(uids)
	return uids, nil
}

// Leave implements waitroom.Backend.
func (b *Backend) Leave(ctx context.Context, cfg *waitroom.RoomConfig, uid string) (waitroom.Departure, error) {
	return b.depart(ctx, cfg, uid, "", waitroom.EndLeave)
}

// Admit implements waitroom.Backend.
func (b *Backend) Admit(ctx context.Context, cfg *waitroom.RoomConfig, req waitroom.AdmitRequest) (waitroom.AdmitResult, error) {
	channel := ""
	if !b.cfg.NoPublish {
		channel = b.Channel(cfg.Name)
	}
	r, err := run(ctx, b, admitScript, cfg, strconv.Itoa(max(req.Max, 0)), channel)
	if err != nil {
		return waitroom.AdmitResult{}, err
	}
	if len(r) != 3 {
		return waitroom.AdmitResult{}, fmt.Errorf("redisroom: admit reply has %d fields", len(r))
	}
	res := waitroom.AdmitResult{Tokens: toFloat(r[0]), Now: unix(toInt(r[1]))}
	for _, a := range toSlice(r[2]) {
		f := toSlice(a)
		if len(f) != 4 {
			return res, errors.New("redisroom: bad admission reply")
		}
		uid, _ := toStr(f[0])
		raw, _ := toStr(f[1])
		e, err := decodeEntry(uid, raw)
		if err != nil {
			return res, err
		}
		res.Admitted = append(res.Admitted, waitroom.Admission{UID: uid, Tier: e.Tier, Join: e.Join, First: e.First,
			Admitted: e.Admitted, Expires: e.Expires, Back: e.Back, Overdue: toInt(f[2]) == 1, Late: toInt(f[3]) == 1})
	}
	return res, nil
}

// Maintain implements waitroom.Backend.
func (b *Backend) Maintain(ctx context.Context, cfg *waitroom.RoomConfig, req waitroom.MaintainRequest) (waitroom.MaintainResult, error) {
	if !waitroom.ValidNode(req.Node) {
		return waitroom.MaintainResult{}, fmt.Errorf("redisroom: bad node name %q", req.Node)
	}
	r, err := run(ctx, b, maintainScript, cfg, req.Node, secs(req.NodeTimeout))
	if err != nil {
		return waitroom.MaintainResult{}, err
	}
	if len(r) != 7 {
		return waitroom.MaintainResult{}, fmt.Errorf("redisroom: maintain reply has %d fields", len(r))
	}
	now := toInt(r[0])
	res := waitroom.MaintainResult{Now: unix(now), Stepped: int(toInt(r[3])), Rate: toFloat(r[4]), LMax: toInt(r[5]),
		Orphans: int(toInt(r[6]))}
	for _, x := range toSlice(r[1]) {
		f := toSlice(x)
		uid, _ := toStr(f[0])
		raw, _ := toStr(f[1])
		reason, _ := toStr(f[2])
		end, err := b.sessionEnd(cfg.Name, uid, raw, waitroom.EndReason(reason), now)
		if err != nil {
			return res, err
		}
		res.Ended = append(res.Ended, *end)
	}
	for _, x := range toSlice(r[2]) {
		uid, _ := toStr(x)
		res.Dropped = append(res.Dropped, uid)
	}
	return res, nil
}

// snapshotBatch bounds the uids per snapshot script call, so one call
// blocks Redis for a few milliseconds at most.
const snapshotBatch = 500

// Snapshot implements waitroom.Backend. Large uid lists are split into
// several script calls; the stats come from the last one.
func (b *Backend) Snapshot(ctx context.Context, cfg *waitroom.RoomConfig, uids []string, since int64) (waitroom.Snapshot, error) {
	var s waitroom.Snapshot
	s.Positions = make([]waitroom.Position, 0, len(uids))
	for start := 0; ; start += snapshotBatch {
		end := min(start+snapshotBatch, len(uids))
		extra := make([]any, 0, end-start+1)
		extra = append(extra, strconv.FormatInt(since, 10))
		for _, u := range uids[start:end] {
			extra = append(extra, u)
		}
		r, err := run(ctx, b, snapshotScript, cfg, extra...)
		if err != nil {
			return waitroom.Snapshot{}, err
		}
		if len(r) != 17 {
			return waitroom.Snapshot{}, fmt.Errorf("redisroom: snapshot reply has %d fields", len(r))
		}
		now := toInt(r[0])
		s.Now = unix(now)
		s.Waiting, s.Away, s.Active, s.VIPWaiting, s.Overdue = toInt(r[1]), toInt(r[2]), toInt(r[3]), toInt(r[4]), toInt(r[5])
		s.Admitted5m = toInt(r[6])
		s.Rate = waitroom.RateOf(s.Admitted5m, toInt(r[7]), now)
		s.LMax = toInt(r[8])
		s.PreQueue, s.MaxWaitViolations, s.Owed = toInt(r[13]), toInt(r[14]), toInt(r[15])
		s.Capacity, s.MinSlack = waitroom.Capacity(cfg), math.MaxInt64
		if ms, ok := toStr(r[16]); ok && ms != "" {
			s.MinSlack, _ = strconv.ParseInt(ms, 10, 64)
		}
		for i, n := range toSlice(r[12]) {
			if i <= waitroom.MaxTier {
				s.WaitingByTier[i] = toInt(n)
			}
		}
		for i, x := range toSlice(r[9]) {
			f := toSlice(x)
			uid := uids[start+i]
			p := waitroom.Position{Entry: waitroom.Entry{UID: uid}}
			if raw, ok := toStr(f[0]); ok {
				if p.Entry, err = decodeEntry(uid, raw); err != nil {
					return s, err
				}
				p.Ahead = toInt(f[1])
			}
			s.Positions = append(s.Positions, p)
		}
		s.PlacementSeq = toInt(r[11])
		pl := toSlice(r[10])
		s.Placements = s.Placements[:0]
		for i := len(pl) - 1; i >= 0; i-- {
			str, _ := toStr(pl[i])
			f := strings.Split(str, "|")
			if len(f) != 4 {
				continue
			}
			seq, _ := strconv.ParseInt(f[0], 10, 64)
			at, _ := strconv.ParseInt(f[1], 10, 64)
			lo, _ := strconv.ParseFloat(f[2], 64)
			hi := math.Inf(1)
			if f[3] != "inf" {
				hi, _ = strconv.ParseFloat(f[3], 64)
			}
			s.Placements = append(s.Placements, waitroom.Placement{Seq: seq, At: unix(at), Lo: lo, Hi: hi})
		}
		if end >= len(uids) {
			return s, nil
		}
	}
}

// Trim implements waitroom.Backend.
func (b *Backend) Trim(ctx context.Context, cfg *waitroom.RoomConfig) (int, error) {
	v, err := trimScript.Run(ctx, b.c, b.keys(cfg), args(cfg)...).Int()
	if err != nil {
		return 0, wrap(ctx, err)
	}
	return v, nil
}

// storedConfig is the JSON form of a RoomConfig in Redis.
type storedConfig struct {
	Name           string           `json:"room"`
	State          string           `json:"state"`
	MaxActive      int              `json:"max_active"`
	AdmitRate      float64          `json:"admit_rate"`
	AdmitBurst     float64          `json:"admit_burst"`
	MaxWait        time.Duration    `json:"max_wait_ns"`
	Grace          time.Duration    `json:"grace_ns"`
	HardTimeout    time.Duration    `json:"hard_timeout_ns"`
	DecayRate      float64          `json:"decay_rate"`
	VIPBias        map[string]int64 `json:"vip_bias_ns"`
	VIPShareCap    float64          `json:"vip_share_cap"`
	Smoothing      time.Duration    `json:"smoothing_ns"`
	TargetWait     time.Duration    `json:"target_wait_ns"`
	SafetyFactor   float64          `json:"safety_factor"`
	Shards         int              `json:"shards"`
	AccessTokenTTL time.Duration    `json:"access_token_ttl_ns"`
	VIPAdmitShare  float64          `json:"vip_admit_share,omitempty"`
	Site           *waitroom.Site   `json:"site,omitempty"`
	StartsAt       int64            `json:"starts_at,omitempty"` // Unix seconds
	EndsAt         int64            `json:"ends_at,omitempty"`
}

// SaveConfig implements waitroom.Backend.
func (b *Backend) SaveConfig(ctx context.Context, cfg waitroom.RoomConfig) error {
	cfg = cfg.WithDefaults()
	sc := storedConfig{Name: cfg.Name, State: string(cfg.State), MaxActive: cfg.MaxActive, AdmitRate: cfg.AdmitRate,
		AdmitBurst: cfg.AdmitBurst, MaxWait: cfg.MaxWait, Grace: cfg.Grace, HardTimeout: cfg.HardTimeout,
		DecayRate: cfg.DecayRate, VIPBias: make(map[string]int64), VIPShareCap: cfg.VIPShareCap,
		Smoothing: cfg.Smoothing, TargetWait: cfg.TargetWait, SafetyFactor: cfg.SafetyFactor, Shards: cfg.Shards,
		AccessTokenTTL: cfg.AccessTokenTTL, VIPAdmitShare: cfg.VIPAdmitShare, Site: cfg.Site,
		StartsAt: cfg.StartS(), EndsAt: cfg.EndS()}
	for l, d := range cfg.VIPBias {
		sc.VIPBias[strconv.Itoa(l)] = int64(d)
	}
	js, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	if err := b.c.HSet(ctx, b.configKey(), cfg.Name, js).Err(); err != nil {
		return wrap(ctx, err)
	}
	return nil
}

// LoadConfigs implements waitroom.Backend.
func (b *Backend) LoadConfigs(ctx context.Context) ([]waitroom.RoomConfig, error) {
	all, err := b.c.HGetAll(ctx, b.configKey()).Result()
	if err != nil {
		return nil, wrap(ctx, err)
	}
	out := make([]waitroom.RoomConfig, 0, len(all))
	for name, js := range all {
		var sc storedConfig
		if err := json.Unmarshal([]byte(js), &sc); err != nil {
			return nil, fmt.Errorf("redisroom: config of room %q: %w", name, err)
		}
		c := waitroom.RoomConfig{Name: sc.Name, State: waitroom.RoomState(sc.State), MaxActive: sc.MaxActive,
			AdmitRate: sc.AdmitRate, AdmitBurst: sc.AdmitBurst, MaxWait: sc.MaxWait, Grace: sc.Grace,
			HardTimeout: sc.HardTimeout, DecayRate: sc.DecayRate, VIPBias: make(map[int]time.Duration),
			VIPShareCap: sc.VIPShareCap, Smoothing: sc.Smoothing, TargetWait: sc.TargetWait,
			SafetyFactor: sc.SafetyFactor, Shards: sc.Shards, AccessTokenTTL: sc.AccessTokenTTL,
			VIPAdmitShare: sc.VIPAdmitShare, Site: sc.Site,
			StartsAt: unix(sc.StartsAt), EndsAt: unix(sc.EndsAt)}
		for l, d := range sc.VIPBias {
			n, _ := strconv.Atoi(l)
			c.VIPBias[n] = time.Duration(d)
		}
		out = append(out, c.WithDefaults())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteRoom implements waitroom.Backend.
func (b *Backend) DeleteRoom(ctx context.Context, name string) error {
	p := b.base(name)
	ks := roomKeys(p, waitroom.MaxShards)
	nodes, err := b.c.HKeys(ctx, p+"nodes").Result()
	if err != nil {
		return wrap(ctx, err)
	}
	ks = append(ks, p+"nodes", p+"sl", p+"pq", p+"qn", p+"jv")
	for _, n := range nodes {
		ks = append(ks, p+"n:"+n)
	}
	if err := b.c.Del(ctx, ks...).Err(); err != nil {
		return wrap(ctx, err)
	}
	if err := b.c.HDel(ctx, b.configKey(), name).Err(); err != nil {
		return wrap(ctx, err)
	}
	return nil
}

// Health implements waitroom.Backend: INFO memory against maxmemory (or
// Config.MemoryLimit), and the latency of the INFO round trip.
func (b *Backend) Health(ctx context.Context) (waitroom.Health, error) {
	start := time.Now()
	info, err := b.c.Info(ctx, "memory").Result()
	if err != nil {
		return waitroom.Health{}, wrap(ctx, err)
	}
	h := waitroom.Health{Latency: time.Since(start)}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			h.MemoryUsed, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory":
			h.MemoryLimit, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if h.MemoryLimit == 0 {
		h.MemoryLimit = b.cfg.MemoryLimit
	}
	h.MemoryHigh = h.MemoryLimit > 0 && float64(h.MemoryUsed) > b.cfg.MemoryHighRatio*float64(h.MemoryLimit)
	return h, nil
}

var _ waitroom.AdmissionWatcher = (*Backend)(nil)

// WatchAdmissions implements waitroom.AdmissionWatcher: it subscribes to
// every room's admissions channel under the prefix and calls fn for each
// admission step published by any node, until ctx is done. Messages lost
// while reconnecting are repaired by the Manager's periodic snapshot.
func (b *Backend) WatchAdmissions(ctx context.Context, fn func(waitroom.AdmissionEvent)) error {
	pattern := b.prefix + "{room:*}:adm"
	ps := b.c.PSubscribe(ctx, pattern)
	defer ps.Close()
	ch := ps.Channel(redis.WithChannelSize(1024))
	head, tail := b.prefix+"{room:", "}:adm"
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg, ok := <-ch:
			if !ok {
				return nil
			}
			if !strings.HasPrefix(msg.Channel, head) || !strings.HasSuffix(msg.Channel, tail) {
				continue
			}
			room := msg.Channel[len(head) : len(msg.Channel)-len(tail)]
			f := strings.Split(msg.Payload, "\x00")
			if len(f) < 3 {
				continue
			}
			now, _ := strconv.ParseInt(f[0], 10, 64)
			exp, _ := strconv.ParseInt(f[1], 10, 64)
			fn(waitroom.AdmissionEvent{Room: room, Admitted: unix(now), Expires: unix(exp), UIDs: f[2:]})
		}
	}
}
