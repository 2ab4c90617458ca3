package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// TestTwoNodes: two nodes share Postgres and Redis; a message accepted by
// one node is pushed, in order, to the members online on the other (the
// cross-node bus), and seqs stay dense whichever node accepts a send.
func TestTwoNodes(t *testing.T) {
	url := pgtest.URL(t)
	common := []string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwt-secret", testSecret,
		"-admin-token", "test-admin-token", "-log-level", "warn", "-limits-file", unlimited(t),
		"-postgres-url", url, "-postgres-schema", pgtest.Schema(t, url),
		"-redis-addr", redisAddr(t), "-redis-prefix", "t" + randomHex(6) + ":"}
	a := startArgs(t, append([]string{"-node-id", "node-a"}, common...))
	b := startArgs(t, append([]string{"-node-id", "node-b"}, common...))
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
	// node b subscribes to the group's channel within its flush interval.
	deadline := time.Now().Add(10 * time.Second)
	var last int64
	for {
		last = send(alice, fmt.Sprintf("probe-%d", last+1))
		if f, err := bob.tryRead(300 * time.Millisecond); err == nil {
			if m, ok := f.(*wire.Msg); ok && m.Seq == last {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no push crossed from node a to node b in 10 s")
		}
		bob.c.SetReadDeadline(time.Time{})
	}
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
