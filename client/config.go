package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"
)

// Defaults applied by Dial to zero Config fields.
const (
	DefaultDialTimeout      = 10 * time.Second
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultHeartbeat        = 30 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	DefaultSendTimeout      = 10 * time.Second
	DefaultBackoffMin       = 250 * time.Millisecond
	DefaultBackoffMax       = 30 * time.Second
	DefaultMaxRetries       = 10
	DefaultMaxRetryAfter    = 30 * time.Second
	DefaultGapWait          = 50 * time.Millisecond
	DefaultPollInterval     = 10 * time.Second
	DefaultSummaryJitter    = time.Second
	DefaultMessageBuffer    = 1024
	DefaultEventBuffer      = 64
	DefaultMaxPending       = 1024
	DefaultMaxFrameBytes    = 16 << 20
	DefaultReadBufferSize   = 4096
	DefaultMaxPullRange     = 10000

	// pageSize is the most messages one pull answer carries (docs/protocol.md §4.4:
	// a range is clamped to 200 messages from from_seq); the server's page
	// byte budget may end a page sooner (next_seq).
	pageSize = 200
)

// Config configures a Conn. The zero value of every field but URL and a
// token works: Dial fills in the defaults documented on each field.
type Config struct {
	// URL is the chat socket, ws://host:port/ws (wss:// for TLS).
	URL string
	// Token is the user's JWT, sent as Authorization: Bearer on the
	// upgrade and on HTTP requests.
	Token string
	// TokenFunc, when set, is called before every dial and HTTP request for
	// a fresh token and takes precedence over Token. Without it, a 401 on
	// reconnect is terminal (the token expired).
	TokenFunc func(ctx context.Context) (string, error)
	// HTTPURL is the HTTP API base (http://host:port), used for sync on
	// (re)connect and for Pull while the socket is down. Empty means
	// WebSocket only: after a reconnect every tracked group is caught up by
	// a pull up to its last_seq instead of a sync.
	HTTPURL string
	// Transport picks how the Conn connects: TransportAuto (""), a
	// WebSocket falling back to Server-Sent Events over HTTPURL when the
	// upgrade cannot be made (a network or proxy that blocks WebSocket);
	// TransportWebSocket, never falling back; TransportSSE, events only
	// (docs/protocol.md §14). The fallback needs HTTPURL; TransportSSE
	// needs it and no URL.
	Transport string
	// HTTPClient makes the HTTP requests; nil means a shared client with a
	// 20 s timeout (bound to LocalAddr when that is set).
	HTTPClient *http.Client
	// Logger receives connection-level events; nil discards them.
	Logger *slog.Logger

	// LocalAddr is the source IP to bind (e.g. "127.0.0.2"), with
	// IP_BIND_ADDRESS_NO_PORT so the kernel picks the port per destination.
	// Empty means the kernel's choice.
	LocalAddr string
	// DialTimeout bounds the TCP connect; default 10 s.
	DialTimeout time.Duration
	// HandshakeTimeout bounds the upgrade plus the hello frame; default
	// 10 s.
	HandshakeTimeout time.Duration
	// Heartbeat is the interval of application pings; 0 means the
	// server's heartbeat_s from hello (30 s when the server sends 0). A
	// connection from which nothing, pong included, arrived for two
	// intervals is closed and redialed.
	Heartbeat time.Duration
	// WriteTimeout bounds one frame write; default 10 s.
	WriteTimeout time.Duration
	// SendTimeout bounds the wait for the answer to one send or pull
	// attempt; default 10 s. A send whose answer did not come is retried
	// with the same client_msg_id.
	SendTimeout time.Duration
	// MaxRetries is how many times Send, Pull and Sync retry a retryable
	// failure (overloaded, unavailable, rate_limited, connection loss,
	// timeout; for Pull and Sync over HTTP also a connection the server
	// closed under the request) after the first attempt; 0 means 10,
	// negative means never.
	MaxRetries int
	// MaxRetryAfter is the longest retry_after_ms Send, Pull and Sync wait out; a longer
	// one is returned as the error. Default 30 s.
	MaxRetryAfter time.Duration
	// BackoffMin and BackoffMax bound the jittered exponential backoff
	// between reconnect attempts and between retries without
	// retry_after_ms; defaults 250 ms and 30 s.
	BackoffMin time.Duration
	BackoffMax time.Duration

	// OnMessage, when set, receives every message instead of the Messages
	// channel. It is called with the Conn's delivery lock held, from the
	// socket reader or the catch-up goroutine, in order per group: it must
	// return quickly and must not call Conn methods. Meant for load
	// generators and for apps with their own queue.
	OnMessage func(Message)
	// OnEvent, when set, receives every Event instead of the Events
	// channel, under the same rules as OnMessage.
	OnEvent func(Event)
	// OnPresence, when set, receives every presence frame (a group's
	// online count, and for small groups who came online and went
	// offline; docs/protocol.md §4.16), from the socket reader: it must
	// return quickly and must not block. Conn.Online answers the latest
	// one without it.
	OnPresence func(Presence)
	// MessageBuffer is the capacity of the Messages channel; default 1024.
	// When it is full, pushes are held in the per-group pending buffers and
	// then, past MaxPending, dropped and pulled again later: a slow reader
	// never stalls acks.
	MessageBuffer int
	// EventBuffer is the capacity of the Events channel; default 64. Events
	// that do not fit are dropped and counted in Stats.EventsDropped.
	EventBuffer int
	// MaxPending bounds the out-of-order pushes buffered per group while a
	// gap is filled; default 1024. Pushes beyond it are dropped and pulled.
	MaxPending int
	// GapWait is how long a gap revealed by a push may stay open before it
	// is pulled, so that pushes reordered between nodes do not cause pulls;
	// default 50 ms, negative means pull at once. Gaps announced by the
	// server (summary, resync) and found by sync are pulled at once.
	GapWait time.Duration
	// PollInterval is how often groups at degradation level 3 (wire.LevelWriteOnly: no pushes)
	// are polled with a pull; default 10 s.
	PollInterval time.Duration
	// SummaryJitter spreads the pulls that summary frames (degradation L2)
	// call for: each client waits a random time up to it, and summaries
	// arriving meanwhile join the same pull. Without it, every online
	// member of a large group would pull in the same millisecond, which is
	// what L2 exists to avoid. Default 1 s; negative means pull at once.
	SummaryJitter time.Duration
	// Cursors are the last delivered seqs of groups from an earlier
	// session (see Conn.Cursors): these groups are tracked from the start
	// and caught up after the first connect.
	Cursors map[int64]int64
	// SkipUnread makes a group found by sync that is not tracked yet start
	// at its last_seq (only new messages are delivered). By default it
	// starts at its last_read_seq, so unread messages are delivered.
	SkipUnread bool
	// MaxCatchUp bounds how many messages a catch-up after (re)connect
	// delivers per group; the older ones are skipped with an EventSkipped.
	// 0 means no bound.
	MaxCatchUp int64
	// MaxPullRange bounds the messages one Pull call returns; default
	// 10,000.
	MaxPullRange int
	// MaxFrameBytes bounds one server message (a pull answer carries up to
	// 200 messages); default 16 MiB.
	MaxFrameBytes int64
	// Deflate offers permessage-deflate: a server that accepts it
	// (fanfared -ws-deflate) sends large frames compressed, each on its own
	// (server_no_context_takeover, which the offer requires). The client
	// sends its own frames uncompressed. Inflated messages are bounded by
	// MaxFrameBytes like plain ones.
	Deflate bool
	// ReadBufferSize is the socket read buffer per connection; default
	// 4 KiB. Load generators with many connections lower it.
	ReadBufferSize int
}

