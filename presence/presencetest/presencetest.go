// Package presencetest is the conformance suite of presence.Cluster: every
// implementation (the in-process presence.Embedded and
// redispresence.View) runs the same cases through Run, so their semantics
// cannot drift. The suite drives a real presence.Local and checks the
// single-node cluster view of it; multi-node behaviour is tested by the
// multi-node implementation itself.
package presencetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/presence"
)

// Node is one fresh, empty node under test.
type Node struct {
	Local *presence.Local[int]
	View  presence.Cluster
	ID    string // the id View reports in Nodes
}

// Factory builds a Node whose View publishes Local. It registers its own
// cleanup with t.
type Factory func(t *testing.T) Node

// Run runs the conformance suite against newNode.
func Run(t *testing.T, newNode Factory) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			h := &harness{t: t, n: n, ctx: t.Context()}
			tc.run(h)
		})
	}
}

type harness struct {
	t   *testing.T
	n   Node
	ctx context.Context
}

func (h *harness) connect(uid string, conn int, ms ...presence.Membership) {
	h.t.Helper()
	if err := h.n.Local.Connect(uid, conn, ms); err != nil {
		h.t.Fatalf("Connect(%s, %d): %v", uid, conn, err)
	}
}

func (h *harness) flush() {
	h.t.Helper()
	if err := h.n.View.Flush(h.ctx); err != nil {
		h.t.Fatalf("Flush: %v", err)
	}
}

// expect checks count, nodes and a consistent OnlineAnywhere answer against
// the local index for the given ordinals.
func (h *harness) expect(gid int64, wantCount int64, probe []uint32) {
	h.t.Helper()
	got, err := h.n.View.OnlineCount(h.ctx, gid)
	if err != nil || got != wantCount {
		h.t.Fatalf("gid %d: OnlineCount got %d, %v; want %d", gid, got, err, wantCount)
	}
	nodes, err := h.n.View.Nodes(h.ctx, gid)
	var wantNodes []string
	if wantCount > 0 {
		wantNodes = []string{h.n.ID}
	}
	if err != nil || !slices.Equal(nodes, wantNodes) {
		h.t.Fatalf("gid %d: Nodes got %v, %v; want %v", gid, nodes, err, wantNodes)
	}
	prefix := []bool{true, false}
	ans, err := h.n.View.OnlineAnywhere(h.ctx, gid, probe, slices.Clone(prefix))
	if err != nil {
		h.t.Fatalf("gid %d: OnlineAnywhere: %v", gid, err)
	}
	if len(ans) != len(prefix)+len(probe) || !slices.Equal(ans[:2], prefix) {
		h.t.Fatalf("gid %d: OnlineAnywhere got %d answers (prefix %v), want %d after the kept prefix", gid, len(ans), ans[:min(2, len(ans))], len(probe))
	}
	for i, o := range probe {
		if want := h.n.Local.ContainsOrdinal(gid, o); ans[2+i] != want {
			h.t.Fatalf("gid %d: OnlineAnywhere(%d) got %v, want %v", gid, o, ans[2+i], want)
		}
	}
	if h.n.View.Stale() {
		h.t.Fatal("Stale: got true on a healthy view")
	}
}

func m(gid int64, ord uint32) presence.Membership { return presence.Membership{GID: gid, Ordinal: ord} }

