package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	fanfarejs "github.com/fanfare-im/fanfare/client/js"
	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/bus/redisbus"
	"github.com/fanfare-im/fanfare/fanout/redishot"
	"github.com/fanfare-im/fanfare/fanout/redisquota"
	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/redisroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
	"github.com/fanfare-im/fanfare/gateway"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/presence/redispresence"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
	"github.com/fanfare-im/fanfare/store/postgres"
	"github.com/fanfare-im/fanfare/store/retention"
	"github.com/fanfare-im/fanfare/web"
)

// sdkFiles is the JavaScript SDK served at /sdk/ (/sdk/src/index.js).
var sdkFiles fs.FS = fanfarejs.FS

// server is one fanfared node: its store, engine, sockets and HTTP API.
type server struct {
	cfg *config
	log *slog.Logger
	st  store.Store
	eng *fanout.Engine
	// engMetrics are the engine's collectors; the socket layer reports
	// its write passes to them (fanfare_message_stage_seconds).
	engMetrics *fanout.Metrics
	chat       *gateway.Chat
	// events is the Server-Sent Events fallback (-sse); nil when off.
	events *gateway.Events
	ws     *socket.Server
	api    *gateway.API
	ln     net.Listener // HTTP API listener
	mode   string
	rdb    redis.UniversalClient // nil without FANFARE_REDIS_ADDR
	lim    *limits
	wr     *waitroom.Manager
	bus    *bus.Node // cluster mode only
	rooms  *gateway.Rooms
	// view publishes this node's presence to Redis and answers
	// cluster-wide online counts; nil without Redis.
	view *redispresence.View
	// feed pushes online counts (and small groups' joins and leaves) to
	// members (docs/architecture.md §7.1).
	feed *gateway.PresenceFeed
	// roomJournal keeps the waiting rooms in embedded mode (the embedded
	// store); nil in cluster mode, where they live in Redis.
	roomJournal waitroom.Journal
	// sweeper deletes expired messages; nil without -retention.
	sweeper *retention.Sweeper
	// hooks is the event stream and its journal; nil without
	// -hook-events-url (hooks.go).
	hooks *hookSet

	jwtSecret  string
	adminToken string
	roomSecret string
	// devJWT and devAdmin: the JWT secret or the admin token was generated
	// (embedded mode keeps them in the data directory); only a generated
	// one is printed, never a configured one.
	devJWT, devAdmin bool
	// devRoom: the access tokens' HS256 secret was generated (embedded
	// mode): printed for a protected service to verify with (gate).
	devRoom bool

	reloadMu sync.Mutex // one reload at a time (SIGHUP, tests)
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lv}))
}

// readyEvery maps -ready-every to gateway.APIConfig.ReadyEvery, where 0
// means the default and a negative value every probe.
func readyEvery(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// newRedisClient connects to Redis with short timeouts and no retries:
// limits and presence must never make a send wait for a slow Redis (their
// fallbacks take over). go-redis's own log lines (dial failures and
// reconnects during an outage) go to log as Warn records instead of plain
// text on stderr, in the middle of the JSON log; the go-redis logger is
// process-wide, so the last server built in a process owns it.
func newRedisClient(addr string, log *slog.Logger) *redis.Client {
	redis.SetLogger(redisLogger{log})
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1,
		ContextTimeoutEnabled: true})
}

// redisLogger is go-redis's logger on slog.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	if !strings.HasPrefix(msg, "redis: ") {
		msg = "redis: " + msg
	}
	l.log.WarnContext(ctx, msg, "component", "go-redis")
}

