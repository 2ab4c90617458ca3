package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/gateway"
)

// sseConfig is the Server-Sent Events transport's part of the
// configuration (GET /v1/events on the HTTP address, docs/protocol.md
// §14). Its bounds besides these are the sockets': -outbound-bytes,
// -max-conns-per-user, -max-conns-per-ip (with its v6 prefix and exempt
// list).
type sseConfig struct {
	Enabled      bool
	Heartbeat    time.Duration
	MaxLifetime  time.Duration
	WriteTimeout time.Duration
	MaxStreams   int
	CursorGroups int
	TicketTTL    time.Duration
	Padding      int
}

// sseFlags are the flags of sseConfig, in their usage order (flagGroups).
var sseFlags = []string{"sse", "sse-heartbeat", "sse-max-lifetime", "sse-write-timeout", "sse-max-streams",
	"sse-cursor-groups", "sse-ticket-ttl", "sse-padding"}

func (c *sseConfig) flags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "sse", true, "serve the Server-Sent Events fallback (GET /v1/events, POST /v1/events/ticket) on the HTTP address, for clients that cannot open a WebSocket")
	fs.DurationVar(&c.Heartbeat, "sse-heartbeat", gateway.DefaultSSEHeartbeat, "comment line written to an event stream that was silent this long (keeps proxies from closing it, lets clients see it is alive); at least 1s")
	fs.DurationVar(&c.MaxLifetime, "sse-max-lifetime", gateway.DefaultSSEMaxLifetime, "an event stream ends cleanly after this long (less up to a tenth at random) and the client reconnects with its cursor; 0 = no limit")
	fs.DurationVar(&c.WriteTimeout, "sse-write-timeout", gateway.DefaultSSEWriteTimeout, "an event stream whose client does not take a write for this long is closed as a slow consumer")
	fs.IntVar(&c.MaxStreams, "sse-max-streams", gateway.DefaultSSEMaxStreams, "event streams open on this node at most (429 beyond)")
	fs.IntVar(&c.CursorGroups, "sse-cursor-groups", gateway.DefaultSSECursorGroups, "groups in an event stream's resume cursor (event ids, Last-Event-ID); a user in more gets a partial cursor and syncs on reconnect; 1.."+strconv.Itoa(gateway.MaxSSECursorGroups))
	fs.DurationVar(&c.TicketTTL, "sse-ticket-ttl", gateway.DefaultSSETicketTTL, "how long a ticket from POST /v1/events/ticket opens a stream (once); 1s..5m")
	fs.IntVar(&c.Padding, "sse-padding", 0, "bytes of comment written first on every event stream, for proxies that hold back the start of a response; 0..65536")
}

func (c *sseConfig) validate() error {
	var errs []error
	if c.Heartbeat < time.Second {
		errs = append(errs, fmt.Errorf("sse-heartbeat must be at least 1s, got %v", c.Heartbeat))
	}
	if c.MaxLifetime < 0 {
		errs = append(errs, fmt.Errorf("sse-max-lifetime must not be negative, got %v", c.MaxLifetime))
	}
	if c.MaxLifetime > 0 && c.MaxLifetime < time.Second {
		errs = append(errs, fmt.Errorf("sse-max-lifetime must be 0 or at least 1s (clients reconnect at its end), got %v", c.MaxLifetime))
	}
	if c.WriteTimeout < time.Second {
		errs = append(errs, fmt.Errorf("sse-write-timeout must be at least 1s, got %v", c.WriteTimeout))
	}
	if c.MaxStreams < 1 {
		errs = append(errs, fmt.Errorf("sse-max-streams must be at least 1, got %d", c.MaxStreams))
	}
	if c.CursorGroups < 1 || c.CursorGroups > gateway.MaxSSECursorGroups {
		errs = append(errs, fmt.Errorf("sse-cursor-groups must be in 1..%d, got %d", gateway.MaxSSECursorGroups, c.CursorGroups))
	}
	if c.TicketTTL < time.Second || c.TicketTTL > 5*time.Minute {
		errs = append(errs, fmt.Errorf("sse-ticket-ttl must be in 1s..5m, got %v", c.TicketTTL))
	}
	if c.Padding < 0 || c.Padding > gateway.MaxSSEPadding {
		errs = append(errs, fmt.Errorf("sse-padding must be in 0..%d, got %d", gateway.MaxSSEPadding, c.Padding))
	}
	return errors.Join(errs...)
}

// newEvents builds the event streams and their routes (-sse), bounded like
// the sockets: the same outbound bound and per-user and per-address caps.
func (s *server) newEvents(verifier gateway.Verifier, perUser, perIP int, ipExempt []netip.Prefix, reg prometheus.Registerer) error {
	c := s.cfg.SSE
	if !c.Enabled {
		return nil
	}
	lifetime := c.MaxLifetime
	if lifetime == 0 {
		lifetime = -1 // gateway: negative = no limit
	}
	var err error
	s.events, err = gateway.NewEvents(gateway.EventsConfig{
		Chat:              s.chat,
		Verifier:          verifier,
		TicketSecret:      []byte(s.jwtSecret),
		TicketTTL:         c.TicketTTL,
		Heartbeat:         c.Heartbeat,
		MaxLifetime:       lifetime,
		WriteTimeout:      c.WriteTimeout,
		OutboundBound:     s.cfg.OutboundBytes,
		MaxStreams:        c.MaxStreams,
		MaxStreamsPerUser: perUser,
		MaxStreamsPerIP:   perIP,
		IPv6CapPrefix:     s.cfg.IPv6CapPrefix,
		PerIPExempt:       ipExempt,
		CursorGroups:      c.CursorGroups,
		Padding:           c.Padding,
		Registerer:        reg,
		Logger:            s.log,
	})
	if err != nil {
		return err
	}
	s.events.Register(s.api)
	return nil
}
