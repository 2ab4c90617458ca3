package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Event types.
const (
	EventMessage    = "message"
	EventConnect    = "connect"
	EventDisconnect = "disconnect"
	EventJoin       = "join"
	EventLeave      = "leave"
)

// Event is one entry of the event stream (docs/protocol.md §13.3).
type Event struct {
	Type        string `json:"type"`
	GID         int64  `json:"gid,omitempty"`
	Seq         int64  `json:"seq,omitempty"`
	UID         string `json:"uid"`
	ClientMsgID string `json:"client_msg_id,omitempty"`
	Kind        string `json:"kind,omitempty"`
	// Body is the message body when it is at most StreamConfig.BodyMax
	// bytes; a longer one is left out (BodyOmitted) and BodyBytes says
	// how long it is: the receiver pulls it by seq.
	Body        json.RawMessage `json:"body,omitempty"`
	BodyBytes   int             `json:"body_bytes,omitempty"`
	BodyOmitted bool            `json:"body_omitted,omitempty"`
	TS          int64           `json:"ts"` // unix milliseconds: commit time (message), change time (others)
	Node        string          `json:"node,omitempty"`
	// Offline lists, for a message, the group's recently active members
	// who were online on no node when the event was delivered (the
	// members a mobile push is for), at most StreamConfig.OfflineMax of
	// them (OfflineTruncated when more were).
	Offline          []string `json:"offline,omitempty"`
	OfflineTruncated bool     `json:"offline_truncated,omitempty"`
}

// Record is one durable journal entry.
type Record struct {
	ID   string // opaque, increasing in journal order
	Data []byte // the encoded Event
}

// ErrFull is what a Journal's Append returns when it holds its capacity
// of undelivered records; nothing was appended.
var ErrFull = errors.New("hooks: event journal full")

// ErrNotDeliverer is what a Journal's Ack returns when this node is no
// longer the one delivering (cluster mode: another node took the lease);
// that node delivers the batch again.
var ErrNotDeliverer = errors.New("hooks: this node no longer delivers the events")

// Journal is the durable queue of the event stream, with its cursor
// (fanout/hooks/pebblejournal in embedded mode, fanout/hooks/redisjournal
// in cluster mode).
type Journal interface {
	// Append stores recs durably, in order, or returns an error (ErrFull:
	// at capacity; nothing stored).
	Append(ctx context.Context, recs [][]byte) error
	// Read returns up to max of the oldest records after the cursor (none
	// when there are none, or when another node delivers).
	Read(ctx context.Context, max int) ([]Record, error)
	// Ack moves the cursor to id: every record up to it was delivered
	// and may be freed.
	Ack(ctx context.Context, id string) error
	// Pending returns the number of records after the cursor.
	Pending(ctx context.Context) (int64, error)
}

// Audience finds the offline members of a group that a message event
// lists; implemented in cmd/fanfared on the store and the presence view.
type Audience interface {
	Offline(ctx context.Context, gid int64, dst []string, max int) ([]string, bool, error)
}

// StreamConfig configures the event stream.
type StreamConfig struct {
	// URL receives the event POSTs; required.
	URL string
	// Secret signs them; at least MinSecretBytes.
	Secret  []byte
	Journal Journal
	// Audience fills the offline lists; nil = none.
	Audience Audience
	// Node names this node in the events.
	Node string
	// Batch bounds the events of one POST; 0 = 100.
	Batch int
	// Timeout bounds one POST; 0 = 5 s.
	Timeout time.Duration
	// Backoff is the wait before the first retry of a failed POST,
	// doubled per retry up to MaxBackoff; 0 = 100 ms, 30 s.
	Backoff, MaxBackoff time.Duration
	// MaxAttempts drops a batch after that many failed POSTs (counted);
	// 0 (the default) retries forever: the journal holds the events and,
	// once full, slows the sends down.
	MaxAttempts int
	// DropWhenFull drops events (counted) when the journal is full; false
	// (the default) makes Emit wait for room, up to its context.
	DropWhenFull bool
	// BodyMax is the largest body carried in an event; 0 = 4096;
	// negative = no bodies.
	BodyMax int
	// OfflineMax bounds an event's offline list; 0 = 1000.
	OfflineMax int
	// AsyncQueue bounds the connect and disconnect events waiting to be
	// journaled (they come from paths that must not block); 0 = 10000.
	AsyncQueue int
	// Poll is how often an idle deliverer looks at the journal (another
	// node's appends, in cluster mode); 0 = 100 ms.
	Poll    time.Duration
	Client  *http.Client
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
}