// Validate reports every problem of c.
func (c *Config) Validate() error {
	var errs []error
	switch c.Transport {
	case TransportAuto, TransportWebSocket:
	case TransportSSE:
		if c.HTTPURL == "" {
			errs = append(errs, errors.New("client: Transport sse needs HTTPURL"))
		}
	default:
		errs = append(errs, fmt.Errorf("client: Transport %q, want \"\", %q or %q", c.Transport, TransportWebSocket, TransportSSE))
	}
	if c.URL == "" {
		if c.Transport != TransportSSE {
			errs = append(errs, errors.New("client: URL is required"))
		}
	} else if u, err := url.Parse(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("client: URL: %w", err))
	} else if u.Scheme != "ws" && u.Scheme != "wss" {
		errs = append(errs, fmt.Errorf("client: URL scheme %q, want ws or wss", u.Scheme))
	}
	if c.Token == "" && c.TokenFunc == nil {
		errs = append(errs, errors.New("client: Token or TokenFunc is required"))
	}
	if c.HTTPURL != "" {
		if u, err := url.Parse(c.HTTPURL); err != nil {
			errs = append(errs, fmt.Errorf("client: HTTPURL: %w", err))
		} else if u.Scheme != "http" && u.Scheme != "https" {
			errs = append(errs, fmt.Errorf("client: HTTPURL scheme %q, want http or https", u.Scheme))
		}
	}
	if c.LocalAddr != "" && net.ParseIP(c.LocalAddr) == nil {
		errs = append(errs, fmt.Errorf("client: LocalAddr %q is not an IP address", c.LocalAddr))
	}
	for name, d := range map[string]time.Duration{
		"DialTimeout": c.DialTimeout, "HandshakeTimeout": c.HandshakeTimeout, "Heartbeat": c.Heartbeat,
		"WriteTimeout": c.WriteTimeout, "SendTimeout": c.SendTimeout, "MaxRetryAfter": c.MaxRetryAfter,
		"BackoffMin": c.BackoffMin, "BackoffMax": c.BackoffMax, "PollInterval": c.PollInterval,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("client: %s %v is negative", name, d))
		}
	}
	if c.BackoffMin > 0 && c.BackoffMax > 0 && c.BackoffMin > c.BackoffMax {
		errs = append(errs, fmt.Errorf("client: BackoffMin %v exceeds BackoffMax %v", c.BackoffMin, c.BackoffMax))
	}
	for name, n := range map[string]int{
		"MessageBuffer": c.MessageBuffer, "EventBuffer": c.EventBuffer, "MaxPending": c.MaxPending,
		"MaxPullRange": c.MaxPullRange, "ReadBufferSize": c.ReadBufferSize,
	} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("client: %s %d is negative", name, n))
		}
	}
	if c.MaxFrameBytes < 0 {
		errs = append(errs, fmt.Errorf("client: MaxFrameBytes %d is negative", c.MaxFrameBytes))
	}
	if c.MaxCatchUp < 0 {
		errs = append(errs, fmt.Errorf("client: MaxCatchUp %d is negative", c.MaxCatchUp))
	}
	for gid, seq := range c.Cursors {
		if gid <= 0 || seq < 0 {
			errs = append(errs, fmt.Errorf("client: Cursors[%d] = %d: want a positive gid and a non-negative seq", gid, seq))
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns c with the zero fields filled in.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DialTimeout, DefaultDialTimeout)
	def(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.SendTimeout, DefaultSendTimeout)
	def(&c.MaxRetryAfter, DefaultMaxRetryAfter)
	def(&c.BackoffMin, DefaultBackoffMin)
	def(&c.BackoffMax, DefaultBackoffMax)
	def(&c.GapWait, DefaultGapWait)
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.SummaryJitter, DefaultSummaryJitter)
	if c.SummaryJitter < 0 {
		c.SummaryJitter = 0
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	if c.GapWait < 0 {
		c.GapWait = 0
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	} else if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.MessageBuffer == 0 {
		c.MessageBuffer = DefaultMessageBuffer
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = DefaultEventBuffer
	}
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.ReadBufferSize == 0 {
		c.ReadBufferSize = DefaultReadBufferSize
	}
	if c.MaxPullRange == 0 {
		c.MaxPullRange = DefaultMaxPullRange
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = sharedHTTP
		if c.LocalAddr != "" {
			c.HTTPClient = &http.Client{
				Timeout: DefaultDialTimeout + DefaultSendTimeout,
				Transport: &http.Transport{
					DialContext:         dialer(DefaultDialTimeout, c.LocalAddr).DialContext,
					MaxIdleConnsPerHost: 2,
					IdleConnTimeout:     90 * time.Second,
				},
			}
		}
	}
	return c
}

// sharedHTTP is the HTTP client of every Conn without HTTPClient and
// LocalAddr: one connection pool for all of them.
var sharedHTTP = &http.Client{Timeout: DefaultDialTimeout + DefaultSendTimeout}

// token returns the token to present now.
func (c *Config) token(ctx context.Context) (string, error) {
	if c.TokenFunc != nil {
		return c.TokenFunc(ctx)
	}
	return c.Token, nil
}
