package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// leanRecord is a wire.MsgSink that keeps what it is given: gid, seq and
// the body's "t", as a lean receiver reads them.
type leanRecord struct{ got [][3]int64 }

func (r *leanRecord) PushedMsg(gid, seq int64, body []byte) {
	sent, _ := wire.BodyInt(body, "t")
	r.got = append(r.got, [3]int64{gid, seq, sent})
}

// clientFrames reads the masked client frames in b (what a lean receiver
// writes back) as "op:payload" strings, so that they compare whatever
// masks they were written with.
func clientFrames(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	r := bytes.NewReader(b)
	for r.Len() > 0 {
		h, err := ws.ReadHeader(r)
		if err != nil {
			t.Fatalf("reading a client frame: %v", err)
		}
		if !h.Fin || !h.Masked {
			t.Fatalf("client frame %+v: want final and masked", h)
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatalf("reading a client frame: %v", err)
		}
		ws.Cipher(p, h.Mask, 0)
		out = append(out, fmt.Sprintf("%d:%q", h.OpCode, p))
	}
	return out
}

func wireMsg(gid, seq int64, body string) wire.Msg {
	return wire.Msg{GID: gid, Seq: seq, From: "s0", TS: 1700000000000, Kind: wire.KindText, Body: json.RawMessage(body)}
}

func TestParseLeanFrame(t *testing.T) {
	m1, m2 := wireMsg(7, 41, `{"t":1000,"p":"xx"}`), wireMsg(7, 42, `{"p":"\"t\":5","t":2000}`)
	tests := []struct {
		name    string
		frame   []byte
		kind    leanKind
		want    [][3]int64
		wantErr bool
	}{
		{"msg", wire.AppendMsg(nil, &m1), leanMsg, [][3]int64{{7, 41, 1000}}, false},
		{"msg, t after a string holding \"t\":", wire.AppendMsg(nil, &m2), leanMsg, [][3]int64{{7, 42, 2000}}, false},
		{"msg, re-encoded body", []byte(`{ "type" : "msg", "seq": 3, "gid": 9, "body": {"p": [1, {"t": 4}], "t": 12345}, "ts": 1 }`), leanMsg, [][3]int64{{9, 3, 12345}}, false},
		{"msg, body without t", wire.AppendMsg(nil, &wire.Msg{GID: 7, Seq: 5, Body: json.RawMessage(`"hi"`)}), leanMsg, [][3]int64{{7, 5, 0}}, false},
		{"msg, non-integer t", []byte(`{"type":"msg","gid":1,"seq":2,"body":{"t":1.5}}`), leanMsg, [][3]int64{{1, 2, 0}}, false},
		{"batch", wire.AppendBatch(nil, &wire.Batch{GID: 7, Messages: []wire.Msg{m1, m2}}), leanBatch, [][3]int64{{7, 41, 1000}, {7, 42, 2000}}, false},
		{"empty batch", wire.AppendBatch(nil, &wire.Batch{GID: 7}), leanBatch, nil, false},
		{"batch elements without gid", []byte(`{"type":"batch","gid":8,"messages":[{"seq":1,"body":{"t":3}} , {"seq":2,"body":{}}]}`), leanBatch, [][3]int64{{8, 1, 3}, {8, 2, 0}}, false},
		{"summary", wire.AppendSummary(nil, &wire.Summary{GID: 7, Count: 9, First: m1, LastSeq: 49}), leanSummary, [][3]int64{{7, 41, 1000}}, false},
		{"resync", wire.AppendResync(nil, &wire.Resync{GID: 7, LastSeq: 90}), leanResync, nil, false},
		{"degraded", wire.AppendDegraded(nil, &wire.Degraded{GID: 7, Level: 1}), leanDegraded, nil, false},
		{"pong", wire.AppendPong(nil, &wire.Pong{}), leanOther, nil, false},
		{"ack", wire.AppendAck(nil, &wire.Ack{ID: "a", GID: 7, Seq: 3, TS: 1}), leanOther, nil, false},
		{"unknown type", []byte(`{"type":"future","x":[}`), leanOther, nil, false},
		{"truncated msg", wire.AppendMsg(nil, &m1)[:40], leanMsg, nil, true},
		{"msg without seq", []byte(`{"type":"msg","gid":1,"body":{}}`), leanMsg, nil, true},
		{"msg with string seq", []byte(`{"type":"msg","gid":1,"seq":"2","body":{}}`), leanMsg, nil, true},
		{"type not first", []byte(`{"gid":1,"type":"msg","seq":2,"body":{}}`), leanMsg, [][3]int64{{1, 2, 0}}, false},
		{"invalid UTF-8", []byte("{\"type\":\"msg\",\"gid\":1,\"seq\":2,\"body\":\"\xff\"}"), leanMsg, nil, true},
		{"not an object", []byte(`["msg"]`), leanOther, nil, true},
		{"empty", nil, leanOther, nil, true},
		{"missing comma", []byte(`{"type":"msg" "gid":1,"seq":2}`), leanMsg, nil, true},
		{"unterminated body string", []byte(`{"type":"msg","gid":1,"seq":2,"body":{"p":"x}}`), leanMsg, nil, true},
		{"batch, messages not an array", []byte(`{"type":"batch","gid":1,"messages":{}}`), leanBatch, nil, true},
		{"batch, missing comma between messages", []byte(`{"type":"batch","gid":1,"messages":[{"seq":1}{"seq":2}]}`), leanBatch, [][3]int64{{1, 1, 0}}, true},
		{"seq overflow", []byte(`{"type":"msg","gid":1,"seq":99999999999999999999,"body":{}}`), leanMsg, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec leanRecord
			kind, err := parseLeanFrame(tt.frame, &rec)
			if (err != nil) != tt.wantErr || kind != tt.kind {
				t.Fatalf("got kind %d, err %v; want kind %d, error %v", kind, err, tt.kind, tt.wantErr)
			}
			if !slices.Equal(rec.got, tt.want) {
				t.Fatalf("got messages %v, want %v", rec.got, tt.want)
			}
		})
	}
}

