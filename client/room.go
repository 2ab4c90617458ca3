package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// Room is a place in a waiting room (/rooms/{room}/ws). It keeps the
// socket open, redialing with backoff (a user back within the room's grace
// period keeps its position), until Close or a rejected frame: closing
// the socket of an admitted user ends its session.
type Room struct {
	cfg     Config
	cancel  context.CancelFunc
	done    chan struct{}
	updates chan wire.ServerFrame
	mu      sync.Mutex
	err     error
}

// JoinRoom connects to the waiting room at cfg.URL
// (ws://host:port/rooms/{room}/ws) with cfg.Token and returns once the
// socket is open. Only the connection fields of cfg are used (URL, Token,
// TokenFunc, LocalAddr, timeouts, Heartbeat, backoff, Logger).
func JoinRoom(ctx context.Context, cfg Config) (*Room, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	wc, err := dialRoom(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &Room{cfg: cfg, cancel: cancel, done: make(chan struct{}), updates: make(chan wire.ServerFrame, 16)}
	go r.run(rctx, wc)
	return r, nil
}

func dialRoom(ctx context.Context, cfg *Config) (*wsConn, error) {
	token, err := cfg.token(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: token: %w", err)
	}
	return dialWS(ctx, cfg, cfg.URL, token)
}

// Updates returns the room's frames, in arrival order: *wire.Queue (the
// place in line), *wire.Granted (admitted: the access token) and
// *wire.Rejected (the last one). It is closed after a rejection, Close, or
// when redialing cannot succeed (see Err).
func (r *Room) Updates() <-chan wire.ServerFrame { return r.updates }

// Err returns why the Room ended by itself: a *Error with the rejection
// code (room_full, room_closed, rate_limited with RetryAfter), or the
// redial failure. Nil while open and after Close.
func (r *Room) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Done is closed when the Room has ended.
func (r *Room) Done() <-chan struct{} { return r.done }

// Close leaves the room (or ends the admitted session) and waits for the
// Room's goroutine to end.
func (r *Room) Close() error {
	r.cancel()
	<-r.done
	return nil
}

func (r *Room) fail(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// run reads frames and redials until ctx ends or the room rejects.
func (r *Room) run(ctx context.Context, wc *wsConn) {
	defer close(r.done)
	defer close(r.updates)
	attempt := 0
	for {
		start := time.Now()
		end, err := r.serve(ctx, wc)
		if end || ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Info("client: room socket lost", "err", err)
		if time.Since(start) >= stableAfter {
			attempt = 0
		}
		for {
			if !sleep(ctx, backoff(r.cfg.BackoffMin, r.cfg.BackoffMax, attempt)) {
				return
			}
			attempt++
			wc, err = dialRoom(ctx, &r.cfg)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			var he *HandshakeError
			if errors.As(err, &he) && he.permanent() && r.cfg.TokenFunc == nil {
				r.fail(err)
				return
			}
		}
	}
}

// serve reads one connection; end is true when the room is over (rejected
// or ctx ended).
func (r *Room) serve(ctx context.Context, wc *wsConn) (end bool, err error) {
	every := r.cfg.Heartbeat
	if every == 0 {
		every = DefaultHeartbeat
	}
	var (
		seen uint64
		hb   atomic.Pointer[time.Timer]
	)
	hb.Store(time.AfterFunc(every, func() {
		n := wc.recv.Load()
		if n == seen {
			wc.close()
			return
		}
		seen = n
		if wc.writeText(pingFrame) == nil {
			hb.Load().Reset(every)
		}
	}))
	defer func() { hb.Load().Stop() }()
	stop := context.AfterFunc(ctx, func() { wc.closeWith(ws.StatusNormalClosure) })
	defer stop()
	defer wc.close()
	for {
		data, err := wc.read()
		if err != nil {
			return ctx.Err() != nil, err
		}
		f, err := wire.DecodeServer(data)
		if err != nil {
			continue
		}
		switch f := f.(type) {
		case *wire.Queue, *wire.Granted:
			select {
			case r.updates <- f:
			case <-ctx.Done():
				return true, nil
			}
		case *wire.Rejected:
			r.fail(&Error{Code: f.Code, Message: "rejected by room " + f.Room, RetryAfter: time.Duration(f.RetryAfterMS) * time.Millisecond})
			select {
			case r.updates <- f:
			case <-ctx.Done():
			}
			return true, nil
		}
	}
}
