package redisroom

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// enterQueue coalesces the concurrent Enters of one room into enter script
// calls of up to Config.EnterBatch users each. A room has at most
// Config.EnterInFlight calls under way; an Enter that finds a free slot
// goes at once (alone, when the node is quiet: no added wait), and the
// Enters that arrive while every slot is taken join the next call, which
// the first call to finish sends. The script enters a batch's users one
// after another, so a batch has the same effect as that many calls in a
// row at the same second, while the script's fixed cost (its start, the
// room's configuration, the clock, the counts it reads once) and the round
// trip are paid once per call instead of once per user: on a Redis holding
// 1M waiting users the fixed part is most of a lone enter's Redis time
// (docs/benchmarks.md, "Waiting room").
//
// A batch carries one configuration (ARGV 1-22): Enters of the same room
// under different configurations (the Manager's degraded or reloaded
// view) go into separate lanes.
type enterQueue struct {
	max, slots int
	calls      atomic.Int64 // script calls sent (tests)

	mu    sync.Mutex
	lanes map[string]*enterLane // by room and configuration
}

// enterLane is one room and configuration's calls.
type enterLane struct {
	inflight int
	ready    []*enterBatch // waiting for a slot, oldest first; the last may still take users
}

// enterBatch is one enter script call.
type enterBatch struct {
	key  string
	keys []string
	args []any // the configuration, then 11 fields per user
	n    int

	ctx       context.Context // the first user's, without its cancellation
	deadline  time.Time       // the latest of the users' deadlines
	unbounded bool            // some user's context has no deadline

	done  chan struct{}
	reply []any
	err   error
}

func newEnterQueue(max, slots int) *enterQueue {
	return &enterQueue{max: max, slots: slots, lanes: make(map[string]*enterLane)}
}

// enter runs user (the 11 script fields of one user) in cfg's room and
// returns that user's reply.
func (q *enterQueue) enter(ctx context.Context, b *Backend, cfg *waitroom.RoomConfig, user []any) ([]any, error) {
	conf := args(cfg)
	var sb strings.Builder
	sb.WriteString(cfg.Name)
	for _, a := range conf {
		sb.WriteByte(0)
		sb.WriteString(a.(string))
	}
	key := sb.String()

	q.mu.Lock()
	lane := q.lanes[key]
	if lane == nil {
		lane = &enterLane{}
		q.lanes[key] = lane
	}
	var bt *enterBatch
	if n := len(lane.ready); n > 0 && lane.ready[n-1].n < q.max {
		bt = lane.ready[n-1]
	} else {
		bt = &enterBatch{key: key, keys: b.keys(cfg), args: append(conf, make([]any, 0, 11)...), ctx: context.WithoutCancel(ctx),
			done: make(chan struct{})}
		lane.ready = append(lane.ready, bt)
	}
	i := bt.n
	bt.n++
	bt.args = append(bt.args, user...)
	if dl, ok := ctx.Deadline(); !ok {
		bt.unbounded = true
	} else if dl.After(bt.deadline) {
		bt.deadline = dl
	}
	run := q.takeLocked(lane)
	q.mu.Unlock()
	if run == bt {
		q.run(b, run) // our own call: no hand-over to another goroutine
	} else if run != nil {
		go q.run(b, run)
	}

	select {
	case <-bt.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if bt.err != nil {
		return nil, bt.err
	}
	if len(bt.reply) != bt.n {
		return nil, fmt.Errorf("redisroom: enter reply has %d users for %d", len(bt.reply), bt.n)
	}
	return toSlice(bt.reply[i]), nil
}

// takeLocked takes the lane's oldest batch when a slot is free.
func (q *enterQueue) takeLocked(lane *enterLane) *enterBatch {
	if lane.inflight >= q.slots || len(lane.ready) == 0 {
		return nil
	}
	bt := lane.ready[0]
	lane.ready[0] = nil
	lane.ready = lane.ready[1:]
	lane.inflight++
	return bt
}

// run sends one batch, then hands its slot to the lane's next batch.
func (q *enterQueue) run(b *Backend, bt *enterBatch) {
	ctx := bt.ctx
	if !bt.unbounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, bt.deadline)
		defer cancel()
	}
	q.calls.Add(1)
	v, err := enterScript.Run(ctx, b.c, bt.keys, bt.args...).Result()
	if err != nil {
		bt.err = wrap(ctx, err)
	} else if r, ok := v.([]any); ok {
		bt.reply = r
	} else {
		bt.err = fmt.Errorf("redisroom: unexpected script reply %T", v)
	}
	close(bt.done)

	q.mu.Lock()
	lane := q.lanes[bt.key]
	lane.inflight--
	next := q.takeLocked(lane)
	if lane.inflight == 0 && len(lane.ready) == 0 {
		delete(q.lanes, bt.key)
	}
	q.mu.Unlock()
	if next != nil {
		go q.run(b, next)
	}
}
