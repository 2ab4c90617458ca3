package main

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/waitroom/redisroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
	"github.com/fanfare-im/fanfare/gateway"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter/redislimit"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/postgres"
	"github.com/fanfare-im/fanfare/web"
)

// config is every setting of fanfared. Precedence, for each field: flag >
// FANFARE_<FLAG_NAME> environment > JSON config file (-config) > default.
type config struct {
	WSAddr         string
	HTTPAddr       string
	DataDir        string
	PostgresURL    string
	PostgresSchema string
	// PostgresAppendStatements is the most Append statements the Postgres
	// store runs at once; concurrent appends beyond it merge into the next
	// statement. 0 = no merging.
	PostgresAppendStatements int
	RedisAddr                string
	RedisPrefix              string
	RoomSecret               string
	RoomKeyFile              string
	// RoomLoadWait bounds how long the node waits at start for the stored
	// waiting rooms to load before it opens its listeners.
	RoomLoadWait time.Duration
	// The waiting rooms' HTTP polling path and site (docs/protocol.md §8.8).
	RoomTicketSecret   string
	RoomTicketTTL      time.Duration
	RoomMaxPollers     int
	RoomPollMin        time.Duration
	RoomPollMax        time.Duration
	RoomPollGrace      time.Duration
	RoomClientIPHeader string
	RoomCookieDomain   string
	RoomEnterBatch     int // the Redis room backend's batching of enters (redisroom.Config)
	RoomEnterInFlight  int
	JWTSecret          string
	AdminToken         string
	MetricsToken       string
	PprofAddr          string
	// MemReleaseUpgrades: after this many WebSocket upgrades followed by
	// MemReleaseQuiet without one, the free heap goes back to the
	// operating system (releaser); 0 = never.
	MemReleaseUpgrades int
	MemReleaseQuiet    time.Duration
	MemReleaseGap      time.Duration
	AllowedOrigins     string
	NodeID             string
	Shards             int
	MaxMessageBytes    int
	MaxGID             int64
	Heartbeat          time.Duration
	IdleTimeout        time.Duration
	OutboundBytes      int
	PageBytes          int
	SyncPage           int
	WSLoopQueue        int
	WSLoops            int
	// The gateway's worker pools: blocking frame work (pull, read, remote
	// send checks) and the registration of new connections, each with its
	// queue bound; RequestTimeout bounds one blocking request.
	FrameWorkers   int
	FrameQueue     int
	ConnectWorkers int
	ConnectQueue   int
	RequestTimeout time.Duration
	// HTTPRequestTimeout bounds one HTTP API request's handler (its store
	// and engine calls); past it the request is answered 503.
	HTTPRequestTimeout time.Duration
	WSPingRate         int
	WSPingBurst        int
	WSUpgradeHold      time.Duration
	WSPassYield        time.Duration
	// WSDeflate negotiates permessage-deflate; pushes are compressed once
	// per frame for all deflate recipients.
	WSDeflate         bool
	WSDeflateMinBytes int
	WSDeflateLevel    int
	MaxConns          int
	MaxConnsPerIP     int
	// IPv6CapPrefix: IPv6 clients count per block of this prefix length
	// for MaxConnsPerIP.
	IPv6CapPrefix int
	// IPCapExempt lists the CIDR prefixes (comma-separated) the per-IP
	// cap does not apply to.
	IPCapExempt     string
	MaxConnsPerUser int
	ShutdownTimeout time.Duration
	ReadyEvery      time.Duration
	LimitsFile      string
	ExpectedNodes   int
	// LimitsBatch: Redis limit decisions of concurrent requests decided
	// together by one script call, at most this many (0 = one call per
	// decision); LimitsBatchInflight such calls in flight at once.
	LimitsBatch         int
	LimitsBatchInflight int
	// LimitsLeaseTTL: how long this node spends a lease of a hot
	// sliding-window counter before renewing it (0 = no leases);
	// LimitsLeaseMax the most units of one lease; LimitsLeaseMinHits the
	// units a counter must be asked for on the node within one TTL before
	// it is leased (redislimit.Config).
	LimitsLeaseTTL     time.Duration
	LimitsLeaseMax     int64
	LimitsLeaseMinHits int64
	// The cluster presence view in Redis (with -redis-addr only): how often
	// this node publishes its online bits, and how long they outlive the
	// node's last publication.
	PresenceFlushInterval time.Duration
	PresenceTTL           time.Duration
	// BusTailDelay: a group quiet this long after a message gets a tail
	// hint on the bus (bus.Config.TailDelay); 0 = none.
	BusTailDelay time.Duration
	// The cluster hot set in Redis (with -redis-addr only): how often this
	// node publishes its hot groups and reads the others', and how long a
	// mark outlives the node's last publication.
	HotSyncInterval time.Duration
	HotTTL          time.Duration
	// The member presence feed (docs/architecture.md §7.1): its period,
	// the group sizes that are listed and that get join/leave events, and
	// the uids of one frame's event list.
	PresenceInterval  time.Duration
	PresenceListMax   int
	PresenceEventsMax int
	PresenceMaxEvents int
	// Retention: messages older than this are deleted (0 = kept forever),
	// in rounds every RetentionInterval.
	Retention         time.Duration
	RetentionInterval time.Duration
	LogLevel          string
	ConfigFile        string

	// The browser pages (package web): Demo is auto, on or off (auto = on
	// in embedded mode); the development token route of the demo exists
	// in embedded mode only, signing tokens of DemoTokenTTL at most
	// DemoTokenRate per second (DemoTokenBurst at once), for demo groups
	// of at most DemoMaxMembers members.
	Demo           string
	DemoTokenTTL   time.Duration
	DemoTokenRate  float64
	DemoTokenBurst int
	DemoMaxMembers int
	AdminConsole   bool
	// RoomPage serves the hosted waiting-room page at /rooms/{room}/;
	// RoomPageWSURL is the public WebSocket base it opens the room socket
	// on (empty = the page's host on the WebSocket port).
	RoomPage      bool
	RoomPageWSURL string

	// Engine: HotShards and the member cache are fixed at start; Tuning
	// (merge windows, group limits, triggers, hot groups, tier 2) is
	// reloadable, one flag a field (tuningFlags); zero = the engine's
	// default.
	HotShards      int
	MemberCache    int
	MemberCacheTTL time.Duration
	// TouchInterval and TouchPendingMax coalesce the users' last-active
	// writes of connects (fanout.Config); zero = the engine's default.
	TouchInterval   time.Duration
	TouchPendingMax int
	// The feed of membership additions (cluster mode): how often it is
	// read and how many additions a read takes; zero = the engine's
	// default.
	MemberFeedInterval time.Duration
	MemberFeedPage     int
	// MemberFeedGrace, MemberFeedKickGap and MemberFeedPendingMax are
	// fanout's feed repair bounds (fanout.Config).
	MemberFeedGrace      time.Duration
	MemberFeedKickGap    time.Duration
	MemberFeedPendingMax int
	fanout.Tuning
	// The application hooks (hooks.go).
	hookConfig
	// SSE is the Server-Sent Events transport (sse.go).
	SSE sseConfig

	// What loadConfig read, so that a reload (SIGHUP) re-reads the
	// sources with the same precedence: the arguments, the environment,
	// and every flag's value as loaded (flag name -> value).
	args   []string
	getenv func(string) string
	values map[string]string
}

