package waitroom

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
)

// Config configures a Manager. Its zero value works: an in-process backend,
// a random HS256 signing secret, no metrics registration.
type Config struct {
	// Backend stores the rooms. nil means a new in-process Memory backend.
	Backend Backend
	// Fallback takes over when Backend is unreachable (degradation L3).
	// nil means a new Memory backend, unless Backend is itself a *Memory.
	Fallback Backend
	// NoFallback disables the L3 fallback: calls fail with ErrUnavailable.
	NoFallback bool
	// FallbackShare is the share of a room's MaxActive, AdmitRate and
	// AdmitBurst this node uses on its local fallback, where nodes cannot
	// coordinate (e.g. 1/N with N nodes). 0 means 1.
	FallbackShare float64
	// Node names this node: in the backend (which node holds a user's
	// socket), logs and webhook events. Up to 64 of [A-Za-z0-9_.:-];
	// "" means host-pid. Must differ between nodes sharing a backend.
	Node string
	// NodeTimeout: a node that has not heartbeated (once per
	// MaintainEvery) for longer is dead; any node's driver then makes its
	// waiting users away (they keep their place for Grace from the node's
	// last heartbeat) and ends its admitted sessions. 0 means 30 s.
	NodeTimeout time.Duration
	// Signer signs access tokens. nil means HS256 with a random secret
	// (tokens then verify only on this process; set it in production).
	Signer *roomtoken.Signer
	// Observers are notified of session ends (see also AddObserver).
	Observers []Observer
	// Webhook, when URL is set, POSTs every session end this node sees.
	Webhook WebhookConfig
	// AdmitQuota returns the node's default VIP admission share for the
	// rooms whose RoomConfig.VIPAdmitShare is 0 (outside (0, 1): no quota).
	// It is called on every backend call, so a reload takes effect at once.
	// nil means no default: such rooms have no quota.
	AdmitQuota func() float64
	// Logger (nil = discard).
	Logger *slog.Logger
	// Registerer registers the metrics (nil = not registered).
	Registerer prometheus.Registerer

	// Tick is the driver period: one admission step per room. 0 means 100 ms.
	Tick time.Duration
	// MaintainEvery: expiry, hard timeouts, smoothing steps. 0 means 1 s.
	MaintainEvery time.Duration
	// SnapshotEvery refreshes the local rank snapshot. 0 means 2 s. Users
	// far back are re-ranked less often: every ETA/30, at most every 30 s
	// (10 s while paused), which bounds the Redis time a node spends on
	// snapshots (about 15 µs per user re-ranked).
	SnapshotEvery time.Duration
	// PushEvery is the least time between two queue frames to one user
	// (coalescing); status changes and VIP notices go out at the next
	// snapshot regardless. 0 means 3 s.
	PushEvery time.Duration
	// LiveRefresh is the snapshot period at L1/L2. 0 means 10 s.
	LiveRefresh time.Duration
	// HealthEvery checks backend health (and probes Redis at L3).
	// 0 means 2 s.
	HealthEvery time.Duration
	// SyncEvery reloads room configurations from the backend. 0 means 5 s.
	SyncEvery time.Duration
	// FailAfter consecutive unavailable errors switch to the fallback.
	// 0 means 3.
	FailAfter int
	// OverloadLatency: backend latency above it is L2. 0 means 250 ms.
	OverloadLatency time.Duration
	// CallTimeout bounds each backend call made by the driver. 0 means 2 s.
	CallTimeout time.Duration
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.FallbackShare < 0 || c.FallbackShare > 1 {
		errs = append(errs, fmt.Errorf("waitroom: FallbackShare %v out of range [0, 1]", c.FallbackShare))
	}
	for name, d := range map[string]time.Duration{"Tick": c.Tick, "MaintainEvery": c.MaintainEvery,
		"SnapshotEvery": c.SnapshotEvery, "PushEvery": c.PushEvery, "LiveRefresh": c.LiveRefresh,
		"HealthEvery": c.HealthEvery, "SyncEvery": c.SyncEvery, "OverloadLatency": c.OverloadLatency,
		"CallTimeout": c.CallTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("waitroom: %s %v is negative", name, d))
		}
	}
	if !ValidNode(c.Node) {
		errs = append(errs, fmt.Errorf("waitroom: node name %q must be up to 64 of [A-Za-z0-9_.:-]", c.Node))
	}
	if c.NodeTimeout < 0 {
		errs = append(errs, fmt.Errorf("waitroom: NodeTimeout %v is negative", c.NodeTimeout))
	}
	if c.FailAfter < 0 {
		errs = append(errs, fmt.Errorf("waitroom: FailAfter %d is negative", c.FailAfter))
	}
	return errors.Join(errs...)
}

