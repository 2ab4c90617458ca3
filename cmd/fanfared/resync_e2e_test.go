package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// resyncLog records, for one client, the seqs of a group that arrived in
// pushes and the resync frames received.
type resyncLog struct {
	rc      *rawConn
	gid     int64
	mu      sync.Mutex
	pushed  map[int64]bool
	resyncs []int64 // last_seq of each resync, in order
	done    chan struct{}
}

func logResyncs(rc *rawConn, gid int64) *resyncLog {
	l := &resyncLog{rc: rc, gid: gid, pushed: map[int64]bool{}, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			f, err := rc.tryRead(30 * time.Second)
			if err != nil {
				return
			}
			l.mu.Lock()
			switch m := f.(type) {
			case *wire.Msg:
				if m.GID == gid {
					l.pushed[m.Seq] = true
				}
			case *wire.Batch:
				for _, x := range m.Messages {
					l.pushed[x.Seq] = true
				}
			case *wire.Resync:
				if m.GID == gid {
					l.resyncs = append(l.resyncs, m.LastSeq)
				}
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// covered reports whether every seq in [from, to] arrived in a push or is
// at most the last_seq of a resync (so the client knows to pull it).
func (l *resyncLog) covered(from, to int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var resynced int64
	for _, s := range l.resyncs {
		resynced = max(resynced, s)
	}
	for s := from; s <= to; s++ {
		if !l.pushed[s] && s > resynced {
			return false
		}
	}
	return true
}

// TestLoopQueueResync: with a WebSocket loop queue of one frame, a push to
// a group refuses the delivery to all but one connection per event loop.
// Every such connection gets a resync for the group (the gap is not left
// for the next push to reveal), and pulling from there returns exactly the
// messages it missed.
func TestLoopQueueResync(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ts := startServer(t, mode, "-ws-loop-queue", "1")
			// More connections than any machine has event loops (one per
			// CPU), so that some loop serves several of them.
			const online, sends = 24, 20
			uids := make([]string, online+1)
			for i := range uids {
				uids[i] = fmt.Sprintf("u%02d", i)
			}
			gid := ts.createGroup(uids...)
			logs := make([]*resyncLog, online)
			for i := range logs {
				logs[i] = logResyncs(ts.dialRaw(uids[i]), gid)
			}
			// The sender uses HTTP: its acks must not compete for the
			// one-frame queue.
			sender := ts.token(uids[online], 0)
			send := func(n int) int64 {
				var r wire.SendResponse
				if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), sender,
					fmt.Sprintf(`{"id":"m%d","body":{"n":%d}}`, n, n), &r); st != http.StatusOK {
					t.Fatalf("send %d: status %d", n, st)
				}
				return r.Seq
			}
			// Connections register with the engine off the event loop:
			// send until every client has heard of a message (pushed or
			// resynced).
			n := 0
			var first int64
			waitFor(t, 10*time.Second, "every connection registered", func() bool {
				n++
				first = send(n) + 1
				time.Sleep(20 * time.Millisecond)
				for _, l := range logs {
					if !l.covered(first-1, first-1) {
						return false
					}
				}
				return true
			})
			var last int64
			for range sends {
				n++
				last = send(n)
			}
			if last != first+sends-1 {
				t.Fatalf("got last seq %d, want %d", last, first+sends-1)
			}
			for i, l := range logs {
				waitFor(t, 10*time.Second, fmt.Sprintf("client %d to get or be told of seqs %d..%d", i, first, last),
					func() bool { return l.covered(first, last) })
			}
			// The clients now pull what they were told of; the node is
			// quiet, so the replies have the loop queue to themselves.
			resynced := 0
			for i, l := range logs {
				l.rc.c.Close() // stops the reader; pull over a fresh connection
				<-l.done
				l.mu.Lock()
				missing := []int64{}
				for s := first; s <= last; s++ {
					if !l.pushed[s] {
						missing = append(missing, s)
					}
				}
				gotResync := len(l.resyncs) > 0
				l.mu.Unlock()
				if len(missing) == 0 {
					continue
				}
				if !gotResync {
					t.Fatalf("client %d: missed seqs %v without a resync", i, missing)
				}
				resynced++
				rc := ts.dialRaw(uids[i])
				rc.send(fmt.Sprintf(`{"type":"pull","id":"p","gid":%d,"from_seq":%d,"to_seq":%d}`, gid, missing[0], last))
				m, _ := readUntil[*wire.Messages](rc, 10*time.Second)
				got := map[int64]bool{}
				for _, x := range m.Messages {
					got[x.Seq] = true
				}
				for _, s := range missing {
					if !got[s] {
						t.Fatalf("client %d: pull %d..%d returned seqs without %d", i, missing[0], last, s)
					}
				}
				rc.c.Close()
			}
			if resynced == 0 {
				t.Fatalf("no client missed a push: the loop queue bound of 1 was never hit")
			}
			t.Logf("%d of %d clients missed pushes and were resynced", resynced, online)
		})
	}
}

// waitFor polls cond every few milliseconds until it holds, or fails the
// test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
