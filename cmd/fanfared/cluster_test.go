package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// startTwoNodes starts node-a and node-b on one Postgres schema and one
// Redis key prefix of their own, with extra flags on both.
func startTwoNodes(t *testing.T, extra ...string) (a, b *testServer) {
	t.Helper()
	url := pgtest.URL(t)
	common := []string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwt-secret", testSecret,
		"-admin-token", "test-admin-token", "-log-level", "warn", "-limits-file", unlimited(t),
		"-postgres-url", url, "-postgres-schema", pgtest.Schema(t, url),
		"-redis-addr", redisAddr(t), "-redis-prefix", "t" + randomHex(6) + ":"}
	common = append(common, extra...)
	a = startArgs(t, append([]string{"-node-id", "node-a"}, common...))
	b = startArgs(t, append([]string{"-node-id", "node-b"}, common...))
	return a, b
}

// TestTwoNodes: two nodes share Postgres and Redis; a message accepted by
// one node is pushed, in order, to the members online on the other (the
// cross-node bus), and seqs stay dense whichever node accepts a send.
func TestTwoNodes(t *testing.T) {
	a, b := startTwoNodes(t)
	gid := a.createGroup("alice", "bob", "carol")
	bob := b.dialRaw("bob")     // online on node b
	carol := a.dialRaw("carol") // online on node a
	if bob.hello.Node != "node-b" || carol.hello.Node != "node-a" {
		t.Fatalf("hello nodes: bob %q, carol %q", bob.hello.Node, carol.hello.Node)
	}
	alice := a.dialRaw("alice")

	send := func(rc *rawConn, id string) int64 {
		rc.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"body":%q}`, id, gid, id))
		ack, _ := readUntil[*wire.Ack](rc, 10*time.Second)
		return ack.Seq
	}
	next := func(rc *rawConn) *wire.Msg {
		m, _ := readUntil[*wire.Msg](rc, 10*time.Second)
		return m
	}
	// Each node subscribes to the group's channel within its flush
	// interval: probe both directions until a push crosses (a batch sent
	// before is a gap a real client pulls; this raw one does not).
	var last int64
	probe := func(from, to *rawConn, dir string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			last = send(from, fmt.Sprintf("probe-%d", last+1))
			for {
				f, err := to.tryRead(300 * time.Millisecond)
				if err != nil {
					break
				}
				if m, ok := f.(*wire.Msg); ok && m.Seq == last {
					to.c.SetReadDeadline(time.Time{})
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no push crossed %s in 10 s", dir)
			}
			to.c.SetReadDeadline(time.Time{})
		}
	}
	probe(alice, bob, "from node a to node b")
	probe(bob, carol, "from node b to node a")
	// From now on every message accepted by node a reaches bob on node b,
	// and every message accepted by node b reaches carol on node a.
	for i := range 30 {
		from, to, other := alice, bob, "bob"
		if i%2 == 1 {
			from, to, other = bob, carol, "carol"
		}
		seq := send(from, fmt.Sprintf("m%d", i))
		if seq != last+1 {
			t.Fatalf("message %d got seq %d, want %d (dense across nodes)", i, seq, last+1)
		}
		last = seq
		for {
			m := next(to)
			if m.Seq == seq {
				break
			}
			if m.Seq > seq {
				t.Fatalf("%s got seq %d before %d", other, m.Seq, seq)
			}
		}
	}
}

// TestMembershipAcrossNodes: bob, online on node b, is added to a group
// through node a's HTTP API and gets b's push of the next message sent on
// a without reconnecting; removed through a, he gets no push of the
// message after. Carol, online on b too, keeps b subscribed to the group,
// so the change and the message after it reach b in publish order (one
// Redis server): no retry is needed. In a second group bob is the only
// member online on b, which subscribes to it when he is added.
func TestMembershipAcrossNodes(t *testing.T) {
	a, b := startTwoNodes(t)
	gid := a.createGroup("alice", "carol")
	carol := b.dialRaw("carol")
	bob := b.dialRaw("bob")
	alice := a.dialRaw("alice")
	if bob.hello.Node != "node-b" || alice.hello.Node != "node-a" {
		t.Fatalf("hello nodes: bob %q, alice %q", bob.hello.Node, alice.hello.Node)
	}
	send := func(gid int64, id string) int64 {
		alice.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"body":%q}`, id, gid, id))
		ack, _ := readUntil[*wire.Ack](alice, 10*time.Second)
		return ack.Seq
	}
	// waitMsg reads rc's frames until the push of gid's seq.
	waitMsg := func(rc *rawConn, who string, gid, seq int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			f, err := rc.tryRead(time.Until(deadline))
			if err != nil {
				t.Fatalf("%s: no push of %d/%d: %v", who, gid, seq, err)
			}
			if m, ok := f.(*wire.Msg); ok && m.GID == gid && m.Seq == seq {
				return
			}
		}
	}
	// Node b's subscription to the group (carol) is in place once one
	// message sent on a reached carol.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		seq := send(gid, fmt.Sprintf("probe-%d", i))
		if f, err := carol.tryRead(300 * time.Millisecond); err == nil {
			if m, ok := f.(*wire.Msg); ok && m.Seq == seq {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no push crossed from node a to node b in 10 s")
		}
	}

	a.addMembers(gid, "bob")
	seq := send(gid, "for-bob")
	waitMsg(bob, "bob", gid, seq)
	waitMsg(carol, "carol", gid, seq)

	if st := a.do("DELETE", fmt.Sprintf("/v1/groups/%d/members/bob", gid), a.admin, nil, nil); st != http.StatusNoContent {
		t.Fatalf("remove bob: status %d", st)
	}
	after := send(gid, "after-removal")
	waitMsg(carol, "carol", gid, after) // b has handled the removal by now
	// A push to bob would have been written before carol's was read; give
	// it a moment anyway.
	for {
		f, err := bob.tryRead(200 * time.Millisecond)
		if err != nil {
			break // nothing more for bob
		}
		if m, ok := f.(*wire.Msg); ok && m.GID == gid && m.Seq >= after {
			t.Fatalf("bob, removed on node a, got push of seq %d on node b", m.Seq)
		}
	}

	// A group with nobody online on b: b subscribes when bob is added.
	g2 := a.createGroup("alice")
	a.addMembers(g2, "bob")
	deadline = time.Now().Add(5 * time.Second)
	for i := 0; ; i++ {
		seq := send(g2, fmt.Sprintf("g2-%d", i))
		if f, err := bob.tryRead(100 * time.Millisecond); err == nil {
			if m, ok := f.(*wire.Msg); ok && m.GID == g2 && m.Seq == seq {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("bob on node b got no push of a group he was added to on node a in 5 s")
		}
	}
}