// Validate reports every problem of c.
func (c StreamConfig) Validate() error {
	var errs []error
	if !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://") {
		errs = append(errs, fmt.Errorf("hooks: events URL %q is not http(s)", c.URL))
	}
	if len(c.Secret) < MinSecretBytes {
		errs = append(errs, fmt.Errorf("hooks: events secret shorter than %d bytes", MinSecretBytes))
	}
	if c.Journal == nil {
		errs = append(errs, errors.New("hooks: events need a Journal"))
	}
	if c.Batch < 0 || c.Timeout < 0 || c.Backoff < 0 || c.MaxBackoff < 0 || c.MaxAttempts < 0 ||
		c.OfflineMax < 0 || c.AsyncQueue < 0 || c.Poll < 0 {
		errs = append(errs, errors.New("hooks: event stream settings must not be negative"))
	}
	return errors.Join(errs...)
}

// Stream is the after-commit event stream: Emit journals events durably
// (the engine acks a send only after), Run delivers them in journal order
// with retries, moving the journal's cursor after each delivered batch.
//
// Goroutines: Run's (the deliverer) and the async writer it starts.
type Stream struct {
	cfg   StreamConfig
	post  *Poster
	met   *Metrics
	log   *slog.Logger
	async chan Event
	wake  chan struct{}

	closing  atomic.Bool
	draining chan struct{} // closed by Shutdown: deliver what is left, then stop
	stopped  chan struct{} // closed when Run returns
	stopOnce sync.Once

	// deliverer-owned
	lastSeq map[int64]int64 // gid -> last delivered message seq (order check)
	offline []string
}