func (c *Config) fill() error {
	if c.Backend == nil {
		c.Backend = NewMemory(MemoryConfig{})
	}
	if c.Fallback == nil && !c.NoFallback {
		if _, isMem := c.Backend.(*Memory); !isMem {
			c.Fallback = NewMemory(MemoryConfig{})
		}
	}
	if c.FallbackShare == 0 {
		c.FallbackShare = 1
	}
	if c.Signer == nil {
		var secret [32]byte
		rand.Read(secret[:])
		s, err := roomtoken.NewHS256(secret[:])
		if err != nil {
			return err
		}
		c.Signer = s
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Tick, 100*time.Millisecond)
	def(&c.MaintainEvery, time.Second)
	def(&c.SnapshotEvery, 2*time.Second)
	def(&c.PushEvery, 3*time.Second)
	def(&c.LiveRefresh, 10*time.Second)
	def(&c.HealthEvery, 2*time.Second)
	def(&c.SyncEvery, 5*time.Second)
	def(&c.OverloadLatency, 250*time.Millisecond)
	def(&c.CallTimeout, 2*time.Second)
	if c.FailAfter == 0 {
		c.FailAfter = 3
	}
	def(&c.NodeTimeout, 30*time.Second)
	if c.Node == "" {
		host, _ := os.Hostname()
		c.Node = nodeSanitize.ReplaceAllString(host, "_") + "-" + strconv.Itoa(os.Getpid())
		if len(c.Node) > 64 {
			c.Node = c.Node[len(c.Node)-64:]
		}
	}
	return nil
}

var nodeSanitize = regexp.MustCompile(`[^A-Za-z0-9_.:-]`)

// Manager runs the waiting rooms of one node: it creates and updates rooms,
// lets users join them (Join returns a Ticket and delivers Updates), drives
// admissions, expiry and position pushes, and falls back to a local queue
// when the shared backend is unreachable.
//
// Lock order: Manager.modeMu, then Manager.mu, then Room.mu, then
// member.mu. Backend calls are made with modeMu read-held and no other
// lock; updates are delivered with only member.mu held.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	met    *metrics
	hook   *Webhook
	signer *roomtoken.Signer

	// modeMu is read-held around every backend call and write-held to
	// switch between the primary backend and the fallback.
	modeMu   sync.RWMutex
	local    bool // guarded by modeMu
	failures atomic.Int32
	level    atomic.Int32 // Degradation
	memHigh  atomic.Bool
	overload atomic.Bool
	latency  atomic.Int64 // EWMA of backend call latency, ns

	forcedMu    sync.Mutex
	forced      Degradation
	forcedUntil time.Time
	forcedSet   bool

	mu        sync.Mutex
	rooms     map[string]*Room
	observers []Observer
	runCtx    context.Context
	running   bool
	closed    bool
	cancelRun context.CancelFunc
	wg        sync.WaitGroup

	// loaded is closed once Run has made its first attempt to load the
	// stored rooms: until then a room not yet known may only not be
	// loaded yet.
	loaded chan struct{}
}

// New returns a Manager. Call Run to start its drivers.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, met: newMetrics(cfg.Registerer), signer: cfg.Signer,
		rooms: make(map[string]*Room), observers: append([]Observer(nil), cfg.Observers...),
		loaded: make(chan struct{})}
	if cfg.Webhook.URL != "" {
		m.hook = newWebhook(cfg.Webhook, cfg.Node, m.log, m.met)
		m.observers = append(m.observers, m.hook)
	}
	return m, nil
}

// AddObserver registers an observer of session ends.
func (m *Manager) AddObserver(o Observer) {
	m.mu.Lock()
	m.observers = append(m.observers[:len(m.observers):len(m.observers)], o)
	m.mu.Unlock()
}