// defaultMaxConnsPerIP is the per-address cap of a public port: far above
// what the users behind one NAT open (a client holds one or two
// connections), far below what one host would need to take a node's
// connections (the fd limit, about 20,000 on the project's machines).
const defaultMaxConnsPerIP = 1024

// maxAppendStatements bounds -postgres-append-statements: each statement
// holds a pooled connection, and past a few the merged statements only
// get smaller.
const maxAppendStatements = 64

// ipCapExempt parses -max-conns-per-ip-exempt.
func (c *config) ipCapExempt() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(c.IPCapExempt, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("max-conns-per-ip-exempt: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// tuning returns the engine's reloadable settings (zero = default).
func (c *config) tuning() fanout.Tuning { return c.Tuning }

// tuningFlagName is the flag of a fanout.Tuning setting: its JSON name
// with dashes (merge_window -> merge-window).
func tuningFlagName(name string) string { return strings.ReplaceAll(name, "_", "-") }

// tuningFlags are the flags of the reloadable engine settings.
var tuningFlags = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range fanout.TuningNames() {
		m[tuningFlagName(n)] = true
	}
	return m
}()

// tuningFlag registers one flag for each fanout.Tuning field, named,
// explained and grouped by the field's tags; its default is zero (the
// engine's default, which the help text says).
func (c *config) tuningFlag(fs *flag.FlagSet) {
	for _, s := range fanout.TuningSettings() {
		name := tuningFlagName(s.Name)
		switch p := s.Field(&c.Tuning).(type) {
		case *time.Duration:
			fs.DurationVar(p, name, 0, s.Usage)
		case *int:
			fs.IntVar(p, name, 0, s.Usage)
		case *int64:
			fs.Int64Var(p, name, 0, s.Usage)
		case *float64:
			fs.Float64Var(p, name, 0, s.Usage)
		case *bool:
			fs.BoolVar(p, name, false, s.Usage)
		default:
			panic(fmt.Sprintf("fanout.Tuning %s: no flag for a %T", s.Name, p))
		}
	}
}

// envName derives the environment variable of a flag: ws-addr -> FANFARE_WS_ADDR.
func envName(flagName string) string {
	return "FANFARE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (c *config) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.WSAddr, "ws-addr", "127.0.0.1:8081", "WebSocket listen address (paths /ws and /rooms/{room}/ws)")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:8080", "HTTP API listen address")
	fs.StringVar(&c.DataDir, "data-dir", "./data", "embedded store directory (embedded mode only)")
	fs.StringVar(&c.PostgresURL, "postgres-url", "", "Postgres URL; empty = embedded store in -data-dir")
	fs.StringVar(&c.PostgresSchema, "postgres-schema", "", "Postgres schema for fanfare's tables; empty = public")
	fs.IntVar(&c.PostgresAppendStatements, "postgres-append-statements", postgres.DefaultAppendStatements,
		"Postgres append statements in flight at once; appends arriving meanwhile merge into the next one (one transaction); 0 = no merging, each append its own transaction")
	fs.StringVar(&c.RedisAddr, "redis-addr", "", "cluster mode (with -postgres-url): Redis address; empty = in-process presence, limits and rooms")
	fs.StringVar(&c.RedisPrefix, "redis-prefix", "fanfare:", "prefix of every Redis key and channel (several deployments may share one Redis)")
	fs.StringVar(&c.RoomSecret, "room-token-secret", "", "HS256 secret (>= 32 bytes) of waiting-room access tokens; empty = random (embedded mode: kept in -data-dir)")
	fs.DurationVar(&c.RoomLoadWait, "room-load-wait", 10*time.Second, "at start, the listeners open once the stored waiting rooms are loaded, or after this long (then a room not loaded yet is answered unknown until it is; the load is retried in the background)")
	fs.StringVar(&c.RoomTicketSecret, "room-ticket-secret", "", "HMAC key (>= 32 bytes) of waiting-room tickets (the HTTP polling path's visitor identity, also the room socket's ?ticket=); empty = derived (HKDF) from -room-token-secret or -room-token-key, so nodes sharing those share tickets")
	fs.DurationVar(&c.RoomTicketTTL, "room-ticket-ttl", time.Hour, "lifetime of a waiting-room ticket (1m..720h); answers renew it once half is used")
	fs.IntVar(&c.RoomEnterBatch, "room-enter-batch", redisroom.DefaultEnterBatch, "with Redis: the most users one enter script call carries (a room's enters arriving while -room-enter-inflight calls are under way go together; 1 = every enter alone)")
	fs.IntVar(&c.RoomEnterInFlight, "room-enter-inflight", redisroom.DefaultEnterInFlight, "with Redis: the most enter script calls of one room under way at once from this node")
	fs.IntVar(&c.RoomMaxPollers, "room-max-pollers", 100_000, "polling visitors (HTTP polling path) held on this node over all rooms; past it enter and status answer 503 room_full")
	fs.DurationVar(&c.RoomPollMin, "room-poll-min", time.Second, "shortest poll interval suggested to a polling visitor (poll_after_ms, near the head of the queue)")
	fs.DurationVar(&c.RoomPollMax, "room-poll-max", 20*time.Second, "longest poll interval suggested to a polling visitor (deep in the queue)")
	fs.DurationVar(&c.RoomPollGrace, "room-poll-grace", 10*time.Second, "a polling visitor is away (as after a closed socket) once no poll came for twice the suggested interval plus this")
	fs.StringVar(&c.RoomClientIPHeader, "room-client-ip-header", "", "header a trusted reverse proxy sets to the client address (X-Forwarded-For: last entry; X-Real-IP), for the per-address enter limit (room_enter_ip); empty = the connection's address")
	fs.StringVar(&c.RoomCookieDomain, "room-access-cookie-domain", "", "Domain of the access-token cookie set for sites with token_in cookie (a parent domain shared by fanfare and the site, e.g. example.com); empty = fanfare's host only")
	fs.StringVar(&c.RoomKeyFile, "room-token-key", "", "Ed25519 private key (PKCS#8 PEM file, e.g. from openssl genpkey -algorithm ed25519) signing waiting-room access tokens with EdDSA: protected services verify them with the public key (GET /v1/rooms/jwks); excludes -room-token-secret")
	fs.StringVar(&c.JWTSecret, "jwt-secret", "", "HS256 secret for user tokens; empty = random, printed at start")
	fs.StringVar(&c.PprofAddr, "pprof-addr", "", "listen address of Go's profiling endpoints (/debug/pprof/, net/http/pprof) on a listener of their own, without authentication: keep it on loopback or a private network; empty = off")
	fs.IntVar(&c.MemReleaseUpgrades, "mem-release-upgrades", 1000, "after this many WebSocket upgrades followed by -mem-release-quiet without one, run one full collection and return the free heap to the operating system (the upgrades' garbage; costs one collection per burst); 0 = never (the runtime's scavenger returns it over minutes)")
	fs.DurationVar(&c.MemReleaseGap, "mem-release-gap", time.Minute, "least time between two releases of -mem-release-upgrades, so clients reconnecting in bursts cannot make the node collect more often (0..1h)")
	fs.DurationVar(&c.MemReleaseQuiet, "mem-release-quiet", time.Second, "upgrade-free time that ends a burst of upgrades for -mem-release-upgrades (also how often it is checked)")
	fs.StringVar(&c.MetricsToken, "metrics-token", "", "bearer token /metrics requires (Prometheus: authorization credentials); empty = /metrics is open")
	fs.StringVar(&c.AdminToken, "admin-token", "", "admin API bearer token; empty = random, printed at start")
	fs.StringVar(&c.AllowedOrigins, "allowed-origins", "", "comma-separated allowed WebSocket origins; * = any; empty = same host only")
	fs.StringVar(&c.NodeID, "node-id", "", "node name in hello frames and cluster keys; empty = hostname-pid")
	fs.IntVar(&c.Shards, "shards", 4, "engine shard workers")
	fs.IntVar(&c.MaxMessageBytes, "max-message-bytes", 64<<10, "largest client WebSocket message (bytes)")
	fs.Int64Var(&c.MaxGID, "max-gid", store.DefaultMaxGID, "largest group id, chosen by an admin or assigned (assigned ids count up from 1; explicit ones do not move them); default 2^53-1, the largest a JavaScript client reads exactly")
	fs.DurationVar(&c.Heartbeat, "heartbeat", 30*time.Second, "client heartbeat interval announced in hello")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 90*time.Second, "close connections silent for this long")
	fs.IntVar(&c.OutboundBytes, "outbound-bytes", 1<<20, "per-connection outbound bound (bytes); past it pushes are dropped and resync sent")
	fs.IntVar(&c.PageBytes, "page-bytes", 0, "byte budget of one page of messages (pull answer, GET /v1/groups/{gid}/messages); a page stops before it and says where to continue (next_seq); at least "+strconv.Itoa(gateway.MinPageBytes)+" (one message of the largest body), at most -outbound-bytes; 0 = "+strconv.Itoa(gateway.DefaultPageBytes)+" or half of -outbound-bytes if smaller")
	fs.IntVar(&c.SyncPage, "sync-page", gateway.DefaultSyncPage, "groups in one GET /v1/sync answer (read from the store as one bounded page, in gid order); more are continued through the answer's next_after cursor (after_gid); 1.."+strconv.Itoa(gateway.MaxSyncPage))
	fs.IntVar(&c.FrameWorkers, "frame-workers", gateway.DefaultWorkers, "goroutines running the blocking work of client frames (pull, read, remote send checks) off the event loops")
	fs.IntVar(&c.FrameQueue, "frame-queue", gateway.DefaultWorkQueue, "frame work waiting for a frame worker; past it a frame is answered overloaded")
	fs.IntVar(&c.ConnectWorkers, "connect-workers", gateway.DefaultConnectWorkers, "goroutines registering new connections (a pool of their own, so that no flood of frames delays connects)")
	fs.IntVar(&c.ConnectQueue, "connect-queue", gateway.DefaultConnectQueue, "new connections waiting for a connect worker; past it a new connection is closed with 1013")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", gateway.DefaultRequestTimeout, "bound of one blocking request of a client frame (a pull, a read mark, a remote send check)")
	fs.DurationVar(&c.HTTPRequestTimeout, "http-request-timeout", gateway.DefaultHandlerTimeout, "bound of one HTTP API request (its store and engine calls); past it the request is answered 503 unavailable; at most 30s (the HTTP write timeout)")
	fs.IntVar(&c.WSLoops, "ws-loops", 0, "WebSocket event loops; 0 = one per Go processor (GOMAXPROCS, the CPUs the process may run on)")
	fs.IntVar(&c.WSLoopQueue, "ws-loop-queue", socket.DefaultLoopQueueBound, "frames queued per WebSocket event loop; past it broadcast deliveries are refused and the connections get resync")
	fs.IntVar(&c.WSPingRate, "ws-ping-rate", socket.DefaultPingRate, "WebSocket pings per second a connection may send on average (each is answered with a write); past it and -ws-ping-burst the connection is closed (1008); 0 = no limit")
	fs.IntVar(&c.WSPingBurst, "ws-ping-burst", socket.DefaultPingBurst, "WebSocket pings a connection may send at once")
	fs.DurationVar(&c.WSUpgradeHold, "ws-upgrade-hold", 100*time.Millisecond, "the 101 of a WebSocket upgrade waits up to this long for hello and goes out with it in one write; 0 = the 101 at once (0..10s)")
	fs.DurationVar(&c.WSPassYield, "ws-pass-yield", socket.DefaultPassYield, "an event loop's write pass lets the node's other goroutines (HTTP handlers, shard workers, store commits) run at least this often; matters with one Go processor; negative (-1ns) = never; at most 1s")
	fs.BoolVar(&c.WSDeflate, "ws-deflate", false, "negotiate permessage-deflate with clients that offer it (browsers do): each push is compressed once for all its deflate recipients; off by default, see docs/benchmarks.md for bytes and CPU")
	fs.IntVar(&c.WSDeflateMinBytes, "ws-deflate-min-bytes", socket.DefaultDeflateMinBytes, "with -ws-deflate, frames smaller than this go out uncompressed")
	fs.IntVar(&c.WSDeflateLevel, "ws-deflate-level", socket.DefaultDeflateLevel, "with -ws-deflate, the compression level, 1 (fastest) to 9")
	fs.IntVar(&c.MaxConns, "max-conns", 0, "node connection cap; 0 = fd limit minus a reserve")
	fs.IntVar(&c.IPv6CapPrefix, "max-conns-per-ip-v6-prefix", socket.DefaultIPv6CapPrefix, "IPv6 clients count as one address per block of this prefix length for -max-conns-per-ip (a host holds a whole /64); 16..128, 128 = per address")
	fs.IntVar(&c.MaxConnsPerIP, "max-conns-per-ip", defaultMaxConnsPerIP, "connections per client IP, handshakes included, checked at accept (429); 0 = unlimited")
	fs.StringVar(&c.IPCapExempt, "max-conns-per-ip-exempt", "127.0.0.0/8,::1/128", "comma-separated CIDR prefixes of client addresses without the per-IP cap (a reverse proxy on the host, load generators); empty = none")
	fs.IntVar(&c.MaxConnsPerUser, "max-conns-per-user", 16, "connections per user; 0 = unlimited")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "graceful drain bound")
	fs.DurationVar(&c.ReadyEvery, "ready-every", time.Second, "how long /readyz reuses its store check (probes are unauthenticated); 0 = every probe")
	fs.StringVar(&c.LimitsFile, "limits-file", "", "JSON rate-limit document (docs/architecture.md §8 rules); empty = defaults; re-read on SIGHUP")
	fs.IntVar(&c.LimitsBatch, "limits-batch", 256, "with -redis-addr: rate-limit decisions of concurrent requests decided by one Redis script call, at most this many; 0 = one call per decision; 0..4096")
	fs.IntVar(&c.LimitsBatchInflight, "limits-batch-inflight", 2, "with -redis-addr and -limits-batch: batched limit calls in flight at once; 1..64")
	fs.DurationVar(&c.LimitsLeaseTTL, "limits-lease-ttl", 0, "with -redis-addr: a sliding-window counter hot on this node is decided here from a lease of its units taken from Redis, spent for at most this long (100ms is a good start); a node may hold up to -limits-lease-max units of a counter that others cannot use meanwhile; 0 = no leases (the default); 0 or 1ms..10s")
	fs.Int64Var(&c.LimitsLeaseMax, "limits-lease-max", redislimit.DefaultLeaseMax, "with -limits-lease-ttl: the most units of one lease (also never more than the rule admits in one lease TTL); 1..10000")
	fs.Int64Var(&c.LimitsLeaseMinHits, "limits-lease-min-hits", redislimit.DefaultLeaseMinHits, "with -limits-lease-ttl: units a counter must be asked for on this node within one lease TTL before it is leased; 1..1000000")
	fs.IntVar(&c.ExpectedNodes, "expected-nodes", 1, "nodes sharing Redis; each enforces 1/N of shared limits while Redis is unreachable")
	fs.DurationVar(&c.PresenceFlushInterval, "presence-flush-interval", time.Second, "how often this node publishes its online members to the Redis presence view (with -redis-addr); the lag of cluster-wide online counts")
	fs.DurationVar(&c.BusTailDelay, "bus-tail-delay", 2*time.Second, "with -redis-addr: a group quiet this long after a message gets one tail hint with its last seq on the bus, so that a node that missed the last batch (a Redis stall) tells its clients to pull it; 0 = no tail hints")
	fs.DurationVar(&c.PresenceTTL, "presence-ttl", 15*time.Second, "a node's online members leave the Redis presence view this long after its last publication (a dead node); must exceed 2 x presence-flush-interval")
	fs.DurationVar(&c.HotSyncInterval, "hot-sync-interval", time.Second, "how often this node publishes its hot groups to the Redis hot set and reads the other nodes' (with -redis-addr); the lag of cluster-wide hot status")
	fs.DurationVar(&c.Retention, "retention", 0, "delete messages older than this (e.g. 2160h for 90 days); 0 = keep every message forever")
	fs.DurationVar(&c.RetentionInterval, "retention-interval", 10*time.Minute, "with -retention: how often expired messages are deleted (one node per round in cluster mode)")
	fs.DurationVar(&c.PresenceInterval, "presence-interval", gateway.DefaultPresenceInterval, "how often each group's online count is pushed to its online members (only when it changed; one frame per group per interval)")
	fs.IntVar(&c.PresenceListMax, "presence-list-max", gateway.DefaultPresenceListMax, "groups with at most this many members get their online members listed (GET /v1/groups/{gid}/online) and kept in Redis; 0 = none, at most 10000")
	fs.IntVar(&c.PresenceEventsMax, "presence-events-max", gateway.DefaultPresenceEventsMax, "groups with at most this many members (and listed) get joined/left uids in their presence frames; larger groups get counts only; 0 = none")
	fs.IntVar(&c.PresenceMaxEvents, "presence-max-events", gateway.DefaultPresenceMaxEvents, "uids of one presence frame's joined and of its left list; past it the frame says more (1..1024)")
	fs.DurationVar(&c.HotTTL, "hot-ttl", 10*time.Second, "a node's hot marks leave the Redis hot set this long after its last publication (a dead node); must exceed 2 x hot-sync-interval")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.ConfigFile, "config", "", "optional JSON file of flag-name: value settings")
	fs.StringVar(&c.Demo, "demo", demoAuto, "the browser demo at /demo/ of the HTTP address: auto (on in embedded mode, off in cluster mode), on or off; in embedded mode it comes with a development-only token route (POST /demo/token), never in cluster mode")
	fs.DurationVar(&c.DemoTokenTTL, "demo-token-ttl", web.DefaultTokenTTL, "lifetime of a token the demo's development token route signs; at most 24h")
	fs.Float64Var(&c.DemoTokenRate, "demo-token-rate", web.DefaultTokenRate, "tokens per second the demo's development token route signs, for the whole node")
	fs.IntVar(&c.DemoTokenBurst, "demo-token-burst", web.DefaultTokenBurst, "tokens the demo's development token route signs at once")
	fs.IntVar(&c.DemoMaxMembers, "demo-max-members", web.DefaultMaxMembers, "members of each demo group; past it the token route refuses new users")
	fs.BoolVar(&c.AdminConsole, "admin-console", true, "serve the admin console at /admin/ of the HTTP address (it signs in with the admin token)")
	fs.BoolVar(&c.RoomPage, "room-page", true, "serve the hosted waiting-room page at /rooms/{room}/ of the HTTP address (what a site sends its visitors to)")
	fs.StringVar(&c.RoomPageWSURL, "room-page-ws-url", "", "public WebSocket base the room page opens /rooms/{room}/ws on, e.g. wss://queue.example.com behind a proxy; empty = the page's host on the -ws-addr port")

	fs.IntVar(&c.HotShards, "hot-shards", 0, "workers of the hot-group pool; 0 = 2")
	fs.IntVar(&c.MemberCache, "member-cache", 0, "senders whose membership is remembered per large or hot group, so non-members and muted members are refused before the group's limits count them; 0 = 4096, negative = off (the store refuses them after they were counted)")
	fs.DurationVar(&c.MemberCacheTTL, "member-cache-ttl", 0, "how long a remembered sender membership is used (changes made through this node apply at once); 0 = 10s")
	fs.DurationVar(&c.TouchInterval, "touch-interval", 0, "how often the users' last-active times of connects are written to the store (each user once, its latest connect; a connect never waits for it): how far last_active_at may lag; 0 = 1s, at most 1m")
	fs.IntVar(&c.TouchPendingMax, "touch-pending-max", 0, "users whose last-active time may wait for -touch-interval; a connect of another user while it is full loses its time (counted) and starts the write at once; 0 = 100000")
	fs.DurationVar(&c.MemberFeedInterval, "member-feed-interval", 0, "with -redis-addr: how often the node reads the store's feed of membership additions, to give members online here the groups whose addition the bus lost (also read at once when a loss shows); 0 = 1s")
	fs.IntVar(&c.MemberFeedPage, "member-feed-page", 0, "with -redis-addr: additions read from the feed per store call (calls go on until it is caught up); 0 = 1000, at most 10000")
	fs.DurationVar(&c.MemberFeedGrace, "member-feed-grace", 0, "with -redis-addr: how long an addition the feed found missing here is left to its hint on the bus before it is repaired; 0 = 2s")
	fs.DurationVar(&c.MemberFeedKickGap, "member-feed-kick-gap", 0, "with -redis-addr: least time between the start of a feed read and one kicked by a loss; 0 = 100ms")
	fs.IntVar(&c.MemberFeedPendingMax, "member-feed-pending-max", 0, "with -redis-addr: additions that may wait out -member-feed-grace; beyond it one found missing is repaired at once; 0 = 100000")
	c.hookFlags(fs)
	c.SSE.flags(fs)
	c.tuningFlag(fs)
}

