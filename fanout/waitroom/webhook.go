package waitroom

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/fanfare-im/fanfare/fanout/hooks"
)

// WebhookConfig configures the optional session-end webhook: a JSON POST
// per ended session, retried with backoff, from a bounded queue.
type WebhookConfig struct {
	// URL receives the POSTs. "" disables the webhook.
	URL string
	// Timeout per attempt. 0 means 5 s.
	Timeout time.Duration
	// Retries after the first attempt. 0 means 3; negative means none.
	Retries int
	// Backoff before the first retry, doubled each time. 0 means 500 ms.
	Backoff time.Duration
	// Queue bounds the pending deliveries; beyond it events are dropped
	// (counted and logged). 0 means 10000.
	Queue int
	// Header is added to every request (e.g. an authorization header).
	Header http.Header
	// Secret signs every request like the application hooks' (HMAC-SHA256,
	// docs/protocol.md §13.1; Fanfare-Hook: session_end); empty = unsigned.
	Secret []byte
	// Client is the HTTP client (nil = a new one per Timeout).
	Client *http.Client
}

// WebhookEvent is the JSON body of a session-end POST.
type WebhookEvent struct {
	Event      string `json:"event"` // "session_end"
	Room       string `json:"room"`
	UID        string `json:"uid"`
	Tier       int    `json:"level"`
	Reason     string `json:"reason"`
	FirstJoin  int64  `json:"first_join"` // unix seconds
	AdmittedAt int64  `json:"admitted_at"`
	EndedAt    int64  `json:"ended_at"`
	Node       string `json:"node,omitempty"`
}

// Webhook is an Observer that POSTs session ends. Run delivers; the
// Manager runs it when Config.Webhook.URL is set.
type Webhook struct {
	cfg  WebhookConfig
	node string
	q    chan WebhookEvent
	log  *slog.Logger
	met  *metrics
	post *hooks.Poster
}

// NewWebhook returns a webhook observer; call Run to deliver.
func NewWebhook(cfg WebhookConfig, node string, log *slog.Logger) *Webhook {
	return newWebhook(cfg, node, log, newMetrics(nil))
}

func newWebhook(cfg WebhookConfig, node string, log *slog.Logger, met *metrics) *Webhook {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Retries == 0 {
		cfg.Retries = 3
	}
	if cfg.Retries < 0 {
		cfg.Retries = 0
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 500 * time.Millisecond
	}
	if cfg.Queue == 0 {
		cfg.Queue = 10000
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Webhook{cfg: cfg, node: node, q: make(chan WebhookEvent, cfg.Queue), log: log, met: met,
		post: hooks.NewPoster(hooks.PosterConfig{URL: cfg.URL, Secret: cfg.Secret, Kind: "session_end", Header: cfg.Header, Client: cfg.Client})}
}

// SessionEnded implements Observer; it never blocks.
func (w *Webhook) SessionEnded(e SessionEnd) {
	ev := WebhookEvent{Event: "session_end", Room: e.Room, UID: e.UID, Tier: e.Tier, Reason: string(e.Reason),
		FirstJoin: e.First.Unix(), AdmittedAt: e.Admitted.Unix(), EndedAt: e.Ended.Unix(), Node: w.node}
	select {
	case w.q <- ev:
	default:
		w.met.webhook.WithLabelValues("dropped").Inc()
		w.log.Warn("room webhook queue full, event dropped", "room", e.Room, "uid", e.UID)
	}
}

// Run delivers queued events until ctx is done.
func (w *Webhook) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.q:
			if err := w.deliver(ctx, ev); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				w.met.webhook.WithLabelValues("failed").Inc()
				w.log.Warn("room webhook delivery failed", "room", ev.Room, "uid", ev.UID, "err", err)
				continue
			}
			w.met.webhook.WithLabelValues("ok").Inc()
		}
	}
}

func (w *Webhook) deliver(ctx context.Context, ev WebhookEvent) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	// The signed POST and its retries are the hooks' (fanout/hooks.Poster).
	maxBackoff := w.cfg.Backoff << min(w.cfg.Retries, 20)
	return w.post.Retry(ctx, body, w.cfg.Timeout, w.cfg.Backoff, maxBackoff, w.cfg.Retries+1, nil)
}
