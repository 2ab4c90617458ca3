package bus

import (
	"bytes"
	"context"
	"sync"
)

// Local is an in-process medium that connects the Nodes made by its
// NewNode, with the semantics of the Redis transport: a payload goes to
// every node subscribed to its group (the publisher drops its own), in
// publish order per publisher; Subscribe takes effect when the node
// flushes. It serves engine tests with several nodes in one process and
// embedded mode (a single node, whose publishes then go nowhere).
//
// SetDown simulates an outage: Publish and Ping fail, subscriptions are
// kept (as the Redis transport re-establishes them on reconnect).
type Local struct {
	mu   sync.RWMutex // guards subs, down and the transports' recv
	subs map[int64][]*localTransport
	down bool
}

// NewLocal returns an empty medium.
func NewLocal() *Local {
	return &Local{subs: make(map[int64][]*localTransport)}
}

// NewNode returns a Node on l.
func (l *Local) NewNode(cfg Config) (*Node, error) {
	t := &localTransport{l: l, gids: make(map[int64]struct{})}
	n, err := New(cfg, t)
	if err != nil {
		return nil, err
	}
	// Wired at once, not in Run: a subscription made by the controller
	// must not miss payloads while the receiver goroutine starts (over
	// Redis the socket buffers them).
	t.recv = n.recv
	return n, nil
}

// SetDown starts (true) or ends (false) a simulated outage.
func (l *Local) SetDown(down bool) {
	l.mu.Lock()
	l.down = down
	l.mu.Unlock()
}

type localTransport struct {
	l    *Local
	recv func(int64, []byte) // the node's, set by NewNode
	gids map[int64]struct{}  // guarded by l.mu
}

// Run waits for ctx, then withdraws the node's subscriptions (recv was
// wired by NewNode).
func (t *localTransport) Run(ctx context.Context, _ func(int64, []byte)) error {
	<-ctx.Done()
	t.l.mu.RLock()
	gids := make([]int64, 0, len(t.gids))
	for gid := range t.gids {
		gids = append(gids, gid)
	}
	t.l.mu.RUnlock()
	_ = t.Unsubscribe(context.Background(), gids)
	return nil
}

func (t *localTransport) Publish(_ context.Context, ps []Outgoing) (int, error) {
	l := t.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.down {
		return 0, ErrUnavailable
	}
	for _, p := range ps {
		subs := l.subs[p.GID]
		if len(subs) == 0 {
			continue
		}
		// One copy shared by every receiver: payloads are immutable.
		cp := bytes.Clone(p.Payload)
		for _, s := range subs {
			s.recv(p.GID, cp)
		}
	}
	return len(ps), nil
}

func (t *localTransport) Subscribe(_ context.Context, gids []int64) error {
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, gid := range gids {
		if _, ok := t.gids[gid]; ok {
			continue
		}
		t.gids[gid] = struct{}{}
		l.subs[gid] = append(l.subs[gid], t)
	}
	if l.down {
		return ErrUnavailable
	}
	return nil
}

func (t *localTransport) Unsubscribe(_ context.Context, gids []int64) error {
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, gid := range gids {
		if _, ok := t.gids[gid]; !ok {
			continue
		}
		delete(t.gids, gid)
		subs := l.subs[gid]
		for i, s := range subs {
			if s == t {
				subs[i] = subs[len(subs)-1]
				subs[len(subs)-1] = nil
				subs = subs[:len(subs)-1]
				break
			}
		}
		if len(subs) == 0 {
			delete(l.subs, gid)
		} else {
			l.subs[gid] = subs
		}
	}
	if l.down {
		return ErrUnavailable
	}
	return nil
}

func (t *localTransport) Ping(context.Context) error {
	t.l.mu.RLock()
	defer t.l.mu.RUnlock()
	if t.l.down {
		return ErrUnavailable
	}
	return nil
}
