package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestMain lets the test binary act as a fanfared process, so that crash
// tests can kill -9 a real server: FANFARE_E2E_SERVER=1 runs run() with the
// process arguments after "--".
func TestMain(m *testing.M) {
	if os.Getenv("FANFARE_E2E_SERVER") == "1" {
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		ctx, stop := signalContext()
		defer stop()
		if err := run(ctx, args, os.Getenv, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "fanfared:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serverEnv is the environment of a server process a test starts: the
// test's own, without the FANFARE_ settings a developer may have exported
// for a fanfared of their own (a FANFARE_REDIS_ADDR would make an
// embedded test node refuse to start), and with FANFARE_E2E_SERVER=1.
func serverEnv() []string {
	env := []string{"FANFARE_E2E_SERVER=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FANFARE_") || strings.HasPrefix(kv, "FANFARE_TEST_") {
			env = append(env, kv)
		}
	}
	return env
}

// proc is a fanfared child process.
type proc struct {
	t    *testing.T
	args []string
	cmd  *exec.Cmd
	http string
	ws   string
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startProc(t *testing.T, args []string) *proc {
	t.Helper()
	p := &proc{t: t, args: args}
	for i, a := range args {
		switch a {
		case "-http-addr":
			p.http = "http://" + args[i+1]
		case "-ws-addr":
			p.ws = "ws://" + args[i+1]
		}
	}
	p.start()
	t.Cleanup(func() { p.kill() })
	return p
}

func (p *proc) start() {
	p.t.Helper()
	p.cmd = exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, p.args...)...)
	p.cmd.Env = serverEnv()
	p.cmd.Stderr = io.Discard
	if testing.Verbose() {
		p.cmd.Stderr = os.Stderr
	}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("fanfared child not ready after 30 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// term sends SIGTERM and waits for a clean exit within bound.
func (p *proc) term(bound time.Duration) {
	p.t.Helper()
	start := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			p.t.Errorf("graceful shutdown: %v", err)
		}
		p.t.Logf("graceful shutdown took %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(bound):
		p.t.Errorf("graceful shutdown took longer than %v", bound)
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	p.cmd = nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
	p.cmd = nil
}

// TestCrashLedger: senders record every ack while the server is stopped
// mid-load twice, once gracefully (SIGTERM: a rolling restart) and once
// with SIGKILL, and restarted; clients reconnect and retry with the same
// client_msg_id. Afterwards every acked message is stored exactly
// once with dense seqs, and every receiving client got every stored message
// (pushed or pulled) exactly once, in order.
func TestCrashLedger(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			args := []string{"-ws-addr", freePort(t), "-http-addr", freePort(t), "-jwt-secret", testSecret,
				"-admin-token", "test-admin-token", "-log-level", "warn", "-shutdown-timeout", "10s", "-limits-file", unlimited(t)}
			args = append(args, modeArgs(t, mode)...)
			p := startProc(t, args)
			ts := &testServer{t: t, http: p.http, ws: p.ws, admin: "test-admin-token"}
			ts.signer = newTestSigner(t)

			const receivers, senders = 20, 4
			var uids []string
			for i := range receivers + senders {
				uids = append(uids, fmt.Sprintf("u%d", i))
			}
			gid := ts.createGroup(uids...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			dial := func(uid string, onMsg func(client.Message)) *client.Conn {
				c, err := client.Dial(ctx, client.Config{URL: p.ws + "/ws", HTTPURL: p.http, Token: ts.token(uid, 0),
					BackoffMin: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond, OnMessage: onMsg, MaxRetries: 100})
				if err != nil {
					t.Fatalf("dial %s: %v", uid, err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			type got struct {
				mu   sync.Mutex
				seqs []int64
				dups int
			}
			recv := make([]*got, receivers)
			for i := range receivers {
				g := &got{}
				recv[i] = g
				c := dial(uids[i], func(m client.Message) {
					g.mu.Lock()
					defer g.mu.Unlock()
					if n := len(g.seqs); n > 0 && m.Seq <= g.seqs[n-1] {
						g.dups++
						return
					}
					g.seqs = append(g.seqs, m.Seq)
				})
				c.Track(gid, 0)
			}

			var mu sync.Mutex
			acked := map[string]int64{}
			var stop atomic.Bool
			var wg sync.WaitGroup
			for s := range senders {
				c := dial(uids[receivers+s], nil)
				wg.Go(func() {
					for i := 0; !stop.Load(); i++ {
						id := fmt.Sprintf("s%d-%d", s, i)
						a, err := c.Send(ctx, gid, json.RawMessage(strconv.Quote(id)), client.WithID(id))
						if err != nil {
							t.Errorf("send %s: %v", id, err)
							return
						}
						mu.Lock()
						acked[id] = a.Seq
						mu.Unlock()
					}
				})
			}
			count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
			waitAcks := func(n int) {
				for deadline := time.Now().Add(60 * time.Second); count() < n; {
					if time.Now().After(deadline) {
						t.Fatalf("only %d acks, want %d", count(), n)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			waitAcks(300)
			p.term(30 * time.Second)
			p.start()
			waitAcks(count() + 300)
			p.kill()
			p.start()
			waitAcks(count() + 300)
			stop.Store(true)
			wg.Wait()

			// The store: dense seqs, each acked id once under its acked seq.
			var stored []wire.Msg
			tok := ts.token(uids[0], 0)
			for from := int64(1); ; {
				var page wire.MessagesPage
				if st := ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=%d", gid, from), tok, nil, &page); st != 200 {
					t.Fatalf("pull: status %d", st)
				}
				stored = append(stored, page.Messages...)
				if len(page.Messages) == 0 || page.Messages[len(page.Messages)-1].Seq >= page.LastSeq {
					break
				}
				from = page.Messages[len(page.Messages)-1].Seq + 1
			}
			byID := map[string]int64{}
			for i, m := range stored {
				if m.Seq != int64(i+1) {
					t.Fatalf("stored seqs not dense: seq %d at index %d", m.Seq, i)
				}
				id := strings.Trim(string(m.Body), `"`)
				if prev, ok := byID[id]; ok {
					t.Fatalf("%s stored twice: seqs %d and %d", id, prev, m.Seq)
				}
				byID[id] = m.Seq
			}
			mu.Lock()
			for id, seq := range acked {
				if byID[id] != seq {
					t.Errorf("%s acked as seq %d, stored as %d", id, seq, byID[id])
				}
			}
			t.Logf("%s: %d acked, %d stored across a graceful restart and a kill -9", mode, len(acked), len(stored))
			mu.Unlock()

			// Every client has everything, once, in order.
			total := int64(len(stored))
			for i, g := range recv {
				deadline := time.Now().Add(60 * time.Second)
				for {
					g.mu.Lock()
					n, dups := len(g.seqs), g.dups
					var last int64
					if n > 0 {
						last = g.seqs[n-1]
					}
					g.mu.Unlock()
					if dups > 0 {
						t.Fatalf("client %d got %d duplicates or reorders", i, dups)
					}
					if last == total {
						if int64(n) != total {
							t.Fatalf("client %d got %d messages up to seq %d", i, n, total)
						}
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("client %d has %d messages (last %d), want %d", i, n, last, total)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
}