func (m *Manager) observerList() []Observer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.observers
}

// Loaded is closed once Run has made its first attempt to load the stored
// rooms and started their drivers (a failed attempt is logged and retried
// every SyncEvery). cmd/fanfared waits for it before it opens its
// listeners, so that a room kept across a restart is never answered
// unknown because it was asked for too early.
func (m *Manager) Loaded() <-chan struct{} { return m.loaded }

// Run loads the stored rooms, starts one driver per room, the health and
// configuration loops, the admissions watcher and the webhook, and blocks
// until ctx is done or Shutdown is called. After Shutdown it returns nil at
// once.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.closed { // shut down before it ran (a process stopped at start): nothing to do
		m.mu.Unlock()
		return nil
	}
	if m.running {
		m.mu.Unlock()
		return errors.New("waitroom: Manager.Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	m.running, m.runCtx, m.cancelRun = true, ctx, cancel
	m.mu.Unlock()
	defer cancel()

	if err := m.syncConfigs(ctx); err != nil {
		m.log.Warn("room configs not loaded at start", "err", err)
	}
	m.mu.Lock()
	for _, r := range m.rooms {
		m.startLocked(r)
	}
	m.mu.Unlock()
	close(m.loaded) // Run runs once (running above)

	m.goLoop(ctx, m.cfg.HealthEvery, m.checkHealth)
	m.goLoop(ctx, m.cfg.SyncEvery, func(ctx context.Context) {
		if err := m.syncConfigs(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("room config sync failed", "err", err)
		}
	})
	if w, ok := m.cfg.Backend.(AdmissionWatcher); ok {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			for ctx.Err() == nil {
				if err := w.WatchAdmissions(ctx, m.onAdmissionEvent); err != nil && ctx.Err() == nil {
					m.log.Warn("room admissions watch failed", "err", err)
					sleepCtx(ctx, time.Second)
				}
			}
		}()
	}
	if m.hook != nil {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.hook.Run(ctx)
		}()
	}
	<-ctx.Done()
	m.wg.Wait()
	return nil
}

func (m *Manager) goLoop(ctx context.Context, every time.Duration, fn func(context.Context)) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fn(ctx)
			}
		}
	}()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Shutdown drains the node: it refuses new joins, marks this node's
// waiting users away (they keep their positions for Grace and may
// reconnect to another node), stops the drivers and waits for them or for
// ctx. Admitted sessions are left running: a user who reconnects to
// another node within NodeTimeout keeps its session; otherwise another
// node's sweep ends it (reason disconnect) once this node's heartbeat is
// older than NodeTimeout.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	rooms := make([]*Room, 0, len(m.rooms))
	for _, r := range m.rooms {
		rooms = append(rooms, r)
	}
	cancel := m.cancelRun
	m.mu.Unlock()
	for _, r := range rooms {
		r.drain(ctx)
	}
	if cancel != nil {
		cancel()
	}
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startLocked starts r's driver if Run is running. m.mu must be held.
func (m *Manager) startLocked(r *Room) {
	if !m.running || r.cancel != nil || m.runCtx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(m.runCtx)
	r.cancel = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		r.run(ctx)
	}()
}

// Upsert creates or updates a room (defaults applied, validated), stores
// it in the backend so every node sees it, and returns the effective
// configuration. Shards cannot change once a room exists.
func (m *Manager) Upsert(ctx context.Context, rc RoomConfig) (RoomConfig, error) {
	rc = rc.WithDefaults()
	if err := rc.Validate(); err != nil {
		return RoomConfig{}, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return RoomConfig{}, ErrClosed
	}
	if r := m.rooms[rc.Name]; r != nil && r.Config().Shards != rc.Shards {
		m.mu.Unlock()
		return RoomConfig{}, ErrShardsImmutable
	}
	m.mu.Unlock()
	if err := m.do(ctx, func(b Backend, _ bool) error { return b.SaveConfig(ctx, rc) }); err != nil {
		return RoomConfig{}, err
	}
	m.apply(rc)
	m.log.Info("room configured", "room", rc.Name, "state", rc.State, "max_active", rc.MaxActive,
		"admit_rate", rc.AdmitRate, "max_wait_s", rc.MaxWait.Seconds())
	return rc, nil
}