// flagGroup is one group of flags in the usage text.
type flagGroup struct {
	name, about string
	flags       []string
}

// flagGroups orders fanfared's flags in its usage text (-h). Every flag
// is in exactly one group (TestFlagGroups): a new flag needs a line here,
// except the engine's tuning flags, which follow their group's own in
// fanout.Tuning's field order, grouped by their group tag.
var flagGroups = withTuningFlags([]flagGroup{
	{"general", "the config file, the drain", []string{"config", "shutdown-timeout"}},
	{"network", "listeners, connections and their bounds", []string{"ws-addr", "http-addr", "allowed-origins",
		"max-message-bytes", "heartbeat", "idle-timeout", "outbound-bytes", "page-bytes", "sync-page", "ws-loops", "ws-loop-queue",
		"frame-workers", "frame-queue", "connect-workers", "connect-queue", "request-timeout", "http-request-timeout",
		"ws-ping-rate", "ws-ping-burst", "ws-upgrade-hold", "ws-pass-yield", "ws-deflate", "ws-deflate-min-bytes", "ws-deflate-level", "max-conns", "max-conns-per-ip", "max-conns-per-ip-v6-prefix", "max-conns-per-ip-exempt", "max-conns-per-user"}},
	{"sse", "the Server-Sent Events fallback for clients without WebSocket", sseFlags},
	{"auth", "user tokens and the admin API", []string{"jwt-secret", "admin-token"}},
	{"store", "where messages and groups are kept, and for how long", []string{"data-dir", "postgres-url", "postgres-schema", "postgres-append-statements", "max-gid",
		"retention", "retention-interval"}},
	{"engine", "shards, queues, merge windows, tier 2", []string{"shards", "hot-shards", "member-cache", "member-cache-ttl", "touch-interval", "touch-pending-max"}},
	{"limits", "rate limits of users and large groups", []string{"limits-file", "limits-batch", "limits-batch-inflight", "limits-lease-ttl", "limits-lease-max", "limits-lease-min-hits"}},
	{"levels", "degradation triggers and hot groups", nil},
	{"presence", "online counts, lists and join/leave events pushed to members", []string{"presence-interval", "presence-list-max",
		"presence-events-max", "presence-max-events"}},
	{"rooms", "waiting rooms: access tokens, loading at start", []string{"room-token-secret", "room-token-key", "room-load-wait",
		"room-ticket-secret", "room-ticket-ttl", "room-max-pollers", "room-poll-min", "room-poll-max", "room-poll-grace",
		"room-client-ip-header", "room-access-cookie-domain", "room-enter-batch", "room-enter-inflight"}},
	{"cluster", "Redis and the nodes sharing it", []string{"redis-addr", "redis-prefix", "node-id", "expected-nodes",
		"presence-flush-interval", "presence-ttl", "hot-sync-interval", "hot-ttl", "bus-tail-delay", "member-feed-interval", "member-feed-page", "member-feed-grace", "member-feed-kick-gap", "member-feed-pending-max"}},
	{"observability", "logs, probes and metrics", []string{"log-level", "ready-every", "metrics-token", "pprof-addr", "mem-release-upgrades", "mem-release-quiet", "mem-release-gap"}},
	{"hooks", "the before-send hook and the event stream", hookFlagNames},
	{"web", "the browser demo, the admin console and the waiting-room page", []string{"demo", "demo-token-ttl", "demo-token-rate", "demo-token-burst",
		"demo-max-members", "admin-console", "room-page", "room-page-ws-url"}},
})

