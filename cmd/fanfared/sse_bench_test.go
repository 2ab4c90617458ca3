package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// BenchmarkTransportFanout compares what a delivery and a subscriber cost
// the server over WebSocket and over Server-Sent Events: a fanfared
// process (built from this checkout, embedded mode) with 1,000 subscribers
// of one group, all over one transport, and one message sent over HTTP
// per iteration. It reports the server process's CPU time per delivery
// (user + system, from /proc, so the subscribers in this process do not
// count) and its RSS growth per subscriber once they are connected.
//
//	go test -run '^$' -bench BenchmarkTransportFanout -benchtime 2000x ./cmd/fanfared
func BenchmarkTransportFanout(b *testing.B) {
	const subscribers = 1000
	bin := filepath.Join(b.TempDir(), "fanfared")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fanfare-im/fanfare/cmd/fanfared").CombinedOutput(); err != nil {
		b.Fatalf("building fanfared: %v\n%s", err, out)
	}
	for _, tr := range []string{"websocket", "sse"} {
		p := startBenchServer(b, bin)
		gid := p.group(b, subscribers)
		rss0 := p.rss(b)
		subs := p.subscribe(b, tr, subscribers)
		perConn := float64(p.rss(b)-rss0) / subscribers
		var seq int64
		b.Run(fmt.Sprintf("transport=%s/subscribers=%d", tr, subscribers), func(b *testing.B) {
			var msgs0, resyncs0 int64
			for _, s := range subs {
				msgs0 += s.msgs.Load()
				resyncs0 += s.resyncs.Load()
			}
			cpu0 := p.cpu(b)
			b.ResetTimer()
			for range b.N {
				seq++
				p.send(b, gid, int(seq))
			}
			// Every subscriber has seen the last seq, by a push or by a
			// resync (a subscriber that fell behind the outbound bound).
			deadline := time.Now().Add(3 * time.Minute)
			for _, s := range subs {
				for s.last.Load() < seq {
					if time.Now().After(deadline) {
						b.Fatalf("a subscriber is at seq %d of %d", s.last.Load(), seq)
					}
					time.Sleep(time.Millisecond)
				}
			}
			b.StopTimer()
			cpu := p.cpu(b) - cpu0
			var msgs, resyncs int64
			for _, s := range subs {
				msgs += s.msgs.Load()
				resyncs += s.resyncs.Load()
			}
			msgs -= msgs0
			resyncs -= resyncs0
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(msgs), "server-cpu-ns/delivery")
			b.ReportMetric(perConn, "server-rss-B/subscriber")
			b.ReportMetric(float64(msgs)/b.Elapsed().Seconds(), "deliveries/s")
			b.ReportMetric(float64(msgs)/float64(int64(b.N)*subscribers), "pushed-share")
			b.ReportMetric(float64(resyncs), "resyncs")
		})
		p.stop()
	}
}

type benchServer struct {
	cmd    *exec.Cmd
	ws     string
	http   string
	signer *auth.Signer
	conns  []func()
}

const benchAdmin = "bench-admin-token-0123456789"

