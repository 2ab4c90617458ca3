// This file holds the engine's side of the application hooks
// (docs/architecture.md §17): the before-send hook, called on the worker
// for the sends of a commit batch, one call per group and the groups in
// parallel (moderate), and the after-commit events, journaled before the
// sends are acked (emitMessages) and on membership changes and connects.

package fanout

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/store"
)

// BeforeSendHook is the before-send hook; *hooks.BeforeSend implements
// it. Check must write one verdict per item and apply its own failure
// policy (it never fails).
type BeforeSendHook interface {
	Applies(gid int64) bool
	Check(ctx context.Context, gid int64, items []hooks.Item, out []hooks.Verdict)
}

// EventSink takes the after-commit events; *hooks.Stream implements it.
type EventSink interface {
	// Emit journals evs durably, in order (a nil error), waiting for
	// room when the journal is full, up to ctx.
	Emit(ctx context.Context, evs []hooks.Event) error
	// EmitAsync queues ev without blocking (connects, disconnects).
	EmitAsync(ev hooks.Event)
}

// hookCall is one group's part of a batch for the before-send hook.
type hookCall struct {
	gid   int64
	idx   []int // positions in the batch
	items []hooks.Item
	out   []hooks.Verdict
}

// moderate runs the before-send hook over tasks and returns the tasks to
// commit (a prefix of tasks, in order); refused ones are answered and
// released. One POST per group; several groups are asked in parallel, so
// the batch waits for the slowest call, at most the hook's timeout.
func (s *shard) moderate(tasks []*task) []*task {
	h := s.e.cfg.BeforeSend
	calls := s.hookCalls[:0]
	for i, t := range tasks {
		if !h.Applies(t.send.GID) {
			continue
		}
		c := -1
		for k := range calls {
			if calls[k].gid == t.send.GID {
				c = k
				break
			}
		}
		if c < 0 {
			calls = append(calls, hookCall{gid: t.send.GID})
			c = len(calls) - 1
		}
		calls[c].idx = append(calls[c].idx, i)
		calls[c].items = append(calls[c].items, hooks.Item{UID: t.send.UID, ClientMsgID: t.send.ClientMsgID, Kind: t.send.Kind, Body: t.send.Body})
	}
	s.hookCalls = calls
	if len(calls) == 0 {
		return tasks
	}
	for k := range calls {
		calls[k].out = make([]hooks.Verdict, len(calls[k].items))
	}
	ctx := context.Background()
	if len(calls) == 1 {
		h.Check(ctx, calls[0].gid, calls[0].items, calls[0].out)
	} else {
		var wg sync.WaitGroup
		for k := range calls {
			c := &calls[k]
			wg.Go(func() { h.Check(ctx, c.gid, c.items, c.out) })
		}
		wg.Wait()
	}
	refused := 0
	for k := range calls {
		c := &calls[k]
		for j, i := range c.idx {
			t := tasks[i]
			switch v := c.out[j]; v.Action {
			case hooks.Rewrite:
				t.send.Body = v.Body
			case hooks.Reject:
				s.refuseByHook(t, &hooks.RejectedError{Code: v.Code})
				tasks[i] = nil
				refused++
			case hooks.Unavailable:
				s.refuseByHook(t, &RetryError{Err: errors.Join(ErrUnavailable, hooks.ErrHookUnavailable), After: time.Second})
				tasks[i] = nil
				refused++
			}
		}
		c.idx, c.items, c.out = c.idx[:0], c.items[:0], nil
	}
	clear(s.hookCalls[:cap(s.hookCalls)][len(calls):]) // keep no stale bodies
	if refused == 0 {
		return tasks
	}
	kept := tasks[:0]
	for _, t := range tasks {
		if t != nil {
			kept = append(kept, t)
		}
	}
	clear(tasks[len(kept):])
	return kept
}

func (s *shard) refuseByHook(t *task, err error) {
	s.e.refundAtAll(s.gs[t.send.GID], t)
	s.e.cfg.Metrics.sends(1, "hook_refused")
	t.send.Done(SendResult{Err: err})
	releaseTask(t)
}

// emitMessages journals the message events of the stored sends of tasks
// (new and duplicates: a retry of a stored message journals it again, so
// a send whose first journal write failed is not lost; receivers dedup
// by gid and seq). The sends are acked only after it returned nil.
func (s *shard) emitMessages(tasks []*task) error {
	evs := s.evs[:0]
	for k, t := range tasks {
		r := s.res[k]
		if r.Err != nil {
			continue
		}
		kind := s.reqs[k].Kind
		if kind == "" {
			kind = store.KindText
		}
		evs = append(evs, hooks.Event{Type: hooks.EventMessage, GID: t.send.GID, Seq: r.Seq, UID: t.send.UID,
			ClientMsgID: t.send.ClientMsgID, Kind: kind, Body: t.send.Body, TS: r.CreatedAt.UnixMilli()})
	}
	s.evs = evs
	if len(evs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.e.cfg.CommitTimeout)
	err := s.e.cfg.Events.Emit(ctx, evs)
	cancel()
	clear(s.evs) // drop body references
	if err != nil {
		s.e.cfg.Logger.Warn("message events not journaled; the sends are answered unavailable (stored: a retry returns their seq and journals them)",
			"shard", s.id, "events", len(evs), "err", err)
		return &RetryError{Err: errors.Join(ErrUnavailable, err), After: time.Second}
	}
	return nil
}

// emitMembers journals a membership change (join or leave) of gid: on
// the group's worker, after the store committed it, before the caller is
// answered.
func (e *Engine) emitMembers(ctx context.Context, typ string, gid int64, ms []store.Member) error {
	if e.cfg.Events == nil || len(ms) == 0 {
		return nil
	}
	ts := e.now().UnixMilli()
	evs := make([]hooks.Event, len(ms))
	for i, m := range ms {
		evs[i] = hooks.Event{Type: typ, GID: gid, UID: m.UID, TS: ts}
	}
	return e.cfg.Events.Emit(ctx, evs)
}

// emitConn queues a connect or disconnect event of uid.
func (e *Engine) emitConn(typ, uid string) {
	if e.cfg.Events != nil {
		e.cfg.Events.EmitAsync(hooks.Event{Type: typ, UID: uid, TS: e.now().UnixMilli()})
	}
}