// apply installs rc locally (creating the room and its driver if new).
func (m *Manager) apply(rc RoomConfig) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.rooms[rc.Name]; r != nil {
		r.cfg.Store(&rc)
		r.updated = time.Now()
		return
	}
	r := newRoom(m, rc)
	m.rooms[rc.Name] = r
	m.startLocked(r)
}

// Delete removes a room everywhere; its local users get rejected
// room_closed.
func (m *Manager) Delete(ctx context.Context, name string) error {
	if m.roomOf(name) == nil {
		return ErrUnknownRoom
	}
	if err := m.do(ctx, func(b Backend, _ bool) error { return b.DeleteRoom(ctx, name) }); err != nil {
		return err
	}
	m.remove(name)
	return nil
}

func (m *Manager) remove(name string) {
	m.mu.Lock()
	r := m.rooms[name]
	delete(m.rooms, name)
	m.mu.Unlock()
	if r == nil {
		return
	}
	if r.cancel != nil {
		r.cancel()
	}
	r.closeAll()
	m.met.dropRoom(name)
	m.log.Info("room deleted", "room", name)
}

// Config returns a room's configuration.
func (m *Manager) Config(name string) (RoomConfig, bool) {
	r := m.roomOf(name)
	if r == nil {
		return RoomConfig{}, false
	}
	return r.Config(), true
}

// Rooms returns every room's configuration.
func (m *Manager) Rooms() []RoomConfig {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]RoomConfig, 0, len(m.rooms))
	for _, r := range m.rooms {
		out = append(out, r.Config())
	}
	return out
}

func (m *Manager) roomOf(name string) *Room {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rooms[name]
}