func startBenchServer(b *testing.B, bin string) *benchServer {
	b.Helper()
	dir := b.TempDir()
	limits := filepath.Join(dir, "limits.json")
	if err := os.WriteFile(limits, []byte(`{"rules":{"user_group":{"limit":0},"user_all":{"limit":0},"pull":{"limit":0},"connect":{"limit":0}}}`), 0o600); err != nil {
		b.Fatal(err)
	}
	p := &benchServer{}
	p.cmd = exec.Command(bin, "-ws-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-data-dir", filepath.Join(dir, "data"),
		"-jwt-secret", testSecret, "-admin-token", benchAdmin, "-log-level", "warn", "-limits-file", limits,
		"-max-conns-per-ip", "0", "-group-rate", "-1", "-downlink-rate", "-1", "-hot-factor", "-1", "-demo", "off")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	wsRe := regexp.MustCompile(`WebSocket:\s+(ws://\S+)`)
	httpRe := regexp.MustCompile(`HTTP API:\s+(http://\S+)`)
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := wsRe.FindStringSubmatch(sc.Text()); m != nil {
				p.ws = strings.TrimSuffix(m[1], "/ws")
			}
			if m := httpRe.FindStringSubmatch(sc.Text()); m != nil {
				p.http = m[1]
				close(found)
			}
		}
	}()
	select {
	case <-found:
	case <-time.After(60 * time.Second):
		b.Fatal("fanfared did not print its addresses")
	}
	p.signer, err = auth.NewSigner(auth.SignerConfig{Secret: []byte(testSecret)})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func (p *benchServer) stop() {
	for _, c := range p.conns {
		c()
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (p *benchServer) post(b *testing.B, path, body string) {
	b.Helper()
	req, _ := http.NewRequest("POST", p.http+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+benchAdmin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b.Fatalf("POST %s: %d", path, resp.StatusCode)
	}
}

// group creates a group of sender and n subscribers, sub0..sub<n-1>.
func (p *benchServer) group(b *testing.B, n int) int64 {
	b.Helper()
	p.post(b, "/v1/groups", `{"gid":1,"name":"bench","owner":"sender"}`)
	uids := make([]string, n)
	for i := range uids {
		uids[i] = strconv.Quote("sub" + strconv.Itoa(i))
	}
	p.post(b, "/v1/groups/1/members", `{"uids":["sender",`+strings.Join(uids, ",")+`]}`)
	return 1
}

func (p *benchServer) send(b *testing.B, gid int64, i int) {
	p.post(b, fmt.Sprintf("/v1/groups/%d/messages?as=sender", gid), fmt.Sprintf(`{"id":"b%d","body":{"text":"a message of about a hundred bytes on the wire, %06d"}}`, i, i))
}

// benchSub is one subscriber's counters: msg frames read, resyncs read,
// and the highest seq either told it.
type benchSub struct {
	msgs, resyncs, last atomic.Int64
}

func (s *benchSub) frame(data []byte) {
	switch f, _ := wire.DecodeServer(data); f := f.(type) {
	case *wire.Msg:
		s.msgs.Add(1)
		if f.Seq > s.last.Load() {
			s.last.Store(f.Seq)
		}
	case *wire.Resync:
		s.resyncs.Add(1)
		if f.LastSeq > s.last.Load() {
			s.last.Store(f.LastSeq)
		}
	}
}

// subscribe connects n subscribers over tr.
func (p *benchServer) subscribe(b *testing.B, tr string, n int) []*benchSub {
	b.Helper()
	subs := make([]*benchSub, n)
	var ready sync.WaitGroup
	for i := range n {
		tok, err := p.signer.Sign("sub"+strconv.Itoa(i), 0, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		ready.Add(1)
		sub := &benchSub{}
		subs[i] = sub
		switch tr {
		case "websocket":
			d := ws.Dialer{Header: ws.HandshakeHeaderHTTP(http.Header{"Authorization": {"Bearer " + tok}})}
			c, br, _, err := d.Dial(context.Background(), p.ws+"/ws")
			if err != nil {
				b.Fatal(err)
			}
			p.conns = append(p.conns, func() { c.Close() })
			rd := bufio.NewReader(c)
			if br != nil {
				rd = br
			}
			go func() {
				first := true
				for {
					data, err := wsutil.ReadServerText(struct {
						*bufio.Reader
						*nopWriter
					}{rd, &nopWriter{}})
					if err != nil {
						return
					}
					if first {
						first = false
						ready.Done()
					}
					sub.frame(data)
				}
			}()
		case "sse":
			req, _ := http.NewRequest("GET", p.http+"/v1/events", nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := sseBenchClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			if resp.StatusCode != 200 {
				b.Fatalf("GET /v1/events: %d", resp.StatusCode)
			}
			p.conns = append(p.conns, func() { resp.Body.Close() })
			go func() {
				br := bufio.NewReader(resp.Body)
				first := true
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if !bytes.HasPrefix(line, []byte("data: ")) {
						continue
					}
					if first {
						first = false
						ready.Done()
					}
					sub.frame(bytes.TrimSuffix(line[len("data: "):], []byte("\n")))
				}
			}()
		}
	}
	ready.Wait() // every subscriber has its hello
	return subs
}

// sseBenchClient keeps one connection per stream.
var sseBenchClient = &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 2000}}

type nopWriter struct{}

func (*nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// rss returns the server's resident set size in bytes.
func (p *benchServer) rss(b *testing.B) int64 {
	b.Helper()
	runtimeSettle()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// cpu returns the server's user + system CPU time.
func (p *benchServer) cpu(b *testing.B) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) start at ") ".
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// runtimeSettle gives the server a moment to finish what the last step
// started (registrations, hellos) before its memory is read.
func runtimeSettle() { time.Sleep(time.Second) }