var cases = []struct {
	name string
	run  func(h *harness)
}{
	{"empty group", func(h *harness) {
		h.flush()
		h.expect(1, 0, []uint32{0, 1, 1 << 20})
		ans, err := h.n.View.OnlineAnywhere(h.ctx, 1, nil, nil)
		if err != nil || len(ans) != 0 {
			h.t.Fatalf("empty batch: got %v, %v", ans, err)
		}
	}},
	{"one user", func(h *harness) {
		h.connect("a", 1, m(1, 5))
		h.flush()
		h.expect(1, 1, []uint32{4, 5, 6})
		h.expect(2, 0, []uint32{5})
	}},
	{"several devices count once", func(h *harness) {
		h.connect("a", 1, m(1, 5))
		h.connect("a", 2, m(1, 5))
		h.connect("b", 3, m(1, 9))
		h.flush()
		h.expect(1, 2, []uint32{5, 9, 10})
		h.n.Local.Disconnect("a", 1)
		h.flush()
		h.expect(1, 2, []uint32{5, 9})
	}},
	{"many members across containers", func(h *harness) {
		var probe []uint32
		for i := range 3000 {
			ord := uint32(i * 71)
			h.connect(fmt.Sprintf("u%d", i), i, m(7, ord))
			probe = append(probe, ord, ord+1)
		}
		h.flush()
		h.expect(7, 3000, probe)
		// Change a few: exercises incremental publishing.
		for i := 0; i < 3000; i += 100 {
			h.n.Local.Disconnect(fmt.Sprintf("u%d", i), i)
		}
		h.connect("late", 100000, m(7, 1))
		h.flush()
		h.expect(7, 2971, probe)
	}},
	{"join and leave", func(h *harness) {
		h.connect("a", 1, m(1, 1))
		h.connect("b", 2)
		h.flush()
		h.expect(1, 1, []uint32{1, 2})
		if err := h.n.Local.Join(1, "b", 2); err != nil {
			h.t.Fatal(err)
		}
		h.flush()
		h.expect(1, 2, []uint32{1, 2})
		h.n.Local.Leave(1, "a")
		h.flush()
		h.expect(1, 1, []uint32{1, 2})
		h.n.Local.Leave(1, "b")
		h.flush()
		h.expect(1, 0, []uint32{1, 2})
	}},
	{"last disconnect empties every group", func(h *harness) {
		h.connect("a", 1, m(1, 1), m(2, 3), m(3, 0))
		h.flush()
		h.expect(2, 1, []uint32{3})
		h.n.Local.Disconnect("a", 1)
		h.flush()
		for _, gid := range []int64{1, 2, 3} {
			h.expect(gid, 0, []uint32{0, 1, 3})
		}
	}},
	{"groups are independent", func(h *harness) {
		h.connect("a", 1, m(1, 1))
		h.connect("b", 2, m(2, 1), m(3, 2))
		h.flush()
		h.expect(1, 1, []uint32{1, 2})
		h.expect(2, 1, []uint32{1, 2})
		h.expect(3, 1, []uint32{1, 2})
	}},
	{"remove group", func(h *harness) {
		h.connect("a", 1, m(1, 1), m(2, 1))
		h.connect("b", 2, m(1, 2))
		h.flush()
		h.n.Local.RemoveGroup(1)
		h.flush()
		h.expect(1, 0, []uint32{1, 2})
		h.expect(2, 1, []uint32{1})
	}},
	{"heartbeat expiry", func(h *harness) {
		h.connect("a", 1, m(1, 1))
		h.connect("b", 2, m(1, 2))
		h.flush()
		h.expect(1, 2, []uint32{1, 2})
		// Config TTL of the Local under test is at most DefaultTTL.
		expired := h.n.Local.Expire(time.Now().Add(presence.DefaultTTL + time.Hour))
		if len(expired) != 2 {
			h.t.Fatalf("Expire: got %v, want both", expired)
		}
		h.flush()
		h.expect(1, 0, []uint32{1, 2})
	}},
	{"large ordinal", func(h *harness) {
		const big = 1<<22 + 3
		h.connect("a", 1, m(1, big), m(1<<40, 0))
		h.flush()
		h.expect(1, 1, []uint32{big, big - 1, 0})
		h.expect(1<<40, 1, []uint32{0})
	}},
	{"flush without changes is idempotent", func(h *harness) {
		h.connect("a", 1, m(1, 1))
		h.flush()
		h.flush()
		h.flush()
		h.expect(1, 1, []uint32{1})
	}},
	{"cancelled context", func(h *harness) {
		ctx, cancel := context.WithCancel(h.ctx)
		cancel()
		if _, err := h.n.View.OnlineCount(ctx, 1); !errors.Is(err, context.Canceled) {
			h.t.Fatalf("OnlineCount: got %v, want context.Canceled", err)
		}
	}},
}