// syncConfigs reloads configurations from the primary backend: rooms
// created or changed on other nodes appear here, deleted ones go.
func (m *Manager) syncConfigs(ctx context.Context) error {
	if m.isLocal() {
		return nil
	}
	start := time.Now()
	var cfgs []RoomConfig
	err := m.do(ctx, func(b Backend, local bool) error {
		if local {
			return nil
		}
		var err error
		cfgs, err = b.LoadConfigs(ctx)
		return err
	})
	if err != nil || cfgs == nil {
		return err
	}
	seen := make(map[string]bool, len(cfgs))
	for _, c := range cfgs {
		if c.Validate() != nil {
			continue
		}
		seen[c.Name] = true
		m.mu.Lock()
		r := m.rooms[c.Name]
		switch {
		case r == nil:
			r = newRoom(m, c)
			m.rooms[c.Name] = r
			m.startLocked(r)
		case r.updated.Before(start) && r.cfg.Load().Shards == c.Shards:
			r.cfg.Store(&c)
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	var gone []string
	for name, r := range m.rooms {
		if !seen[name] && r.updated.Before(start) { // not created or changed since the load began
			gone = append(gone, name)
		}
	}
	m.mu.Unlock()
	for _, name := range gone {
		m.remove(name)
	}
	return nil
}

// Join puts uid (at VIP tier 0..3) into room and subscribes deliver to
// the user's updates. Every frame, the first included, goes through
// deliver, serialized per user, before Join returns for the first one:
// a queue or granted update, or a rejected one (then the Ticket is nil
// and err is nil: a refusal is a result, not an error). deliver must not
// block. err is ErrUnknownRoom, ErrClosed or a backend failure.
//
// Join is idempotent: joining again (a refresh, a second socket) never
// creates a second entry; within Grace of a disconnect it restores the
// position.
func (m *Manager) Join(ctx context.Context, room, uid string, level int, deliver func(Update)) (*Ticket, error) {
	r := m.roomOf(room)
	if r == nil {
		return nil, ErrUnknownRoom
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return r.join(ctx, uid, clampTier(level), deliver)
}

// Position returns the last update computed for uid in room from the
// local snapshot, without touching the backend.
func (m *Manager) Position(room, uid string) (Update, bool) {
	r := m.roomOf(room)
	if r == nil {
		return Update{}, false
	}
	return r.position(uid)
}

// RoomStatus is what GET /admin/v1/rooms/{room} reports.
type RoomStatus struct {
	Config RoomConfig
	Stats
	// Degradation is the subsystem level; Local is true at L3.
	Degradation Degradation
	Local       bool
	// Alert is 0 below 50% of L_max, 1 from 50%, 2 from 80%.
	Alert int
	// LocalUsers is the number of users connected to this node.
	LocalUsers int
	// AdmittedByTier counts the admissions this node's admission steps
	// made in the room since the room appeared on this node (node start or
	// room creation), by tier (0 normal, 1..MaxTier VIP): the node's
	// fanfare_room_admitted_total summed over overdue. Other nodes'
	// admissions are not in it.
	AdmittedByTier [MaxTier + 1]int64
	// WaitByTier is the distribution, by tier, of the waits the max-wait
	// promise bounds (admission - max(join, return from away), whole
	// seconds of the backend's clock) of the admissions of AdmittedByTier
	// recorded within the last WaitWindow, at most WaitLogSize per tier
	// (the latest).
	WaitByTier [MaxTier + 1]WaitStats
	At         time.Time
}

// Status returns a room's current status, read fresh from the backend
// (from the last snapshot at L2).
func (m *Manager) Status(ctx context.Context, name string) (RoomStatus, error) {
	r := m.roomOf(name)
	if r == nil {
		return RoomStatus{}, ErrUnknownRoom
	}
	return r.status(ctx)
}

// Degradation returns the current degradation level.
func (m *Manager) Degradation() Degradation { return Degradation(m.level.Load()) }

// ForceDegradation sets the level to d (L0-L2) for ttl (0 = until
// cleared), overriding the automatic L1/L2 detection; ClearDegradation
// ends it. L3 follows the backend's reachability only.
func (m *Manager) ForceDegradation(d Degradation, ttl time.Duration) error {
	if d < DegradeNone || d > DegradeOverload {
		return fmt.Errorf("waitroom: cannot force level %v", d)
	}
	m.forcedMu.Lock()
	m.forced, m.forcedSet, m.forcedUntil = d, true, time.Time{}
	if ttl > 0 {
		m.forcedUntil = time.Now().Add(ttl)
	}
	m.forcedMu.Unlock()
	m.updateLevel("forced")
	return nil
}

// TokenKeys returns the JSON Web Key Set that verifies access tokens, nil
// when they are signed with a shared secret (see roomtoken.Signer.JWKS).
func (m *Manager) TokenKeys() []byte { return m.signer.JWKS() }

// DegradationState is the room subsystem's level with its parts.
type DegradationState struct {
	Level Degradation
	// Auto is what the automatic detection says (L3 while on the local
	// fallback).
	Auto Degradation
	// Forced is the operator's level, nil when none; ForcedUntil its
	// expiry (zero = until cleared).
	Forced      *Degradation
	ForcedUntil time.Time
}

// DegradationState returns the current level, the automatic one and any
// forced level.
func (m *Manager) DegradationState() DegradationState {
	st := DegradationState{Level: m.Degradation()}
	switch {
	case m.isLocal():
		st.Auto = DegradeLocal
	case m.overload.Load():
		st.Auto = DegradeOverload
	case m.memHigh.Load():
		st.Auto = DegradeMemory
	}
	m.forcedMu.Lock()
	if m.forcedSet && (m.forcedUntil.IsZero() || time.Now().Before(m.forcedUntil)) {
		f := m.forced
		st.Forced, st.ForcedUntil = &f, m.forcedUntil
	}
	m.forcedMu.Unlock()
	return st
}

// ClearDegradation removes a forced level.
func (m *Manager) ClearDegradation() {
	m.forcedMu.Lock()
	m.forcedSet = false
	m.forcedMu.Unlock()
	m.updateLevel("forced level cleared")
}

func (m *Manager) isLocal() bool {
	m.modeMu.RLock()
	defer m.modeMu.RUnlock()
	return m.local
}

// updateLevel recomputes the level from the mode, health and any forced
// level, and logs a change with its cause.
func (m *Manager) updateLevel(cause string) {
	m.modeMu.RLock()
	local := m.local
	m.modeMu.RUnlock()
	m.setLevel(local, cause)
}

// setLevel is updateLevel for a known mode; it takes no lock on modeMu, so
// the mode switches call it while holding it.
func (m *Manager) setLevel(local bool, cause string) {
	var d Degradation
	switch {
	case local:
		d = DegradeLocal
	default:
		m.forcedMu.Lock()
		if m.forcedSet && !m.forcedUntil.IsZero() && time.Now().After(m.forcedUntil) {
			m.forcedSet = false
		}
		forced, set := m.forced, m.forcedSet
		m.forcedMu.Unlock()
		switch {
		case set:
			d = forced
		case m.overload.Load():
			d = DegradeOverload
		case m.memHigh.Load():
			d = DegradeMemory
		}
	}
	if old := Degradation(m.level.Swap(int32(d))); old != d {
		m.met.degradation.Set(float64(d))
		lvl := slog.LevelWarn
		if d < old {
			lvl = slog.LevelInfo
		}
		m.log.Log(context.Background(), lvl, "room degradation level changed", "from", old.String(), "to", d.String(), "cause", cause)
	}
}

// do runs fn on the current backend. Unavailable errors from the primary
// are retried; after FailAfter in a row the Manager switches to the
// fallback (L3) and runs fn there. fn's second argument says whether it
// runs on the fallback.
func (m *Manager) do(ctx context.Context, fn func(b Backend, local bool) error) error {
	for {
		m.modeMu.RLock()
		local := m.local
		b := m.cfg.Backend
		if local {
			b = m.cfg.Fallback
		}
		start := time.Now()
		err := fn(b, local)
		m.modeMu.RUnlock()
		if !local {
			m.observeLatency(time.Since(start))
		}
		if err == nil {
			if !local {
				m.failures.Store(0)
			}
			return nil
		}
		// A timeout is the backend's failure (a hanging Redis); a
		// cancellation is the caller's.
		timedOut := errors.Is(err, context.DeadlineExceeded)
		if errors.Is(ctx.Err(), context.Canceled) || !(errors.Is(err, ErrUnavailable) || timedOut) {
			return err
		}
		name := "primary"
		if local {
			name = "fallback"
		}
		m.met.backendCalls.WithLabelValues(name).Inc()
		if local || m.cfg.Fallback == nil {
			return err
		}
		if int(m.failures.Add(1)) >= m.cfg.FailAfter {
			m.enterLocal(context.WithoutCancel(ctx), err)
			if ctx.Err() == nil {
				continue
			}
			return err
		}
		if ctx.Err() != nil { // one timed-out call counts once
			return err
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

func (m *Manager) observeLatency(d time.Duration) {
	for {
		old := m.latency.Load()
		nv := old + (int64(d)-old)/8
		if old == 0 {
			nv = int64(d)
		}
		if m.latency.CompareAndSwap(old, nv) {
			return
		}
	}
}

// enterLocal switches to the fallback (L3): each room seeds the local
// queue with this node's connected users, keeping their join times, so
// their relative order survives.
func (m *Manager) enterLocal(ctx context.Context, cause error) {
	m.modeMu.Lock()
	if m.local {
		m.modeMu.Unlock()
		return
	}
	m.local = true
	m.mu.Lock()
	rooms := make([]*Room, 0, len(m.rooms))
	for _, r := range m.rooms {
		rooms = append(rooms, r)
	}
	m.mu.Unlock()
	seeded := 0
	for _, r := range rooms {
		seeded += r.seedLocal(ctx, m.cfg.Fallback)
	}
	m.setLevel(true, "backend unreachable: "+cause.Error())
	m.modeMu.Unlock()
	m.log.Warn("room backend unreachable: switched to the local queue; order holds per node only",
		"cause", cause.Error(), "seeded_users", seeded, "node", m.cfg.Node)
	for _, r := range rooms {
		r.rankAll()
	}
}

// leaveLocal hands this node's users back to the primary (keeping join
// times; users still queued there keep their old entries) and switches
// back. On any failure it stays local.
func (m *Manager) leaveLocal(ctx context.Context) {
	m.modeMu.Lock()
	if !m.local {
		m.modeMu.Unlock()
		return
	}
	m.mu.Lock()
	rooms := make([]*Room, 0, len(m.rooms))
	for _, r := range m.rooms {
		rooms = append(rooms, r)
	}
	m.mu.Unlock()
	moved := 0
	for _, r := range rooms {
		n, err := r.handBack(ctx, m.cfg.Fallback, m.cfg.Backend)
		if err != nil {
			m.modeMu.Unlock()
			m.log.Warn("room backend back but hand-over failed; staying local", "room", r.name, "err", err)
			return
		}
		moved += n
	}
	for _, r := range rooms {
		if err := m.cfg.Fallback.DeleteRoom(ctx, r.name); err != nil {
			m.log.Warn("local room reset failed", "room", r.name, "err", err)
		}
	}
	m.local = false
	m.failures.Store(0)
	m.setLevel(false, "backend reachable")
	m.modeMu.Unlock()
	m.log.Info("room backend reachable again: local users handed back", "moved_users", moved, "node", m.cfg.Node)
	for _, r := range rooms {
		r.rankAll()
	}
}

// handBackTimeout bounds moving this node's users back to the primary.
const handBackTimeout = time.Minute

// checkHealth probes the primary: at L3 to come back, otherwise to detect
// memory pressure (L1) and overload (L2).
func (m *Manager) checkHealth(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, m.cfg.CallTimeout)
	defer cancel()
	h, err := m.cfg.Backend.Health(ctx)
	if m.isLocal() {
		if err == nil {
			hctx, hcancel := context.WithTimeout(parent, handBackTimeout)
			defer hcancel()
			m.leaveLocal(hctx)
		}
		return
	}
	if err != nil {
		failed := errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
		if failed && parent.Err() == nil && m.cfg.Fallback != nil && int(m.failures.Add(1)) >= m.cfg.FailAfter {
			m.enterLocal(parent, err)
		}
		return
	}
	m.memHigh.Store(h.MemoryHigh)
	lat := max(h.Latency, time.Duration(m.latency.Load()))
	m.overload.Store(lat > m.cfg.OverloadLatency)
	cause := "health check"
	if h.MemoryHigh {
		cause = fmt.Sprintf("backend memory %d of %d bytes", h.MemoryUsed, h.MemoryLimit)
	}
	if lat > m.cfg.OverloadLatency {
		cause = fmt.Sprintf("backend latency %v above %v", lat, m.cfg.OverloadLatency)
	}
	m.updateLevel(cause)
}

// onAdmissionEvent grants the local users admitted by any node.
func (m *Manager) onAdmissionEvent(ev AdmissionEvent) {
	if r := m.roomOf(ev.Room); r != nil {
		r.grantUIDs(ev.UIDs, ev.Expires)
	}
}

// effective is the configuration passed to the backend: the node's
// default admission quota where the room leaves it zero, and on the
// fallback the node's share of MaxActive and AdmitRate.
func (m *Manager) effective(cfg *RoomConfig, local bool) *RoomConfig {
	share := local && m.cfg.FallbackShare < 1
	quota := cfg.VIPAdmitShare == 0 && m.cfg.AdmitQuota != nil
	if !share && !quota {
		return cfg
	}
	c := *cfg
	if quota {
		c.VIPAdmitShare = m.cfg.AdmitQuota()
	}
	if share {
		c.MaxActive = max(1, int(math.Ceil(float64(c.MaxActive)*m.cfg.FallbackShare)))
		c.AdmitRate *= m.cfg.FallbackShare
		c.AdmitBurst = max(1, c.AdmitBurst*m.cfg.FallbackShare)
	}
	return &c
}

func (m *Manager) sessionEnded(r *Room, e SessionEnd) {
	m.met.ended.WithLabelValues(e.Room, string(e.Reason)).Inc()
	if !e.Admitted.IsZero() {
		m.met.service.WithLabelValues(e.Room).Observe(e.Ended.Sub(e.Admitted).Seconds())
	}
	m.log.Info("room session ended", "room", e.Room, "uid", e.UID, "reason", string(e.Reason),
		"level", e.Tier, "service_s", e.Ended.Sub(e.Admitted).Seconds())
	for _, o := range m.observerList() {
		o.SessionEnded(e)
	}
	r.wake()
}
