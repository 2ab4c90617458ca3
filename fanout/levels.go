package fanout

import (
	"log/slog"
	"maps"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Level is a degradation level (docs/architecture.md §5). The effective level of a
// group is the higher of the node's and the group's. Its values are the
// protocol's (gateway/wire's Level* constants, which the engine may not
// import): the gateway's TestLevelsMatchWire pins the two, so a new level
// is a constant here, one in gateway/wire, and the docs.
type Level int8

// Degradation levels.
const (
	L0Normal    Level = 0 // push each message as it commits
	L1Merge     Level = 1 // one batch frame per group per merge window
	L2Summary   Level = 2 // one summary frame per group per merge window
	L3WriteOnly Level = 3 // no pushes; clients told once, they pull
	L4Reject    Level = 4 // sends refused with a retryable unavailable
)

// MaxLevel is the highest level.
const MaxLevel = L4Reject

// ScopeLevel is the state of one scope (the node, or one group).
type ScopeLevel struct {
	GID       int64     // 0 for the node scope
	Level     Level     // effective level of this scope: max(forced or auto)
	Forced    *Level    // nil when none is forced
	ExpiresAt time.Time // expiry of Forced; zero = none
	Auto      Level     // the automatic level
	Cause     string    // why Auto is what it is
}

type scopeState struct {
	forced    Level
	hasForced bool
	until     time.Time
	auto      Level
	cause     string
}

func (s scopeState) level(now time.Time) Level {
	if s.hasForced && (s.until.IsZero() || now.Before(s.until)) {
		// A forced level overrides the automatic one in both directions.
		return s.forced
	}
	return s.auto
}

// levelTable is an immutable snapshot; writers copy it.
type levelTable struct {
	node   scopeState
	groups map[int64]scopeState
}

// Levels holds forced and automatic levels per scope. Reads (Effective, on
// every batch) are lock-free; writes copy the table under mu.
type Levels struct {
	mu    sync.Mutex
	table atomic.Pointer[levelTable]
	now   func() time.Time
	log   *slog.Logger
	// changed is called (outside mu) when a scope's level changes.
	changed func(gid int64, from, to Level, cause string)
}

// NewLevels returns levels all at L0. now nil = time.Now.
func NewLevels(now func() time.Time, log *slog.Logger) *Levels {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Levels{now: now, log: log}
	l.table.Store(&levelTable{groups: map[int64]scopeState{}})
	return l
}

// OnChange registers fn to be called after a scope's level changes (gid 0 =
// node). Call before use.
func (l *Levels) OnChange(fn func(gid int64, from, to Level, cause string)) { l.changed = fn }

// Effective returns the level that applies to gid: max(node, group).
func (l *Levels) Effective(gid int64) Level {
	t := l.table.Load()
	now := l.now()
	lv := t.node.level(now)
	if g, ok := t.groups[gid]; ok {
		lv = max(lv, g.level(now))
	}
	return lv
}

// Node returns the node scope's level.
func (l *Levels) Node() Level { return l.table.Load().node.level(l.now()) }

// update applies fn to the scope gid (0 = node) and logs a change.
func (l *Levels) update(gid int64, cause string, fn func(*scopeState)) {
	l.mu.Lock()
	old := l.table.Load()
	now := l.now()
	nt := &levelTable{node: old.node, groups: old.groups}
	var before, after Level
	if gid == 0 {
		before = nt.node.level(now)
		fn(&nt.node)
		after = nt.node.level(now)
	} else {
		s := old.groups[gid]
		before = s.level(now)
		fn(&s)
		after = s.level(now)
		nt.groups = maps.Clone(old.groups)
		if !s.hasForced && s.auto == L0Normal {
			delete(nt.groups, gid)
		} else {
			nt.groups[gid] = s
		}
	}
	l.table.Store(nt)
	l.mu.Unlock()
	if before != after {
		l.log.Info("degradation level changed", "gid", gid, "from", int(before), "to", int(after), "cause", cause)
		if l.changed != nil {
			l.changed(gid, before, after, cause)
		}
	}
}

// Force sets (level non-nil) or clears (nil) the forced level of a scope
// (gid 0 = node); ttl 0 = until cleared.
func (l *Levels) Force(gid int64, level *Level, ttl time.Duration) {
	cause := "forced by operator"
	if level == nil {
		cause = "forced level cleared by operator"
	}
	l.update(gid, cause, func(s *scopeState) {
		if level == nil {
			s.hasForced, s.forced, s.until = false, 0, time.Time{}
			return
		}
		s.hasForced, s.forced = true, *level
		s.until = time.Time{}
		if ttl > 0 {
			s.until = l.now().Add(ttl)
		}
	})
}

// SetAuto sets the automatic level of a scope with its cause.
func (l *Levels) SetAuto(gid int64, level Level, cause string) {
	t := l.table.Load()
	cur := t.node
	if gid != 0 {
		cur = t.groups[gid]
	}
	if cur.auto == level {
		return
	}
	l.update(gid, cause, func(s *scopeState) { s.auto, s.cause = level, cause })
}

// Auto returns the automatic level of a scope.
func (l *Levels) Auto(gid int64) Level {
	t := l.table.Load()
	if gid == 0 {
		return t.node.auto
	}
	return t.groups[gid].auto
}

// ExpireForced drops forced levels whose TTL has passed, so that their
// expiry is logged and reported once. Call periodically.
func (l *Levels) ExpireForced() {
	t := l.table.Load()
	now := l.now()
	expired := func(s scopeState) bool { return s.hasForced && !s.until.IsZero() && !now.Before(s.until) }
	if expired(t.node) {
		l.expire(0, now)
	}
	for gid, s := range t.groups {
		if expired(s) {
			l.expire(gid, now)
		}
	}
}

func (l *Levels) expire(gid int64, now time.Time) {
	l.mu.Lock()
	old := l.table.Load()
	s := old.node
	if gid != 0 {
		s = old.groups[gid]
	}
	// The effective level already ignores an expired forced level; report
	// the change relative to the forced level that was in force.
	before := s.forced
	s.hasForced, s.forced, s.until = false, 0, time.Time{}
	nt := &levelTable{node: old.node, groups: old.groups}
	if gid == 0 {
		nt.node = s
	} else {
		nt.groups = maps.Clone(old.groups)
		if s.auto == L0Normal {
			delete(nt.groups, gid)
		} else {
			nt.groups[gid] = s
		}
	}
	l.table.Store(nt)
	l.mu.Unlock()
	after := s.level(now)
	l.log.Info("forced degradation level expired", "gid", gid, "from", int(before), "to", int(after))
	if before != after && l.changed != nil {
		l.changed(gid, before, after, "forced level expired")
	}
}

// Snapshot returns the node scope and every group scope that is not at a
// plain automatic L0, sorted by gid. A group's Level is its effective level,
// max(node, group).
func (l *Levels) Snapshot() (node ScopeLevel, groups []ScopeLevel) {
	t := l.table.Load()
	now := l.now()
	view := func(gid int64, s scopeState) ScopeLevel {
		v := ScopeLevel{GID: gid, Level: s.level(now), Auto: s.auto, Cause: s.cause}
		if s.hasForced && (s.until.IsZero() || now.Before(s.until)) {
			f := s.forced
			v.Forced = &f
			v.ExpiresAt = s.until
		}
		return v
	}
	node = view(0, t.node)
	for gid, s := range t.groups {
		g := view(gid, s)
		g.Level = max(g.Level, node.Level) // effective for the group
		groups = append(groups, g)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].GID < groups[j].GID })
	return node, groups
}
