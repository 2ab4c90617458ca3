package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// TestStoreDown stops Postgres under a running node: sends are refused
// with the retryable unavailable code and never acked, the node stays up
// (healthz) but not ready, and it recovers by itself when Postgres returns.
// Every acked message is stored, with dense seqs.
func TestStoreDown(t *testing.T) {
	pg := pgtest.StartThrowaway(t, 25440, 25447)
	ts := startArgs(t, []string{"-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-jwt-secret", testSecret,
		"-admin-token", "test-admin-token", "-log-level", "error", "-postgres-url", pg.URL(), "-limits-file", unlimited(t)})
	gid := ts.createGroup("alice", "bob")
	alice := ts.dialRaw("alice")
	acked := map[int64]string{}
	sendOne := func(id string) (*wire.Ack, *wire.Error) {
		alice.send(fmt.Sprintf(`{"type":"send","id":%q,"gid":%d,"body":%q}`, id, gid, id))
		for {
			switch f := alice.read(20 * time.Second).(type) {
			case *wire.Ack:
				acked[f.Seq] = id
				return f, nil
			case *wire.Error:
				return nil, f
			}
		}
	}
	for i := range 10 {
		if _, e := sendOne(fmt.Sprintf("before-%d", i)); e != nil {
			t.Fatalf("send before outage: %+v", e)
		}
	}

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		a, e := sendOne(fmt.Sprintf("during-%d", i))
		if a != nil {
			t.Fatalf("send during outage was acked: %+v", a)
		}
		if e.Code != wire.CodeUnavailable || e.RetryAfterMS <= 0 {
			t.Fatalf("send during outage: got %+v, want unavailable with retry_after_ms", e)
		}
	}
	if st := ts.do("GET", "/healthz", "", nil, nil); st != http.StatusOK {
		t.Errorf("healthz during outage: %d, want 200", st)
	}
	if st := ts.do("GET", "/readyz", "", nil, nil); st != http.StatusServiceUnavailable {
		t.Errorf("readyz during outage: %d, want 503", st)
	}

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	// The pool reconnects on its own; retries with the same ids succeed.
	deadline := time.Now().Add(30 * time.Second)
	for i := range 5 {
		id := fmt.Sprintf("during-%d", i)
		for {
			_, e := sendOne(id)
			if e == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no recovery after Postgres restart: %+v", e)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// /readyz reuses its store check for -ready-every (1 s): it may
	// answer 503 that long after the store is back.
	for st := 0; st != http.StatusOK; {
		if st = ts.do("GET", "/readyz", "", nil, nil); st != http.StatusOK && time.Now().After(deadline) {
			t.Fatalf("readyz after recovery: %d, want 200", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var page wire.MessagesPage
	ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", gid), ts.token("bob", 0), nil, &page)
	stored := map[string]int64{}
	for i, m := range page.Messages {
		if m.Seq != int64(i+1) {
			t.Fatalf("stored seqs not dense: %d at %d", m.Seq, i)
		}
		var id string
		fmt.Sscanf(string(m.Body), "%q", &id)
		if prev, dup := stored[id]; dup {
			t.Fatalf("message %s stored twice (seqs %d and %d)", id, prev, m.Seq)
		}
		stored[id] = m.Seq
	}
	for seq, id := range acked {
		if stored[id] != seq {
			t.Errorf("acked %s as seq %d, stored as %d", id, seq, stored[id])
		}
	}
	if len(stored) != 15 {
		t.Errorf("stored %d messages, want 15", len(stored))
	}
}