// serverFrame appends an unmasked server frame.
func serverFrame(dst []byte, fin bool, op ws.OpCode, p []byte) []byte {
	b0 := byte(op)
	if fin {
		b0 |= 0x80
	}
	switch n := len(p); {
	case n < 126:
		dst = append(dst, b0, byte(n))
	case n <= 0xffff:
		dst = append(dst, b0, 126, byte(n>>8), byte(n))
	default:
		dst = append(dst, b0, 127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	return append(dst, p...)
}

func TestParseWSHeader(t *testing.T) {
	long := make([]byte, 300)
	huge := []byte{0x81, 127, 0, 0, 0, 0, 2, 0, 0, 0}
	tests := []struct {
		name           string
		b              []byte
		hlen, plen     int
		complete, fail bool
	}{
		{"empty", nil, 0, 0, false, false},
		{"one byte", []byte{0x81}, 0, 0, false, false},
		{"125", serverFrame(nil, true, ws.OpText, make([]byte, 125)), 2, 125, true, false},
		{"126 form", serverFrame(nil, true, ws.OpText, long), 4, 300, true, false},
		{"126 form, short", serverFrame(nil, true, ws.OpText, long)[:3], 0, 0, false, false},
		{"127 form", serverFrame(nil, true, ws.OpBinary, make([]byte, 70000)), 10, 70000, true, false},
		{"127 form, short", serverFrame(nil, true, ws.OpBinary, make([]byte, 70000))[:9], 0, 0, false, false},
		{"above the bound", huge, 0, 0, false, true},
		{"masked", []byte{0x81, 0x85, 1, 2, 3, 4}, 0, 0, false, true},
		{"reserved bit", []byte{0xc1, 0}, 0, 0, false, true},
		{"reserved opcode", []byte{0x83, 0}, 0, 0, false, true},
		{"control above 125", serverFrame(nil, true, ws.OpPing, long), 0, 0, false, true},
		{"fragmented control", serverFrame(nil, false, ws.OpPing, nil), 0, 0, false, true},
	}
	for _, tt := range tests {
		hlen, plen, _, _, complete, err := parseWSHeader(tt.b)
		if (err != nil) != tt.fail || complete != tt.complete || (complete && (hlen != tt.hlen || plen != tt.plen)) {
			t.Errorf("%s: got hlen %d plen %d complete %v err %v; want %d %d %v fail %v", tt.name, hlen, plen, complete, err, tt.hlen, tt.plen, tt.complete, tt.fail)
		}
	}
}

// newTestLean returns a lean connection with its own worker state; every
// message sent at or after from is measured.
func newTestLean(gid, seq0, from int64) *leanConn {
	lw := &leanWorker{gid: gid, hist: newHistShards(1), measureFrom: new(atomic.Int64), measureTo: new(atomic.Int64)}
	lw.measureFrom.Store(from)
	lw.measureTo.Store(1<<63 - 1)
	return &leanConn{r: &receiver{seq0: seq0, last: seq0}, w: lw}
}

// leanStream is a server's byte stream to one receiver: hello-less push
// frames of gid 5, a batch, other frames, a ping and a fragmented msg.
func leanStream(t *testing.T) []byte {
	t.Helper()
	var s []byte
	msg := func(seq int64) []byte {
		m := wireMsg(5, seq, `{"t":`+strconv.FormatInt(1000+seq, 10)+`,"p":"xxxx"}`)
		return wire.AppendMsg(nil, &m)
	}
	s = serverFrame(s, true, ws.OpText, wire.AppendDegraded(nil, &wire.Degraded{Level: 1}))
	s = serverFrame(s, true, ws.OpText, msg(11))
	s = serverFrame(s, true, ws.OpText, msg(12))
	s = serverFrame(s, true, ws.OpPing, []byte("hb"))
	s = serverFrame(s, true, ws.OpText, msg(12)) // duplicate
	other := wireMsg(6, 13, `{"t":1}`)
	s = serverFrame(s, true, ws.OpText, wire.AppendMsg(nil, &other)) // another group
	b := wire.Batch{GID: 5, Messages: []wire.Msg{wireMsg(5, 14, `{"t":1014}`), wireMsg(5, 15, `{"t":1015}`)}}
	s = serverFrame(s, true, ws.OpText, wire.AppendBatch(nil, &b))
	s = serverFrame(s, true, ws.OpText, msg(13)) // late: out of order
	s = serverFrame(s, true, ws.OpText, []byte(`{"type":"msg","gid":5}`))
	f := msg(16)
	s = serverFrame(s, false, ws.OpText, f[:10])
	s = serverFrame(s, true, ws.OpPong, nil) // control inside a fragmented message
	s = serverFrame(s, false, ws.OpContinuation, f[10:20])
	s = serverFrame(s, true, ws.OpContinuation, f[20:])
	s = serverFrame(s, true, ws.OpText, wire.AppendResync(nil, &wire.Resync{GID: 5, LastSeq: 20}))
	s = serverFrame(s, true, ws.OpText, msg(18))
	return s
}

// TestLeanConnFrames feeds the stream cut at every point into two pieces
// and at every byte: the ledger must come out the same.
func TestLeanConnFrames(t *testing.T) {
	stream := leanStream(t)
	type outcome struct {
		delivered, measured, dups, ooo, missing int64
		resyncs, degraded, bad                  int64
		reply                                   string
		hist                                    int64
	}
	run := func(chunks [][]byte) outcome {
		lc := newTestLean(5, 10, 1013)
		var buf, reply []byte
		for _, c := range chunks {
			buf = append(buf, c...)
			used, r, closed, err := lc.frames(buf, reply)
			if err != nil || closed {
				t.Fatalf("got closed %v, err %v", closed, err)
			}
			reply = r
			buf = append(buf[:0], buf[used:]...)
		}
		if len(buf) != 0 {
			t.Fatalf("%d bytes left over", len(buf))
		}
		r := lc.r
		return outcome{r.delivered, r.measured, r.dups, r.ooo, r.missing([][2]int64{{11, 18}}),
			lc.w.resyncs.Load(), lc.w.degraded.Load(), lc.w.badFrames.Load(), strings.Join(clientFrames(t, reply), " "), lc.w.hist.merged().TotalCount()}
	}
	want := run([][]byte{stream})
	wantReply := fmt.Sprintf("%d:%q", ws.OpPong, "hb")
	// 11..16 and 18 delivered (7), 17 missing; measured: t >= 1013 (13..16, 18).
	if w := (outcome{7, 5, 1, 1, 1, 1, 1, 1, wantReply, 5}); want != w {
		t.Fatalf("got %+v,\nwant %+v", want, w)
	}
	for cut := range len(stream) + 1 {
		if got := run([][]byte{stream[:cut], stream[cut:]}); got != want {
			t.Fatalf("cut at %d: got %+v, want %+v", cut, got, want)
		}
	}
	var bytewise [][]byte
	for i := range stream {
		bytewise = append(bytewise, stream[i:i+1])
	}
	if got := run(bytewise); got != want {
		t.Fatalf("byte by byte: got %+v, want %+v", got, want)
	}
}

func TestLeanConnFramesClose(t *testing.T) {
	m := wireMsg(5, 1, `{"t":1}`)
	tests := []struct {
		name      string
		stream    []byte
		wantReply []string
		wantErr   bool
		wantUsed  int
	}{
		{"close echoed", serverFrame(serverFrame(nil, true, ws.OpText, wire.AppendMsg(nil, &m)), true, ws.OpClose, ws.NewCloseFrameBody(ws.StatusGoingAway, "idle")),
			[]string{fmt.Sprintf("%d:%q", ws.OpClose, ws.NewCloseFrameBody(ws.StatusGoingAway, ""))}, false, -1},
		{"masked frame", []byte{0x81, 0x81, 1, 2, 3, 4, 5}, nil, true, 0},
		{"continuation without start", serverFrame(nil, true, ws.OpContinuation, []byte("x")), nil, true, -1},
		{"new message inside a fragmented one", serverFrame(serverFrame(nil, false, ws.OpText, []byte("{")), true, ws.OpText, []byte("{}")), nil, true, -1},
	}
	for _, tt := range tests {
		lc := newTestLean(5, 0, 0)
		used, reply, closed, err := lc.frames(tt.stream, nil)
		if got := clientFrames(t, reply); !closed || (err != nil) != tt.wantErr || !slices.Equal(got, tt.wantReply) {
			t.Errorf("%s: got closed %v, err %v, reply %q; want closed, error %v, reply %q", tt.name, closed, err, got, tt.wantErr, tt.wantReply)
		}
		if want := tt.wantUsed; want < 0 && used != len(tt.stream) || want >= 0 && used != want {
			t.Errorf("%s: used %d of %d bytes", tt.name, used, len(tt.stream))
		}
	}
}

// TestLeanNoAllocs: parsing frames, marking the ledger and recording the
// latency allocate nothing per frame.
func TestLeanNoAllocs(t *testing.T) {
	const runs, perRun = 101, 66 // AllocsPerRun runs once more than asked
	lc := newTestLean(5, 0, 0)
	lc.r.seen = make([]uint64, runs*perRun/64+1) // the bitmap grows by doubling: not per frame
	streams := make([][]byte, runs)
	seq := int64(0)
	for i := range streams {
		for range perRun - 2 {
			seq++
			m := wireMsg(5, seq, string(benchBody(nil, time.Now().UnixNano(), 100)))
			streams[i] = serverFrame(streams[i], true, ws.OpText, wire.AppendMsg(nil, &m))
		}
		b := wire.Batch{GID: 5, Messages: []wire.Msg{wireMsg(5, seq+1, `{"t":1}`), wireMsg(5, seq+2, `{"t":2}`)}}
		seq += 2
		streams[i] = serverFrame(streams[i], true, ws.OpText, wire.AppendBatch(nil, &b))
	}
	run := 0
	allocs := testing.AllocsPerRun(runs-1, func() {
		lc.now = time.Now().UnixNano()
		stream := streams[run]
		run++
		used, reply, closed, err := lc.frames(stream, nil)
		if used != len(stream) || reply != nil || closed || err != nil {
			t.Fatalf("got used %d reply %x closed %v err %v", used, reply, closed, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("got %.1f allocations per run of %d frames, want 0", allocs, perRun-1)
	}
	if lc.r.delivered != runs*perRun || lc.r.dups != 0 || lc.w.badFrames.Load() != 0 {
		t.Fatalf("got %d delivered, %d duplicates, %d bad frames; want %d, 0, 0", lc.r.delivered, lc.r.dups, lc.w.badFrames.Load(), runs*perRun)
	}
}

// fakePushServer accepts WebSocket connections, says hello, answers pulls
// (nothing stored: last_seq 0) and pings, and pushes what the test writes.
type fakePushServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []*fakePushConn
	wg    sync.WaitGroup
}

type fakePushConn struct {
	nc  net.Conn
	wmu sync.Mutex
}

func (c *fakePushConn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(b)
	return err
}

func startFakePushServer(tb testing.TB) *fakePushServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &fakePushServer{ln: ln}
	s.wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() { s.serve(nc) })
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *fakePushServer) serve(nc net.Conn) {
	if _, err := ws.Upgrade(nc); err != nil {
		nc.Close()
		return
	}
	c := &fakePushConn{nc: nc}
	if c.write(serverFrame(nil, true, ws.OpText, wire.AppendHello(nil, &wire.Hello{UID: "u", Node: "fake", HeartbeatS: 30, MaxMessageBytes: 4096}))) != nil {
		return
	}
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	for {
		hdr, err := ws.ReadHeader(nc)
		if err != nil {
			return
		}
		p := make([]byte, hdr.Length)
		if _, err := io.ReadFull(nc, p); err != nil {
			return
		}
		if hdr.Masked {
			ws.Cipher(p, hdr.Mask, 0)
		}
		if hdr.OpCode == ws.OpClose {
			_ = c.write(serverFrame(nil, true, ws.OpClose, p))
			return
		}
		f, err := wire.DecodeClient(p)
		if err != nil {
			continue
		}
		switch f.Type {
		case wire.TypePull:
			_ = c.write(serverFrame(nil, true, ws.OpText, wire.AppendMessages(nil, &wire.Messages{ID: f.ID, GID: f.GID, LastSeq: 0})))
		case wire.TypePing:
			_ = c.write(serverFrame(nil, true, ws.OpText, wire.AppendPong(nil, &wire.Pong{ID: f.ID})))
		}
	}
}

func (s *fakePushServer) connected() []*fakePushConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.conns)
}