// TestAtAllAcrossNodes: a group's @all quota is the cluster's: with 2 a
// day, one @all through each node uses it up for both, and the third is
// refused rate_limited until the next UTC midnight, whichever node takes
// it. A retry through the other node gets the original seq.
func TestAtAllAcrossNodes(t *testing.T) {
	a, b := startTwoNodes(t, "-at-all-per-day", "2")
	gid := a.createGroup("alice", "bob")
	alice := a.dialRaw("alice")
	bob := b.dialRaw("bob")
	atAll := func(rc *rawConn, id string) wire.ServerFrame {
		t.Helper()
		rc.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"kind":"at_all","body":"all"}`, id, gid))
		deadline := time.Now().Add(10 * time.Second)
		for {
			f, err := rc.tryRead(time.Until(deadline))
			if err != nil {
				t.Fatalf("send %s: no answer: %v", id, err)
			}
			switch f := f.(type) {
			case *wire.Ack:
				if f.ID == id {
					return f
				}
			case *wire.Error:
				if f.ID == id {
					return f
				}
			}
		}
	}
	first, ok := atAll(alice, "a1").(*wire.Ack)
	if !ok {
		t.Fatal("first @all, node a: not acked")
	}
	if _, ok := atAll(bob, "b1").(*wire.Ack); !ok {
		t.Fatal("second @all, node b: not acked")
	}
	for _, rc := range []*rawConn{alice, bob} {
		f := atAll(rc, "third-"+rc.hello.Node)
		e, ok := f.(*wire.Error)
		if !ok || e.Code != wire.CodeRateLimited || e.RetryAfterMS <= 0 {
			t.Fatalf("third @all on %s: got %#v, want rate_limited with retry_after_ms", rc.hello.Node, f)
		}
	}
	// alice's first @all, retried through node b (a reconnect elsewhere).
	alice2 := b.dialRaw("alice")
	if ack, ok := atAll(alice2, "a1").(*wire.Ack); !ok || ack.Seq != first.Seq {
		t.Fatalf("retry of alice's @all on node b: got %#v, want ack seq %d", ack, first.Seq)
	}
}