// withTuningFlags appends each tuning flag to the group its setting names.
func withTuningFlags(gs []flagGroup) []flagGroup {
	for _, s := range fanout.TuningSettings() {
		i := slices.IndexFunc(gs, func(g flagGroup) bool { return g.name == s.Group })
		if i < 0 {
			panic(fmt.Sprintf("fanout.Tuning %s: no flag group %q", s.Name, s.Group))
		}
		gs[i].flags = append(gs[i].flags, tuningFlagName(s.Name))
	}
	return gs
}

// exitStatus ends the usage text; main follows it (exitCode).
const exitStatus = `exit status: 0 after a clean shutdown (SIGINT, SIGTERM) or -h, 1 runtime
failure (a listener, the store or Redis failed), 2 usage error (unknown
flag, bad value, invalid configuration).`

// printUsage writes fanfared's usage text, its flags by group, to w.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `usage: fanfared [flags]

fanfared is the fanfare server. With no flags it runs in embedded mode: one
node, its store in -data-dir, nothing else to install. -postgres-url makes
it a cluster node, -redis-addr shares presence, limits, hot groups and rooms
between the nodes. Each setting is a flag, the FANFARE_* variable shown
beside it, or a key of the -config file, in that order of precedence;
docs/operations.md section 2 explains them.
`)
	for _, g := range flagGroups {
		fmt.Fprintf(w, "\n%s (%s):\n", g.name, g.about)
		for _, name := range g.flags {
			if f := fs.Lookup(name); f != nil {
				printFlag(w, f)
			}
		}
	}
	fmt.Fprintf(w, "\n%s\n", exitStatus)
}

// printFlag writes one flag as flag.PrintDefaults does, with its
// environment variable.
func printFlag(w io.Writer, f *flag.Flag) {
	typ, usage := flag.UnquoteUsage(f)
	line := "  -" + f.Name
	if typ != "" {
		line += " " + typ
	}
	line += "   $" + envName(f.Name) + "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
	switch f.DefValue {
	case "", "0", "false", "0s":
	default:
		if typ == "string" {
			line += fmt.Sprintf(" (default %q)", f.DefValue)
		} else {
			line += " (default " + f.DefValue + ")"
		}
	}
	fmt.Fprintln(w, line)
}

// errHelp is loadConfig's answer to -h, after it printed the usage.
var errHelp = errors.New("help requested")

// usageError is a mistake in the command line, the environment or the
// config file: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitCode reports err on stderr and returns fanfared's exit status
// (exitStatus).
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil || errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "fanfared: %v\nrun 'fanfared -h' for usage\n", err)
		return 2
	default:
		fmt.Fprintln(stderr, "fanfared:", err)
		return 1
	}
}

// loadConfig applies defaults, the config file, the environment and the
// flags, in that order, and validates the result. -h prints the usage to
// out and returns errHelp; every other error is a *usageError.
func loadConfig(args []string, getenv func(string) string, out io.Writer) (*config, error) {
	c, err := parseConfig(args, getenv, out)
	if err != nil && !errors.Is(err, errHelp) {
		err = &usageError{err}
	}
	return c, err
}

func parseConfig(args []string, getenv func(string) string, out io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("fanfared", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned and reported once, by exitCode
	fs.Usage = func() {}
	c.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(out, fs)
			return nil, errHelp
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var errs []error
	if !set["config"] {
		if v := getenv(envName("config")); v != "" {
			c.ConfigFile = v
		}
	}
	if c.ConfigFile != "" {
		file, err := readConfigFile(c.ConfigFile)
		if err != nil {
			return nil, err
		}
		for name, v := range file {
			f := fs.Lookup(name)
			if f == nil || name == "config" {
				errs = append(errs, fmt.Errorf("config file %s: unknown setting %q", c.ConfigFile, name))
				continue
			}
			if !set[name] {
				if err := f.Value.Set(v); err != nil {
					errs = append(errs, fmt.Errorf("config file %s: %s: %w", c.ConfigFile, name, err))
				}
			}
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || f.Name == "config" {
			return
		}
		if v, ok := lookupEnv(getenv, envName(f.Name)); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", envName(f.Name), err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	c.args, c.getenv = args, getenv
	c.values = map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { c.values[f.Name] = f.Value.String() })
	return c, nil
}

// changedFlags returns the flags whose loaded values differ between c and
// next, split into reloadable (engine tuning) and the others, by name.
func (c *config) changedFlags(next *config) (tuning, restart []string) {
	for name, v := range next.values {
		if c.values[name] == v {
			continue
		}
		if tuningFlags[name] {
			tuning = append(tuning, name)
		} else {
			restart = append(restart, name)
		}
	}
	slices.Sort(tuning)
	slices.Sort(restart)
	return tuning, restart
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func readConfigFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		switch v := v.(type) {
		case string:
			out[k] = v
		case float64:
			out[k] = strconv.FormatFloat(v, 'f', -1, 64) // 1048576, not 1.048576e+06
		case bool:
			out[k] = strconv.FormatBool(v)
		default:
			return nil, fmt.Errorf("config file %s: %s: want a string, number or bool", path, k)
		}
	}
	return out, nil
}

// validate reports every problem at once.
func (c *config) validate() error {
	var errs []error
	if c.WSAddr == "" {
		errs = append(errs, errors.New("ws-addr must not be empty"))
	}
	if c.HTTPAddr == "" {
		errs = append(errs, errors.New("http-addr must not be empty"))
	}
	if c.MemReleaseUpgrades < 0 {
		errs = append(errs, fmt.Errorf("mem-release-upgrades %d is negative", c.MemReleaseUpgrades))
	}
	if c.MemReleaseGap < 0 || c.MemReleaseGap > time.Hour {
		errs = append(errs, fmt.Errorf("mem-release-gap must be in 0..1h, got %v", c.MemReleaseGap))
	}
	if c.MemReleaseQuiet < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("mem-release-quiet %v is under 10ms", c.MemReleaseQuiet))
	}
	if c.PprofAddr != "" {
		if _, _, err := net.SplitHostPort(c.PprofAddr); err != nil {
			errs = append(errs, fmt.Errorf("pprof-addr %q: %w", c.PprofAddr, err))
		}
	}
	if c.PostgresURL == "" && c.DataDir == "" {
		errs = append(errs, errors.New("data-dir must not be empty in embedded mode"))
	}
	if c.PostgresURL == "" && c.RedisAddr != "" {
		// Embedded mode is one node: its store is this process's, so a bus,
		// a cluster presence view or shared limits would join nodes whose
		// messages and seqs are not the same (docs/architecture.md §12).
		errs = append(errs, errors.New("redis-addr needs postgres-url: embedded mode is one node and keeps presence, limits and rooms in process"))
	}
	if c.PostgresAppendStatements < 0 || c.PostgresAppendStatements > maxAppendStatements {
		errs = append(errs, fmt.Errorf("postgres-append-statements must be in 0..%d, got %d", maxAppendStatements, c.PostgresAppendStatements))
	}
	if c.Shards <= 0 || c.Shards > 1024 {
		errs = append(errs, fmt.Errorf("shards must be in 1..1024, got %d", c.Shards))
	}
	if c.MaxGID < 1 {
		errs = append(errs, fmt.Errorf("max-gid must be at least 1, got %d", c.MaxGID))
	}
	if c.MaxMessageBytes < 1024 || c.MaxMessageBytes > 16<<20 {
		errs = append(errs, fmt.Errorf("max-message-bytes must be in 1KiB..16MiB, got %d", c.MaxMessageBytes))
	}
	if c.Heartbeat <= 0 {
		errs = append(errs, errors.New("heartbeat must be positive"))
	}
	if c.IdleTimeout <= c.Heartbeat {
		errs = append(errs, fmt.Errorf("idle-timeout (%v) must exceed heartbeat (%v)", c.IdleTimeout, c.Heartbeat))
	}
	if c.OutboundBytes < gateway.MinPageBytes {
		// One message of the largest body must fit, with its frame.
		errs = append(errs, fmt.Errorf("outbound-bytes must be at least %d (one page of the largest message), got %d", gateway.MinPageBytes, c.OutboundBytes))
	}
	// A page always holds one message, whatever the budget: the budget
	// must hold the largest one, and a page must stay under the bound
	// past which pushes are dropped (and far under 4x it, which closes).
	if c.PageBytes == 0 {
		// Half the outbound bound at most, so that a full page (or batch
		// frame) still goes out while the connection has a little queued.
		c.PageBytes = min(gateway.DefaultPageBytes, max(gateway.MinPageBytes, c.OutboundBytes/2))
	}
	switch {
	case c.PageBytes < gateway.MinPageBytes:
		errs = append(errs, fmt.Errorf("page-bytes must be at least %d (one message of the largest body with its frame), got %d", gateway.MinPageBytes, c.PageBytes))
	case c.OutboundBytes >= gateway.MinPageBytes && c.PageBytes > c.OutboundBytes:
		errs = append(errs, fmt.Errorf("page-bytes (%d) must not exceed outbound-bytes (%d): a page larger than the outbound bound would stall pushes, and past 4x it close the connection", c.PageBytes, c.OutboundBytes))
	}
	if c.SyncPage < 1 || c.SyncPage > gateway.MaxSyncPage {
		errs = append(errs, fmt.Errorf("sync-page must be in 1..%d (a page of %d groups stays under 1 MiB), got %d", gateway.MaxSyncPage, gateway.MaxSyncPage, c.SyncPage))
	}
	if c.WSPassYield == 0 || c.WSPassYield > time.Second {
		errs = append(errs, fmt.Errorf("ws-pass-yield must be negative (never) or in 1ns..1s, got %v", c.WSPassYield))
	}
	if c.WSUpgradeHold < 0 || c.WSUpgradeHold > 10*time.Second {
		errs = append(errs, fmt.Errorf("ws-upgrade-hold must be in 0..10s, got %v", c.WSUpgradeHold))
	}
	if c.WSPingRate < 0 || c.WSPingBurst < 1 {
		errs = append(errs, fmt.Errorf("ws-ping-rate must not be negative and ws-ping-burst must be at least 1, got %d and %d", c.WSPingRate, c.WSPingBurst))
	}
	if c.WSDeflateMinBytes < 1 || c.WSDeflateLevel < 1 || c.WSDeflateLevel > 9 {
		errs = append(errs, fmt.Errorf("ws-deflate-min-bytes must be at least 1 and ws-deflate-level in 1..9, got %d and %d", c.WSDeflateMinBytes, c.WSDeflateLevel))
	}
	if c.WSLoops < 0 || c.WSLoops > 1024 {
		errs = append(errs, fmt.Errorf("ws-loops must be within 0..1024, got %d", c.WSLoops))
	}
	if c.WSLoopQueue < 1 {
		errs = append(errs, fmt.Errorf("ws-loop-queue must be at least 1, got %d", c.WSLoopQueue))
	}
	if c.MaxConns < 0 || c.MaxConnsPerIP < 0 || c.MaxConnsPerUser < 0 {
		errs = append(errs, errors.New("connection caps must not be negative"))
	}
	if _, err := c.ipCapExempt(); err != nil {
		errs = append(errs, err)
	}
	if c.ExpectedNodes < 1 {
		errs = append(errs, fmt.Errorf("expected-nodes must be at least 1, got %d", c.ExpectedNodes))
	}
	if c.LimitsBatch < 0 || c.LimitsBatch > redislimit.MaxBatchLimit {
		errs = append(errs, fmt.Errorf("limits-batch must be in 0..%d, got %d", redislimit.MaxBatchLimit, c.LimitsBatch))
	}
	if c.LimitsBatchInflight < 1 || c.LimitsBatchInflight > redislimit.MaxInflightLimit {
		errs = append(errs, fmt.Errorf("limits-batch-inflight must be in 1..%d, got %d", redislimit.MaxInflightLimit, c.LimitsBatchInflight))
	}
	if t := c.LimitsLeaseTTL; t < 0 || t > redislimit.MaxLeaseTTL || t > 0 && t < time.Millisecond {
		errs = append(errs, fmt.Errorf("limits-lease-ttl must be 0 or in 1ms..%v, got %v", redislimit.MaxLeaseTTL, t))
	}
	if c.LimitsLeaseMax < 1 || c.LimitsLeaseMax > redislimit.MaxLeaseUnits {
		errs = append(errs, fmt.Errorf("limits-lease-max must be in 1..%d, got %d", redislimit.MaxLeaseUnits, c.LimitsLeaseMax))
	}
	if c.LimitsLeaseMinHits < 1 || c.LimitsLeaseMinHits > redislimit.MaxLeaseMinHits {
		errs = append(errs, fmt.Errorf("limits-lease-min-hits must be in 1..%d, got %d", redislimit.MaxLeaseMinHits, c.LimitsLeaseMinHits))
	}
	if c.PresenceFlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("presence-flush-interval must be positive, got %v", c.PresenceFlushInterval))
	}
	if c.BusTailDelay < 0 {
		errs = append(errs, fmt.Errorf("bus-tail-delay must not be negative, got %v", c.BusTailDelay))
	}
	if c.PresenceTTL%time.Millisecond != 0 || c.PresenceTTL < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("presence-ttl must be a whole number of milliseconds, at least 10ms, got %v", c.PresenceTTL))
	}
	if c.PresenceFlushInterval > 0 && c.PresenceTTL <= 2*c.PresenceFlushInterval {
		errs = append(errs, fmt.Errorf("presence-ttl (%v) must exceed 2 x presence-flush-interval (%v)", c.PresenceTTL, c.PresenceFlushInterval))
	}
	if c.PresenceInterval < gateway.MinPresenceInterval {
		errs = append(errs, fmt.Errorf("presence-interval must be at least %v, got %v", gateway.MinPresenceInterval, c.PresenceInterval))
	}
	if c.PresenceListMax < 0 || c.PresenceListMax > gateway.MaxPresenceListMax {
		errs = append(errs, fmt.Errorf("presence-list-max must be in 0..%d, got %d", gateway.MaxPresenceListMax, c.PresenceListMax))
	}
	if c.PresenceEventsMax < 0 || c.PresenceEventsMax > c.PresenceListMax {
		errs = append(errs, fmt.Errorf("presence-events-max must be in 0..presence-list-max (%d), got %d", c.PresenceListMax, c.PresenceEventsMax))
	}
	if c.PresenceMaxEvents < 1 || c.PresenceMaxEvents > wire.MaxPresenceEvents {
		errs = append(errs, fmt.Errorf("presence-max-events must be in 1..%d, got %d", wire.MaxPresenceEvents, c.PresenceMaxEvents))
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("retention must not be negative, got %v", c.Retention))
	}
	if c.RetentionInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("retention-interval must be at least 100ms, got %v", c.RetentionInterval))
	}
	if c.HotSyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("hot-sync-interval must be positive, got %v", c.HotSyncInterval))
	}
	if c.HotSyncInterval > 0 && c.HotTTL <= 2*c.HotSyncInterval {
		errs = append(errs, fmt.Errorf("hot-ttl (%v) must exceed 2 x hot-sync-interval (%v)", c.HotTTL, c.HotSyncInterval))
	}
	if c.ReadyEvery < 0 {
		errs = append(errs, fmt.Errorf("ready-every must not be negative, got %v", c.ReadyEvery))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("shutdown-timeout must be positive"))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log-level must be debug, info, warn or error, got %q", c.LogLevel))
	}
	if c.HotShards < 0 {
		errs = append(errs, errors.New("hot-shards must not be negative"))
	}
	if c.MemberCacheTTL < 0 {
		errs = append(errs, errors.New("member-cache-ttl must not be negative"))
	}
	if c.TouchInterval < 0 || c.TouchInterval > fanout.MaxTouchInterval {
		errs = append(errs, fmt.Errorf("touch-interval must be 0 to %v, got %v", fanout.MaxTouchInterval, c.TouchInterval))
	}
	if c.TouchPendingMax < 0 {
		errs = append(errs, errors.New("touch-pending-max must not be negative"))
	}
	if c.MemberFeedInterval < 0 {
		errs = append(errs, errors.New("member-feed-interval must not be negative"))
	}
	if c.MemberFeedPage < 0 || c.MemberFeedPage > store.DefaultMaxAddMembers {
		errs = append(errs, fmt.Errorf("member-feed-page must be 0 to %d, got %d", store.DefaultMaxAddMembers, c.MemberFeedPage))
	}
	if c.MemberFeedGrace < 0 {
		errs = append(errs, errors.New("member-feed-grace must not be negative"))
	}
	if c.MemberFeedKickGap < 0 {
		errs = append(errs, errors.New("member-feed-kick-gap must not be negative"))
	}
	if c.MemberFeedPendingMax < 0 {
		errs = append(errs, errors.New("member-feed-pending-max must not be negative"))
	}
	if err := c.tuning().Validate(); err != nil {
		// Tuning names its fields as JSON (merge_window): the flag is the
		// same name with dashes.
		errs = append(errs, fmt.Errorf("engine settings (flag = name with dashes): %w", err))
	}
	if c.RoomSecret != "" && len(c.RoomSecret) < 32 {
		errs = append(errs, errors.New("room-token-secret must be at least 32 bytes"))
	}
	for _, b := range []struct {
		name string
		v    int
	}{{"frame-workers", c.FrameWorkers}, {"frame-queue", c.FrameQueue}, {"connect-workers", c.ConnectWorkers}, {"connect-queue", c.ConnectQueue}} {
		if b.v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", b.name, b.v))
		}
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, errors.New("request-timeout must be positive"))
	}
	if c.HTTPRequestTimeout <= 0 || c.HTTPRequestTimeout > gateway.DefaultWriteTimeout {
		errs = append(errs, fmt.Errorf("http-request-timeout must be in (0, %v] (past the HTTP write timeout no answer can be written), got %v", gateway.DefaultWriteTimeout, c.HTTPRequestTimeout))
	}
	if c.IPv6CapPrefix < 16 || c.IPv6CapPrefix > 128 {
		errs = append(errs, fmt.Errorf("max-conns-per-ip-v6-prefix must be in 16..128, got %d", c.IPv6CapPrefix))
	}
	if c.RoomLoadWait < 0 {
		errs = append(errs, errors.New("room-load-wait must not be negative"))
	}
	if c.RoomTicketSecret != "" && len(c.RoomTicketSecret) < 32 {
		errs = append(errs, errors.New("room-ticket-secret must be at least 32 bytes"))
	}
	if c.RoomTicketTTL < time.Minute || c.RoomTicketTTL > 720*time.Hour {
		errs = append(errs, fmt.Errorf("room-ticket-ttl must be in 1m..720h, got %v", c.RoomTicketTTL))
	}
	if c.RoomEnterBatch < 1 || c.RoomEnterBatch > redisroom.MaxEnterBatch {
		errs = append(errs, fmt.Errorf("room-enter-batch must be in 1..%d, got %d", redisroom.MaxEnterBatch, c.RoomEnterBatch))
	}
	if c.RoomEnterInFlight < 1 || c.RoomEnterInFlight > redisroom.MaxEnterInFlight {
		errs = append(errs, fmt.Errorf("room-enter-inflight must be in 1..%d, got %d", redisroom.MaxEnterInFlight, c.RoomEnterInFlight))
	}
	if c.RoomMaxPollers < 1 {
		errs = append(errs, fmt.Errorf("room-max-pollers must be at least 1, got %d", c.RoomMaxPollers))
	}
	if c.RoomPollMin < 100*time.Millisecond || c.RoomPollMax > 10*time.Minute || c.RoomPollMax < c.RoomPollMin {
		errs = append(errs, fmt.Errorf("room-poll-min (>= 100ms) must not exceed room-poll-max (<= 10m), got %v and %v", c.RoomPollMin, c.RoomPollMax))
	}
	if c.RoomPollGrace < time.Second || c.RoomPollGrace > 10*time.Minute {
		errs = append(errs, fmt.Errorf("room-poll-grace must be in 1s..10m, got %v", c.RoomPollGrace))
	}
	if h := c.RoomClientIPHeader; h != "" && http.CanonicalHeaderKey(h) == "" {
		errs = append(errs, fmt.Errorf("room-client-ip-header %q is not a header name", h))
	}
	if c.RoomKeyFile != "" {
		if c.RoomSecret != "" {
			errs = append(errs, errors.New("room-token-key and room-token-secret exclude each other: tokens are signed one way"))
		}
		if _, err := c.roomKey(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.RedisPrefix == "" || strings.ContainsAny(c.RedisPrefix, "{}") {
		errs = append(errs, fmt.Errorf("redis-prefix must be non-empty and without braces, got %q", c.RedisPrefix))
	}
	switch c.Demo {
	case demoAuto, demoOn, demoOff:
	default:
		errs = append(errs, fmt.Errorf("demo must be auto, on or off, got %q", c.Demo))
	}
	if c.DemoTokenTTL <= 0 || c.DemoTokenTTL > web.MaxTokenTTL {
		errs = append(errs, fmt.Errorf("demo-token-ttl must be in (0, %v], got %v", web.MaxTokenTTL, c.DemoTokenTTL))
	}
	if c.DemoTokenRate <= 0 || c.DemoTokenBurst < 1 {
		errs = append(errs, fmt.Errorf("demo-token-rate must be positive and demo-token-burst at least 1, got %v and %d", c.DemoTokenRate, c.DemoTokenBurst))
	}
	if err := web.ValidateWSURL(c.RoomPageWSURL); err != nil {
		errs = append(errs, fmt.Errorf("room-page-ws-url: %w", err))
	}
	if c.DemoMaxMembers < 1 {
		errs = append(errs, fmt.Errorf("demo-max-members must be at least 1, got %d", c.DemoMaxMembers))
	}
	if c.JWTSecret != "" && len(c.JWTSecret) < 32 {
		errs = append(errs, errors.New("jwt-secret must be at least 32 bytes"))
	}
	if err := c.validateHooks(); err != nil {
		errs = append(errs, err)
	}
	if err := c.SSE.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// roomKey reads the -room-token-key file.
func (c *config) roomKey() (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(c.RoomKeyFile)
	if err != nil {
		return nil, fmt.Errorf("room-token-key: %w", err)
	}
	k, err := roomtoken.ParsePrivateKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("room-token-key %s: %w", c.RoomKeyFile, err)
	}
	return k, nil
}