// fakeWorker connects n receivers of kind to a fake push server.
func fakeWorker(tb testing.TB, srv *fakePushServer, receivers string, n int) *worker {
	tb.Helper()
	w := &worker{hist: newHistShards(64), spec: workerSpec{WS: "ws://" + srv.ln.Addr().String() + "/ws", GID: 5, Prefix: "m", Lo: 0, Hi: n,
		Secret: "0123456789abcdef0123456789abcdef", Dials: 16, ReadBuf: 1024, Deadline: time.Minute, Receivers: receivers, Loops: 1}}
	w.measureTo.Store(1<<63 - 1)
	ready, err := w.connect(context.Background(), io.Discard)
	if err != nil || ready.Ready != n {
		tb.Fatalf("got %+v, %v; want %d ready", ready, err, n)
	}
	tb.Cleanup(w.closeAll)
	for deadline := time.Now().Add(10 * time.Second); len(srv.connected()) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("server sees %d connections, want %d", len(srv.connected()), n)
		}
	}
	return w
}

// pushAll writes msgs messages of gid 5 (seqs from 1) to every connection,
// perWrite frames per write(2), and waits until every receiver has them.
func pushAll(tb testing.TB, w *worker, conns []*fakePushConn, msgs, perWrite int) {
	var body, frame, batch []byte
	seq := int64(0)
	for seq < int64(msgs) {
		batch = batch[:0]
		for k := 0; k < perWrite && seq < int64(msgs); k++ {
			seq++
			m := wire.Msg{GID: 5, Seq: seq, From: "s0", TS: 1, Kind: wire.KindText, Body: benchBody(body, time.Now().UnixNano(), 100)}
			body = m.Body
			frame = wire.AppendMsg(frame[:0], &m)
			batch = serverFrame(batch, true, ws.OpText, frame)
		}
		for _, c := range conns {
			if err := c.write(batch); err != nil {
				tb.Fatal(err)
			}
		}
	}
	for _, r := range w.recv {
		for {
			r.mu.Lock()
			d := r.delivered
			r.mu.Unlock()
			if d == int64(msgs) {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// TestLeanAgainstSDK: both receiver kinds see the same pushes the same way.
func TestLeanAgainstSDK(t *testing.T) {
	for _, kind := range []string{receiversSDK, receiversLean} {
		t.Run(kind, func(t *testing.T) {
			srv := startFakePushServer(t)
			w := fakeWorker(t, srv, kind, 20)
			w.measureFrom.Store(0)
			pushAll(t, w, srv.connected(), 300, 7)
			res := w.finish(context.Background(), [][2]int64{{1, 300}})
			if res.Conns != 20 || res.Deliveries != 6000 || res.Measured != 6000 || res.Lost != 0 || res.Duplicates != 0 || res.OutOfOrder != 0 || res.BadFrames != 0 {
				t.Fatalf("got %+v", res)
			}
			if res.Latency == nil || res.Latency.Counts == nil {
				t.Fatalf("no latency histogram")
			}
		})
	}
}

// TestLeanSplitFrames: frames that arrive across reads (a TCP split, a
// frame larger than one read) are reassembled through gnet, not dropped.
func TestLeanSplitFrames(t *testing.T) {
	srv := startFakePushServer(t)
	w := fakeWorker(t, srv, receiversLean, 2)
	w.measureFrom.Store(0)
	var body, frame, all []byte
	const msgs = 20
	for seq := int64(1); seq <= msgs; seq++ {
		m := wire.Msg{GID: 5, Seq: seq, From: "s0", TS: 1, Kind: wire.KindText, Body: benchBody(body, time.Now().UnixNano(), 100)}
		body = m.Body
		frame = wire.AppendMsg(frame[:0], &m)
		all = serverFrame(all, true, ws.OpText, frame)
	}
	for _, c := range srv.connected() {
		// Cut every few bytes, each piece its own write, a pause between:
		// every frame head and body spans reads.
		for i := 0; i < len(all); i += 7 {
			if err := c.write(all[i:min(i+7, len(all))]); err != nil {
				t.Fatal(err)
			}
			if i%70 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		done := true
		for _, r := range w.recv {
			r.mu.Lock()
			done = done && r.delivered == msgs
			r.mu.Unlock()
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("split frames not all delivered (disconnects %d)", w.lean.disconnects.Load())
		}
	}
	res := w.finish(context.Background(), [][2]int64{{1, msgs}})
	if res.Deliveries != 2*msgs || res.Lost != 0 || res.Duplicates != 0 || res.OutOfOrder != 0 || res.BadFrames != 0 {
		t.Fatalf("got %+v", res)
	}
}

// TestLeanDisconnectCounted: a connection the server closes is counted,
// and its messages stay lost.
func TestLeanDisconnectCounted(t *testing.T) {
	srv := startFakePushServer(t)
	w := fakeWorker(t, srv, receiversLean, 3)
	conns := srv.connected()
	conns[0].nc.Close()
	for deadline := time.Now().Add(5 * time.Second); w.lean.disconnects.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("disconnect not counted")
		}
	}
	for _, c := range conns[1:] {
		m := wireMsg(5, 1, `{"t":1}`)
		if err := c.write(serverFrame(nil, true, ws.OpText, wire.AppendMsg(nil, &m))); err != nil {
			t.Fatal(err)
		}
	}
	w.spec.Drain = 300 * time.Millisecond
	res := w.finish(context.Background(), [][2]int64{{1, 1}})
	if res.Disconnects != 1 || res.Lost != 1 || res.Deliveries != 2 {
		t.Fatalf("got disconnects %d, lost %d, deliveries %d; want 1, 1, 2", res.Disconnects, res.Lost, res.Deliveries)
	}
}

// BenchmarkReceive compares the receivers' cost per received frame over
// loopback: 100 connections, each frame written to each of them, 1 or 8
// frames per write(2) (the server coalesces when it falls behind). One op
// is one received frame (b.N rounded down to a multiple of 100);
// cpu-ns/frame is the process's CPU per frame, the fake server's writes
// included (the same for both).
func BenchmarkReceive(b *testing.B) {
	for _, perWrite := range []int{1, 8} {
		for _, kind := range []string{receiversSDK, receiversLean} {
			b.Run(fmt.Sprintf("frames-per-write=%d/receivers=%s", perWrite, kind), func(b *testing.B) {
				const conns = 100
				srv := startFakePushServer(b)
				w := fakeWorker(b, srv, kind, conns)
				msgs := max(b.N/conns, 1)
				for _, r := range w.recv {
					r.seen = make([]uint64, msgs/64+1)
				}
				cpu0 := processCPU(b)
				b.ReportAllocs()
				b.ResetTimer()
				pushAll(b, w, srv.connected(), msgs, perWrite)
				b.StopTimer()
				frames := float64(msgs * conns)
				b.ReportMetric(float64(processCPU(b)-cpu0)/frames, "cpu-ns/frame")
			})
		}
	}
}

func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