// NewStream returns the stream for cfg (Validate first).
func NewStream(cfg StreamConfig) *Stream {
	d := func(v *int, n int) {
		if *v == 0 {
			*v = n
		}
	}
	dd := func(v *time.Duration, n time.Duration) {
		if *v == 0 {
			*v = n
		}
	}
	d(&cfg.Batch, 100)
	d(&cfg.BodyMax, 4096)
	d(&cfg.OfflineMax, 1000)
	d(&cfg.AsyncQueue, 10000)
	dd(&cfg.Timeout, 5*time.Second)
	dd(&cfg.Backoff, 100*time.Millisecond)
	dd(&cfg.MaxBackoff, 30*time.Second)
	dd(&cfg.Poll, 100*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Stream{cfg: cfg, met: cfg.Metrics, log: cfg.Logger,
		post:     NewPoster(PosterConfig{URL: cfg.URL, Secret: cfg.Secret, Kind: "events", Client: cfg.Client, Now: cfg.Now}),
		async:    make(chan Event, cfg.AsyncQueue),
		wake:     make(chan struct{}, 1),
		draining: make(chan struct{}),
		stopped:  make(chan struct{}),
		lastSeq:  map[int64]int64{},
	}
}

// BodyMax is the largest body an event carries.
func (s *Stream) BodyMax() int { return s.cfg.BodyMax }

// Emit journals evs durably, in order. When the journal is full it waits
// for room until ctx ends (or, with DropWhenFull, drops them, counted).
// A nil error means every event is durable (or was dropped by policy).
func (s *Stream) Emit(ctx context.Context, evs []Event) error {
	if len(evs) == 0 {
		return nil
	}
	recs := make([][]byte, len(evs))
	for i := range evs {
		s.fill(&evs[i])
		b, err := json.Marshal(&evs[i])
		if err != nil {
			return err
		}
		recs[i] = b
	}
	return s.append(ctx, recs)
}

func (s *Stream) fill(ev *Event) {
	if ev.Node == "" {
		ev.Node = s.cfg.Node
	}
	if ev.Type == EventMessage && len(ev.Body) > s.cfg.BodyMax {
		ev.BodyBytes, ev.BodyOmitted, ev.Body = len(ev.Body), true, nil
	}
}

func (s *Stream) append(ctx context.Context, recs [][]byte) error {
	wait := time.Millisecond
	held := false
	for {
		err := s.cfg.Journal.Append(ctx, recs)
		if err == nil {
			s.met.eventsAppended(len(recs))
			if held {
				s.met.eventsHeld(-1)
			}
			s.kick()
			return nil
		}
		if !errors.Is(err, ErrFull) {
			if held {
				s.met.eventsHeld(-1)
			}
			return err
		}
		if s.cfg.DropWhenFull {
			s.met.eventsDropped("journal_full", len(recs))
			return nil
		}
		if !held {
			held = true
			s.met.eventsHeld(1)
		}
		s.kick()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			s.met.eventsHeld(-1)
			return fmt.Errorf("%w: %w", ErrFull, ctx.Err())
		case <-t.C:
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}

// EmitAsync queues ev for the async writer without blocking: the connect
// and disconnect events, from paths that must not wait. A full queue
// drops it (counted as dropped{reason="async_queue_full"}).
func (s *Stream) EmitAsync(ev Event) {
	if s.closing.Load() {
		s.met.eventsDropped("closed", 1)
		return
	}
	select {
	case s.async <- ev:
		s.met.asyncDepth(1)
	default:
		s.met.eventsDropped("async_queue_full", 1)
	}
}

func (s *Stream) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// writeAsync journals the queued async events, in batches, until the
// queue is closed and empty.
func (s *Stream) writeAsync(ctx context.Context) {
	evs := make([]Event, 0, s.cfg.Batch)
	for ev := range s.async {
		evs = append(evs[:0], ev)
	more:
		for len(evs) < cap(evs) {
			select {
			case ev, ok := <-s.async:
				if !ok {
					break more
				}
				evs = append(evs, ev)
			default:
				break more
			}
		}
		s.met.asyncDepth(-len(evs))
		if err := s.Emit(ctx, evs); err != nil {
			s.met.eventsDropped("journal_error", len(evs))
			s.log.Warn("connect/disconnect events not journaled", "events", len(evs), "err", err)
		}
	}
}

// Run delivers the journal until Shutdown (or ctx) ends it.
func (s *Stream) Run(ctx context.Context) error {
	defer close(s.stopped)
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { s.writeAsync(actx) })
	defer func() {
		s.closeAsync()
		wg.Wait()
	}()
	poll := time.NewTicker(s.cfg.Poll)
	defer poll.Stop()
	var idle bool
	for {
		drain := false
		select {
		case <-s.draining:
			drain = true
		default:
		}
		if idle {
			if drain {
				return nil
			}
			select {
			case <-ctx.Done():
				return nil
			case <-s.draining:
			case <-s.wake:
			case <-poll.C:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		n, err := s.deliverOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("event journal read failed", "err", err)
			idle = true
			continue
		}
		idle = n == 0
		s.gauges(ctx)
	}
}

func (s *Stream) closeAsync() {
	s.stopOnce.Do(func() {
		s.closing.Store(true)
		close(s.async)
	})
}

func (s *Stream) gauges(ctx context.Context) {
	if s.met == nil {
		return
	}
	if n, err := s.cfg.Journal.Pending(ctx); err == nil {
		s.met.pending(n)
	}
}

type wireBatch struct {
	Events []json.RawMessage `json:"events"`
}

// deliverOnce reads one batch and delivers it (retrying), then acks it.
func (s *Stream) deliverOnce(ctx context.Context) (int, error) {
	recs, err := s.cfg.Journal.Read(ctx, s.cfg.Batch)
	if err != nil || len(recs) == 0 {
		if err == nil {
			s.met.lag(0)
		}
		return 0, err
	}
	evs := make([]Event, len(recs))
	for i, r := range recs {
		if err := json.Unmarshal(r.Data, &evs[i]); err != nil {
			return 0, fmt.Errorf("hooks: journal record %s: %w", r.ID, err)
		}
	}
	orderByGroup(evs)
	s.addOffline(ctx, evs)
	out := wireBatch{Events: make([]json.RawMessage, len(evs))}
	for i := range evs {
		b, _ := json.Marshal(&evs[i])
		out.Events[i] = withID(b, recs[i].ID)
	}
	body, err := json.Marshal(&out)
	if err != nil {
		return 0, err
	}
	oldestMS := evs[0].TS
	for i := range evs {
		oldestMS = min(oldestMS, evs[i].TS)
	}
	oldest := time.UnixMilli(oldestMS)
	s.met.lag(s.cfg.Now().Sub(oldest))
	err = s.post.Retry(ctx, body, s.cfg.Timeout, s.cfg.Backoff, s.cfg.MaxBackoff, s.cfg.MaxAttempts, func(err error) {
		s.met.eventRetry()
		s.met.lag(s.cfg.Now().Sub(oldest))
		s.log.Debug("event delivery retried", "events", len(evs), "err", err)
	})
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err() // not acked: delivered again after a restart
		}
		s.met.eventsDropped("max_attempts", len(evs))
		s.log.Warn("event batch dropped after its attempts", "events", len(evs), "first", recs[0].ID, "err", err)
	} else {
		s.met.eventsDelivered(len(evs))
		s.noteOrder(evs)
	}
	for {
		if err := s.cfg.Journal.Ack(ctx, recs[len(recs)-1].ID); err == nil {
			break
		} else if errors.Is(err, ErrNotDeliverer) {
			s.log.Warn("event delivery lease lost; another node delivers", "first", recs[0].ID)
			return len(recs), nil
		} else if ctx.Err() != nil {
			return 0, ctx.Err()
		} else {
			s.log.Warn("event journal ack failed", "err", err)
		}
		t := time.NewTimer(s.cfg.Backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
	}
	return len(recs), nil
}

// orderByGroup sorts the message events of each group by seq, leaving the
// positions that group's events hold in the batch: appends from several
// nodes may reach the journal in another order than their seqs.
func orderByGroup(evs []Event) {
	if len(evs) < 2 {
		return
	}
	byGID := map[int64][]int{}
	for i := range evs {
		if evs[i].Type == EventMessage {
			byGID[evs[i].GID] = append(byGID[evs[i].GID], i)
		}
	}
	for _, idx := range byGID {
		if len(idx) < 2 {
			continue
		}
		group := make([]Event, len(idx))
		for k, i := range idx {
			group[k] = evs[i]
		}
		slices.SortStableFunc(group, func(a, b Event) int { return int(a.Seq - b.Seq) })
		for k, i := range idx {
			evs[i] = group[k]
		}
	}
}

// noteOrder counts message events delivered below a seq already delivered
// for their group (a duplicate, or an append that came later than the
// journal's reorder window), and remembers the highest.
func (s *Stream) noteOrder(evs []Event) {
	if len(s.lastSeq) > 100000 {
		clear(s.lastSeq) // bounded: forgetting only loses the check
	}
	for i := range evs {
		ev := &evs[i]
		if ev.Type != EventMessage {
			continue
		}
		if last := s.lastSeq[ev.GID]; ev.Seq <= last {
			s.met.eventsReordered()
		} else {
			s.lastSeq[ev.GID] = ev.Seq
		}
	}
}

// addOffline fills the offline lists, one Audience call per group.
func (s *Stream) addOffline(ctx context.Context, evs []Event) {
	if s.cfg.Audience == nil {
		return
	}
	done := map[int64]int{}
	for i := range evs {
		ev := &evs[i]
		if ev.Type != EventMessage {
			continue
		}
		if j, ok := done[ev.GID]; ok {
			ev.Offline, ev.OfflineTruncated = evs[j].Offline, evs[j].OfflineTruncated
			continue
		}
		done[ev.GID] = i
		actx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		list, trunc, err := s.cfg.Audience.Offline(actx, ev.GID, nil, s.cfg.OfflineMax)
		cancel()
		if err != nil {
			s.log.Debug("offline members not read", "gid", ev.GID, "err", err)
			continue
		}
		ev.Offline, ev.OfflineTruncated = list, trunc
	}
}

// withID inserts "id" as the first field of the JSON object b.
func withID(b []byte, id string) json.RawMessage {
	var buf bytes.Buffer
	buf.Grow(len(b) + len(id) + 10)
	buf.WriteString(`{"id":`)
	idj, _ := json.Marshal(id)
	buf.Write(idj)
	if len(b) > 2 {
		buf.WriteByte(',')
	}
	buf.Write(b[1:])
	return buf.Bytes()
}

// Shutdown stops taking async events, journals the queued ones, delivers
// what the journal holds until it is empty or ctx ends (what is left stays
// in the journal, durable, for the next start), and waits for Run.
func (s *Stream) Shutdown(ctx context.Context) error {
	select {
	case <-s.draining:
	default:
		close(s.draining)
	}
	select {
	case <-s.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