// newServer opens the store and builds every component; nothing listens
// for connections until run.
func newServer(ctx context.Context, cfg *config, log *slog.Logger) (s *server, err error) {
	s = &server{cfg: cfg, log: log, jwtSecret: cfg.JWTSecret, adminToken: cfg.AdminToken, roomSecret: cfg.RoomSecret}
	if cfg.NodeID == "" {
		host, _ := os.Hostname()
		cfg.NodeID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	var st store.Store
	if cfg.PostgresURL != "" {
		s.mode = "cluster"
		statements := cfg.PostgresAppendStatements
		if statements == 0 {
			statements = -1 // the flag's 0 is the store's "no merging"
		}
		st, err = postgres.Open(ctx, postgres.Config{URL: cfg.PostgresURL, Schema: cfg.PostgresSchema, Logger: log,
			Limits: store.Limits{MaxGID: cfg.MaxGID}, AppendStatements: statements})
	} else {
		s.mode = "embedded"
		var es *embedded.Store
		if es, err = embedded.Open(embedded.Config{Dir: cfg.DataDir, Logger: log, Limits: store.Limits{MaxGID: cfg.MaxGID}}); err == nil {
			st, s.roomJournal = es, es
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	s.st = st
	defer func() {
		if err != nil {
			st.Close() // s is nil on this path
		}
	}()
	if err := s.secrets(); err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	perUserConns := cfg.MaxConnsPerUser
	if perUserConns == 0 {
		perUserConns = 1 << 16 // no cap: the socket layer enforces -max-conns-per-user
	}
	pres, err := presence.New[fanout.Conn](presence.Config{MaxConnsPerUser: perUserConns,
		// The sockets close silent connections (-idle-timeout): presence's
		// heartbeats are never used here.
		NoHeartbeats: true})
	if err != nil {
		return nil, err
	}
	if cfg.RedisAddr != "" {
		s.rdb = newRedisClient(cfg.RedisAddr, log)
	}
	s.lim, err = newLimits(cfg, s.rdb, reg, log)
	if err != nil {
		return nil, err
	}
	s.chat = gateway.NewChat(gateway.ChatConfig{
		Node:            cfg.NodeID,
		Heartbeat:       cfg.Heartbeat,
		MaxMessageBytes: cfg.MaxMessageBytes,
		PageBytes:       cfg.PageBytes,
		Workers:         cfg.FrameWorkers,
		WorkQueue:       cfg.FrameQueue,
		ConnectWorkers:  cfg.ConnectWorkers,
		ConnectQueue:    cfg.ConnectQueue,
		RequestTimeout:  cfg.RequestTimeout,
		Limiter:         s.lim.shared,
		RemoteLimiter:   s.lim.remote,
		ConnLimiter:     s.lim.node,
		FrameLimiter:    s.lim.node,
		Logger:          log,
	})
	engMetrics := fanout.NewMetrics(reg)
	s.engMetrics = engMetrics
	ecfg := fanout.Config{
		Store:                s.st,
		Presence:             pres,
		Pusher:               s.chat,
		NodeID:               cfg.NodeID,
		Shards:               cfg.Shards,
		HotShards:            cfg.HotShards,
		MemberCache:          cfg.MemberCache,
		MemberCacheTTL:       cfg.MemberCacheTTL,
		MemberFeedInterval:   cfg.MemberFeedInterval,
		MemberFeedPage:       cfg.MemberFeedPage,
		MemberFeedGrace:      cfg.MemberFeedGrace,
		MemberFeedKickGap:    cfg.MemberFeedKickGap,
		MemberFeedPendingMax: cfg.MemberFeedPendingMax,
		TouchInterval:        cfg.TouchInterval,
		TouchPendingMax:      cfg.TouchPendingMax,
		Metrics:              engMetrics,
		Logger:               log,
	}
	// Bound to the engine once it exists.
	var (
		remote        func(*bus.Batch)
		remoteMembers func(*bus.MemberChange)
		reconnected   func([]int64)
	)
	if s.rdb != nil {
		// Cluster mode: committed batches reach the nodes where members
		// are online over Redis sharded pub/sub (docs/architecture.md §10), and
		// membership changes reach every node's presence.
		tail := cfg.BusTailDelay
		if tail == 0 {
			tail = -1 // the flag's 0 is off; the bus's 0 is its default
		}
		s.bus, err = redisbus.New(redisbus.Config{
			Client: s.rdb,
			Prefix: cfg.RedisPrefix + "bus:",
			Bus: bus.Config{NodeID: cfg.NodeID, Presence: pres, Registerer: reg, Logger: log, TailDelay: tail,
				Handler:     func(b *bus.Batch) { remote(b) },
				Members:     func(c *bus.MemberChange) { remoteMembers(c) },
				Reconnected: func(gids []int64) { reconnected(gids) }},
		})
		if err != nil {
			return nil, err
		}
		ecfg.Bus = s.bus
		// The cluster-wide presence view (docs/architecture.md §7): this node's
		// online bits in Redis, flushed every -presence-flush-interval.
		s.view, err = redispresence.New(s.rdb, pres, redispresence.Config{
			NodeID: cfg.NodeID, Prefix: cfg.RedisPrefix + "presence:",
			FlushInterval: cfg.PresenceFlushInterval, TTL: cfg.PresenceTTL, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		// The cluster's hot groups (docs/architecture.md §9): a group any node marks
		// hot is hot on every node; and its group limits (§8): each node
		// paces its part of a group's rate limit, and @all is counted for
		// the cluster.
		ecfg.HotSet, err = redishot.New(redishot.Config{Client: s.rdb, Prefix: cfg.RedisPrefix + "hot:"})
		if err != nil {
			return nil, err
		}
		ecfg.AtAllQuota, err = redisquota.New(redisquota.Config{Client: s.rdb, Prefix: cfg.RedisPrefix + "atall:"})
		if err != nil {
			return nil, err
		}
		ecfg.HotSync, ecfg.HotTTL = cfg.HotSyncInterval, cfg.HotTTL
		reg.MustRegister(gateway.ClusterPresenceCollector(
			func() gateway.ClusterPresenceStats { return gateway.ClusterPresenceStats(s.view.Stats()) }, s.view.Stale))
	}
	ecfg.Tuning = cfg.tuning() // reloadable: see reload
	if s.hooks, err = s.newHooks(&ecfg, pres, reg); err != nil {
		return nil, fmt.Errorf("hooks: %w", err)
	}
	hooks := s.hooks // a failing return sets s to nil before this runs
	defer func() {
		if err != nil && hooks != nil {
			hooks.closeFn()
		}
	}()
	s.eng, err = fanout.New(ecfg)
	if err != nil {
		return nil, err
	}
	remote, remoteMembers, reconnected = s.eng.Remote, s.eng.RemoteMembers, s.eng.BusReconnected
	verifier, err := auth.NewVerifier(auth.Config{Secret: []byte(s.jwtSecret)})
	if err != nil {
		return nil, err
	}
	var origins []string
	for _, o := range strings.Split(cfg.AllowedOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	perUser := cfg.MaxConnsPerUser
	if perUser == 0 {
		perUser = -1 // socket: -1 = no cap
	}
	perIP := cfg.MaxConnsPerIP
	if perIP == 0 {
		perIP = -1
	}
	pingRate := cfg.WSPingRate
	if pingRate == 0 {
		pingRate = -1 // socket: -1 = no limit
	}
	ipExempt, err := cfg.ipCapExempt()
	if err != nil {
		return nil, err
	}
	if err := s.newRooms(ctx, reg, verifier); err != nil {
		return nil, err
	}
	// The HTTP port is bound before the socket server is built: the demo's
	// pages on it open sockets from its origin (SiblingPorts).
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	s.ln = ln
	defer func() {
		if err != nil {
			ln.Close() // s is nil on this path
		}
	}()
	var siblings []string
	if s.demoEnabled() {
		_, port, _ := net.SplitHostPort(s.ln.Addr().String())
		siblings = []string{port}
	}
	s.ws, err = socket.New(socket.Config{
		Addr:                cfg.WSAddr,
		IdleTimeout:         cfg.IdleTimeout,
		MaxMessageBytes:     cfg.MaxMessageBytes,
		OutboundBound:       cfg.OutboundBytes,
		LoopQueueBound:      cfg.WSLoopQueue,
		NumLoops:            cfg.WSLoops,
		PingRate:            pingRate,
		PingBurst:           cfg.WSPingBurst,
		UpgradeHold:         cfg.WSUpgradeHold,
		PassYield:           cfg.WSPassYield,
		Deflate:             cfg.WSDeflate,
		DeflateMinBytes:     cfg.WSDeflateMinBytes,
		DeflateLevel:        cfg.WSDeflateLevel,
		MaxConns:            cfg.MaxConns,
		MaxConnsPerIP:       perIP,
		IPv6CapPrefix:       cfg.IPv6CapPrefix,
		MaxConnsPerIPExempt: ipExempt,
		MaxConnsPerUser:     perUser,
		AllowedOrigins:      origins,
		SiblingPorts:        siblings,
		Authenticator:       gateway.SocketAuth(verifier),
		Tickets:             s.rooms,
		Handler:             &gateway.Sockets{Chat: s.chat, Rooms: s.rooms},
		Resync:              gateway.ResyncFrame,
		OnWritePass:         s.engMetrics.ObserveWrites,
		Logger:              log,
	})
	if err != nil {
		return nil, err
	}
	s.chat.Attach(s.eng, s.ws)
	reg.MustRegister(gateway.SocketCollector(s.ws), gateway.PresenceCollector(pres.Stats))

	s.api, err = gateway.NewAPI(gateway.APIConfig{
		Addr:           cfg.HTTPAddr,
		AdminToken:     s.adminToken,
		MetricsToken:   cfg.MetricsToken,
		Verifier:       verifier,
		Logger:         log,
		Ready:          s.st.Ping,
		ReadyEvery:     readyEvery(cfg.ReadyEvery),
		HandlerTimeout: cfg.HTTPRequestTimeout,
		Registry:       reg,
		Registerer:     reg,
	})
	if err != nil {
		return nil, err
	}
	if cfg.Retention > 0 {
		rc := retention.Config{Store: s.st, Keep: cfg.Retention, Interval: cfg.RetentionInterval, Registerer: reg, Logger: log}
		if s.mode == "cluster" && s.rdb != nil {
			// The nodes share one store: one node sweeps each slot of
			// one interval, the first to take its key.
			rc.Lock = func(ctx context.Context, slot int64, lease time.Duration) (bool, error) {
				return s.rdb.SetNX(ctx, fmt.Sprintf("%sretention:slot:%d", cfg.RedisPrefix, slot), cfg.NodeID, lease).Result()
			}
		}
		if s.sweeper, err = retention.New(rc); err != nil {
			return nil, err
		}
	}
	gateway.Routes(s.api, s.eng, gateway.RoutesConfig{Limiter: s.lim.shared, ApplyLimits: s.lim.apply, Rooms: s.wr, PageBytes: cfg.PageBytes, SyncPage: cfg.SyncPage})
	gateway.RoomRoutes(s.api, s.rooms)
	if err := s.newEvents(verifier, perUser, perIP, ipExempt, reg); err != nil {
		return nil, err
	}
	gateway.TuningRoutes(s.api, s.eng)
	online := gateway.OnlineConfig{View: presence.NewEmbedded(pres, cfg.NodeID), Scope: gateway.OnlineScopeNode,
		Here: pres.OnlineCount, Store: s.st, Groups: pres.AppendGroups}
	if s.view != nil {
		online.View, online.Scope = s.view, gateway.OnlineScopeCluster
	}
	if err := gateway.OnlineRoutes(s.api, online); err != nil {
		return nil, err
	}
	fc := gateway.PresenceFeedConfig{Index: pres, Store: s.st, Levels: s.eng.Levels(), Send: s.chat.SendPresence,
		Interval: cfg.PresenceInterval, ListMax: listOff(cfg.PresenceListMax), EventsMax: listOff(cfg.PresenceEventsMax),
		MaxEvents: cfg.PresenceMaxEvents, Logger: log}
	if s.view != nil {
		fc.Cluster = s.view
	}
	if s.feed, err = gateway.NewPresenceFeed(fc); err != nil {
		return nil, err
	}
	reg.MustRegister(gateway.PresenceFeedCollector(s.feed))
	gateway.PresenceRoutes(s.api, s.feed, s.st, s.lim.shared)
	gateway.StatsRoutes(s.api)
	wc, err := s.webConfig(ctx, sdkFiles)
	if err != nil {
		return nil, err
	}
	if err := web.Register(s.api, wc); err != nil {
		return nil, err
	}
	return s, nil
}

// listOff maps a presence threshold flag (0 = off) to the feed's (negative
// = off, 0 = its default).
func listOff(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// newRooms builds the waiting room: on Redis in cluster mode (with a
// node-local fallback queue), in-process otherwise, kept in the embedded
// store so that rooms and their queues survive a restart.
func (s *server) newRooms(ctx context.Context, reg prometheus.Registerer, users gateway.Verifier) error {
	var signer *roomtoken.Signer
	var err error
	if s.cfg.RoomKeyFile != "" {
		var key ed25519.PrivateKey
		if key, err = s.cfg.roomKey(); err == nil {
			signer, err = roomtoken.NewEdDSA(key)
		}
	} else {
		signer, err = roomtoken.NewHS256([]byte(s.roomSecret))
	}
	if err != nil {
		return err
	}
	cfg := waitroom.Config{Node: s.cfg.NodeID, Signer: signer, Logger: s.log, Registerer: reg,
		FallbackShare: 1 / float64(s.cfg.ExpectedNodes), AdmitQuota: s.lim.RoomQuota}
	if s.rdb != nil {
		b, err := redisroom.New(redisroom.Config{Client: s.rdb, Prefix: s.cfg.RedisPrefix + "room:",
			EnterBatch: s.cfg.RoomEnterBatch, EnterInFlight: s.cfg.RoomEnterInFlight})
		if err != nil {
			return err
		}
		cfg.Backend = b
	} else if s.roomJournal != nil {
		if cfg.Backend, err = waitroom.OpenMemory(ctx, s.roomJournal, waitroom.MemoryConfig{}); err != nil {
			return err
		}
	}
	if s.wr, err = waitroom.New(cfg); err != nil {
		return err
	}
	tickets, err := s.roomTickets()
	if err != nil {
		return err
	}
	s.rooms, err = gateway.NewRooms(gateway.RoomsConfig{Manager: s.wr, Limiter: s.lim.node, Logger: s.log,
		Tickets: tickets, Users: users, MaxPollers: s.cfg.RoomMaxPollers,
		PollMin: s.cfg.RoomPollMin, PollMax: s.cfg.RoomPollMax, PollGrace: s.cfg.RoomPollGrace,
		ClientIPHeader: s.cfg.RoomClientIPHeader, AccessCookieDomain: s.cfg.RoomCookieDomain})
	return err
}

// roomTickets builds the ticket signer: -room-ticket-secret, or a key
// derived (HKDF, its own label) from the access tokens' secret or private
// key, which every node of a cluster shares already.
func (s *server) roomTickets() (*gateway.RoomTickets, error) {
	var key []byte
	var err error
	switch {
	case s.cfg.RoomTicketSecret != "":
		key = []byte(s.cfg.RoomTicketSecret)
	case s.cfg.RoomKeyFile != "":
		var priv ed25519.PrivateKey
		if priv, err = s.cfg.roomKey(); err == nil {
			key, err = gateway.DeriveTicketKey(priv.Seed())
		}
	default:
		key, err = gateway.DeriveTicketKey([]byte(s.roomSecret))
	}
	if err != nil {
		return nil, fmt.Errorf("room tickets: %w", err)
	}
	return gateway.NewRoomTickets(key, s.cfg.RoomTicketTTL)
}

// secrets fills in the JWT secret and admin token when they are not
// configured. In embedded mode they are kept in the data directory, so that
// tokens survive restarts of a development node.
func (s *server) secrets() error {
	roomKeyed := s.roomSecret != "" || s.cfg.RoomKeyFile != ""
	if s.jwtSecret != "" && s.adminToken != "" && roomKeyed {
		return nil
	}
	var saved struct {
		JWTSecret  string `json:"jwt_secret"`
		AdminToken string `json:"admin_token"`
		RoomSecret string `json:"room_token_secret"`
	}
	path := ""
	if s.mode == "embedded" {
		path = filepath.Join(s.cfg.DataDir, "dev-secrets.json")
		if b, err := os.ReadFile(path); err == nil {
			if err := json.Unmarshal(b, &saved); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	if saved.JWTSecret == "" {
		saved.JWTSecret = randomHex(32)
	}
	if saved.AdminToken == "" {
		saved.AdminToken = randomHex(24)
	}
	if saved.RoomSecret == "" {
		saved.RoomSecret = randomHex(32)
	}
	if s.mode == "cluster" {
		// Generated secrets differ per process: tokens would verify on
		// this node only, and only until it restarts.
		for _, m := range []struct {
			missing bool
			flag    string
		}{
			{s.jwtSecret == "", "-jwt-secret"}, {s.adminToken == "", "-admin-token"}, {!roomKeyed, "-room-token-secret"},
		} {
			if m.missing {
				s.log.Warn("cluster mode without "+m.flag+": using a random per-process value; set it on every node", "flag", m.flag)
			}
		}
	}
	if s.roomSecret == "" {
		s.roomSecret = saved.RoomSecret
	}
	if s.mode == "embedded" {
		s.devJWT, s.devAdmin = s.jwtSecret == "", s.adminToken == ""
		s.devRoom = s.cfg.RoomSecret == "" && s.cfg.RoomKeyFile == ""
	}
	if s.jwtSecret == "" {
		s.jwtSecret = saved.JWTSecret
	}
	if s.adminToken == "" {
		s.adminToken = saved.AdminToken
	}
	if path != "" {
		b, _ := json.Marshal(saved)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// wsAddr and httpAddr are the listening addresses (after run started).
func (s *server) httpAddr() string { return s.ln.Addr().String() }

func (s *server) wsAddr() string {
	<-s.ws.Ready()
	if a := s.ws.Addr(); a != nil {
		return a.String()
	}
	return ""
}

// run serves until ctx is done, then drains: the engine commits and acks
// what is queued, connections get close 1001, the API finishes in-flight
// requests; all within cfg.ShutdownTimeout.
func (s *server) run(ctx context.Context, ready func()) error {
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 10+len(s.lim.runs))
	n := 0
	start := func(name string, fn func(context.Context) error) {
		n++
		go func() {
			err := fn(runCtx)
			if err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			errc <- err
		}()
	}
	start("engine", s.eng.Run)
	start("chat", s.chat.Run)
	// The stored waiting rooms load before the listeners open: a room kept
	// across a restart asked for too early would be answered unknown.
	start("waitroom", s.wr.Run)
	select {
	case <-s.wr.Loaded():
	case <-ctx.Done():
	case <-time.After(s.cfg.RoomLoadWait):
		s.log.Warn("waiting rooms not loaded yet; serving without them until they are", "after", s.cfg.RoomLoadWait.String())
	}
	start("websocket", s.ws.Run)
	start("http", func(ctx context.Context) error { return s.api.Serve(ctx, s.ln) })
	if s.bus != nil {
		start("bus", s.bus.Run)
	}
	if s.view != nil {
		start("presence view", s.view.Run)
	}
	start("presence feed", s.feed.Run)
	start("room sockets", s.rooms.Run)
	if s.events != nil {
		start("event streams", s.events.Run)
	}
	if s.sweeper != nil {
		start("retention", s.sweeper.Run)
	}
	for _, fn := range s.lim.runs {
		start("limiter", fn)
	}
	if s.hooks != nil {
		start("hook events", s.hooks.stream.Run)
	}
	rel := &releaser{
		upgrades: func() uint64 { return s.ws.Stats().Upgrades },
		after:    uint64(s.cfg.MemReleaseUpgrades),
		quiet:    s.cfg.MemReleaseQuiet,
		gap:      s.cfg.MemReleaseGap,
		release:  debug.FreeOSMemory,
		log:      s.log,
	}
	start("memory release", rel.Run)
	if s.cfg.PprofAddr != "" {
		start("pprof", func(ctx context.Context) error { return servePprof(ctx, s.cfg.PprofAddr, s.log) })
	}

	var failed error
	select {
	case <-ctx.Done():
	case <-s.ws.Ready():
		if s.ws.Addr() == nil {
			failed = <-errc
			n--
		} else {
			if ready != nil {
				ready()
			}
			select {
			case <-ctx.Done():
			case failed = <-errc:
				n--
			}
		}
	}
	s.log.Info("draining", "timeout", s.cfg.ShutdownTimeout.String(), "cause", cause(ctx, failed))
	s.api.Drain()  // readyz answers 503 from now on: load balancers stop sending
	s.chat.Drain() // new sockets are refused with 503
	dctx, dcancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer dcancel()
	var errs []error
	if err := s.eng.Shutdown(dctx); err != nil {
		errs = append(errs, fmt.Errorf("engine drain: %w", err))
	}
	if s.bus != nil {
		if err := s.bus.Shutdown(dctx); err != nil { // sends what the drain committed
			errs = append(errs, fmt.Errorf("bus drain: %w", err))
		}
	}
	if err := s.wr.Shutdown(dctx); err != nil {
		errs = append(errs, fmt.Errorf("waitroom drain: %w", err))
	}
	if err := s.ws.Shutdown(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		errs = append(errs, fmt.Errorf("websocket drain: %w", err))
	}
	if s.events != nil {
		// The streams end with a close event (1001): their clients
		// reconnect elsewhere, and the API's drain finds them gone.
		if err := s.events.Shutdown(dctx); err != nil {
			errs = append(errs, fmt.Errorf("event streams drain: %w", err))
		}
	}
	if s.view != nil {
		// The sockets are closed: withdraw this node's bits so that other
		// nodes stop counting its users now rather than after the TTL.
		// A failure is not a failed drain: the bits expire by themselves.
		// Its own short deadline: the socket drain may have used dctx up.
		wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := s.view.Shutdown(wctx)
		wcancel()
		if err != nil {
			s.log.Warn("presence view: withdraw failed; other nodes count this node's users until the TTL",
				"ttl", s.cfg.PresenceTTL.String(), "err", err)
		}
	}
	if s.hooks != nil {
		s.drainHooks() // after the engine (its last acks) and the sockets (their disconnects)
	}
	if err := s.api.Shutdown(dctx); err != nil {
		errs = append(errs, err)
	}
	cancel()
	for ; n > 0; n-- {
		if err := <-errc; err != nil && !errors.Is(err, socket.ErrServerClosed) && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if s.hooks != nil {
		if err := s.hooks.closeFn(); err != nil {
			errs = append(errs, fmt.Errorf("event journal close: %w", err))
		}
	}
	if err := s.st.Close(); err != nil {
		errs = append(errs, fmt.Errorf("store close: %w", err))
	}
	if s.rdb != nil {
		s.rdb.Close()
	}
	if failed != nil {
		errs = append([]error{failed}, errs...)
	}
	s.log.Info("stopped")
	return errors.Join(errs...)
}

// reload applies the reloadable settings (SIGHUP). With a -config file it
// loads the configuration again as at start (flags > environment > file >
// default) and puts its engine tuning in force; settings that need a
// restart and changed are named in a warning and left as they are. Then it
// re-reads the limits file. A part without its file (-config,
// -limits-file) has nothing to re-read: what the admin API set stays in
// force. The parts are independent: a bad config file does not stop the
// limits reload, and a failed part changes nothing of its own.
func (s *server) reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	var errs []error
	if err := s.reloadConfig(); err != nil {
		s.log.Error("reload failed; keeping the settings in force", "config_file", s.cfg.ConfigFile, "err", err)
		errs = append(errs, err)
	}
	switch {
	case s.cfg.LimitsFile == "":
		s.log.Info("reload: no -limits-file; nothing to re-read")
	default:
		if err := s.lim.reload(s.cfg.LimitsFile); err != nil {
			s.log.Error("reload failed; keeping the settings in force", "limits_file", s.cfg.LimitsFile, "err", err)
			errs = append(errs, err)
			break
		}
		s.log.Info("reloaded", "limits_file", s.cfg.LimitsFile)
	}
	return errors.Join(errs...)
}

// reloadConfig re-reads the -config file with the original arguments and
// environment and applies the engine tuning it yields.
func (s *server) reloadConfig() error {
	if s.cfg.ConfigFile == "" {
		s.log.Info("reload: no -config file; engine settings unchanged")
		return nil
	}
	if s.cfg.getenv == nil {
		return errors.New("reload: the configuration was not loaded from flags, environment and file")
	}
	next, err := loadConfig(s.cfg.args, s.cfg.getenv, io.Discard)
	if err != nil {
		return err
	}
	if _, restart := s.cfg.changedFlags(next); len(restart) > 0 {
		s.log.Warn("reload: changed settings need a restart; they keep their start values", "settings", restart)
	}
	before := s.eng.Tuning()
	if err := s.eng.SetTuning(next.tuning()); err != nil {
		return err
	}
	s.log.Info("reloaded", "config_file", s.cfg.ConfigFile, "engine_changed", s.eng.Tuning().Diff(before))
	return nil
}

func cause(ctx context.Context, failed error) string {
	if failed != nil {
		return failed.Error()
	}
	if ctx.Err() != nil {
		return "signal"
	}
	return "unknown"
}
