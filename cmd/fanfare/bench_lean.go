package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"github.com/panjf2000/gnet/v2"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// Lean receivers (-receivers lean) measure the server's push path at a
// fraction of the SDK's cost per frame. Each connection is dialed and
// upgraded like the SDK does (its dialer, client.Dialer; same token, hello
// read with a deadline), then handed to a gnet client whose few event
// loops read every socket: one read(2) per readable socket, frames parsed
// in place from gnet's buffer by the wire package's scanner
// (wire.ScanPush), and of each push only type, gid, seq and the body's
// "t" are read. What they write (pongs, pings, the close) is framed by the
// SDK's client.AppendFrame. Nothing is allocated per frame.
//
// What they check is the SDK receivers' ledger minus the repair: every
// pushed (gid, seq) is marked in the receiver's bitmap, so duplicates,
// reordering and, at the end, acked seqs never delivered are counted the
// same way. They never pull: a push the server dropped (resync), the rest
// of an L2 summary window, or anything after a lost connection stays
// lost, and is reported as lost rather than repaired. A push frame's JSON
// syntax and UTF-8 are checked (wire.ScanPush), but of its fields only
// gid and seq; other frames are not read past their type.

// leanKind is the kind of a server frame as far as lean receivers care.
type leanKind uint8

const (
	leanOther    leanKind = iota // hello, ack, pong, error, unknown: ignored
	leanMsg                      // one message
	leanBatch                    // L1: a merge window's messages
	leanSummary                  // L2: the first message of a window
	leanResync                   // pushes were dropped
	leanDegraded                 // level change
)

// parseLeanFrame reads one server frame with wire.ScanPush, handing each
// message of a msg, batch or summary frame to sink in frame order. Other
// frames are skipped once their type is read. An error is ScanPush's.
func parseLeanFrame(p []byte, sink wire.MsgSink) (leanKind, error) {
	typ, err := wire.ScanPush(p, sink)
	kind := leanOther
	switch typ {
	case wire.TypeMsg:
		kind = leanMsg
	case wire.TypeBatch:
		kind = leanBatch
	case wire.TypeSummary:
		kind = leanSummary
	case wire.TypeResync:
		kind = leanResync
	case wire.TypeDegraded:
		kind = leanDegraded
	}
	return kind, err
}

// maxLeanFrame bounds a server frame a lean receiver accepts (the SDK's
// default MaxFrameBytes is the same order).
const maxLeanFrame = 16 << 20

// errLeanWS is a WebSocket framing violation by the server.
var errLeanWS = errors.New("bench: WebSocket protocol error from the server")

// parseWSHeader reads the header of a server frame at the start of b.
// complete is false while fewer than the header's bytes are there.
func parseWSHeader(b []byte) (hlen int, plen int, fin bool, op ws.OpCode, complete bool, err error) {
	if len(b) < 2 {
		return 0, 0, false, 0, false, nil
	}
	fin, op = b[0]&0x80 != 0, ws.OpCode(b[0]&0x0f)
	if b[0]&0x70 != 0 || b[1]&0x80 != 0 {
		return 0, 0, fin, op, false, errLeanWS // reserved bits, or masked by the server
	}
	hlen = 2
	var n uint64
	switch l := b[1] & 0x7f; l {
	case 126:
		if len(b) < 4 {
			return 0, 0, fin, op, false, nil
		}
		n, hlen = uint64(binary.BigEndian.Uint16(b[2:])), 4
	case 127:
		if len(b) < 10 {
			return 0, 0, fin, op, false, nil
		}
		n, hlen = binary.BigEndian.Uint64(b[2:]), 10
	default:
		n = uint64(l)
	}
	if op.IsControl() && (n > 125 || !fin) || op.IsReserved() || n > maxLeanFrame {
		return 0, 0, fin, op, false, errLeanWS
	}
	return hlen, int(n), fin, op, true, nil
}

// leanConn is one lean receiver's connection state; it is owned by the gnet
// loop that serves the socket (and, before Enroll, by the dialer).
type leanConn struct {
	r    *receiver
	w    *leanWorker
	now  int64  // Unix ns when the frames being parsed were read
	frag []byte // a fragmented data message being assembled (rare)
	gc   gnet.Conn
}

// PushedMsg records one message in the ledger and, when it was sent in
// the measured window (its body's "t", 0 when absent), its latency.
func (lc *leanConn) PushedMsg(gid, seq int64, body []byte) {
	w := lc.w
	if gid != w.gid {
		return
	}
	sent, _ := wire.BodyInt(body, "t")
	in := sent >= w.measureFrom.Load() && sent < w.measureTo.Load()
	if lc.r.mark(seq, in) && in {
		w.hist.record(lc.r.idx, (lc.now-sent)/1000)
	}
}

// frames handles the whole frames at the start of b and returns how many
// bytes they took; out is what to write back (pongs, a close echo), and
// closed says the connection is done.
func (lc *leanConn) frames(b []byte, out []byte) (used int, reply []byte, closed bool, err error) {
	reply = out
	for {
		hlen, plen, fin, op, complete, err := parseWSHeader(b[used:])
		if err != nil {
			return used, reply, true, err
		}
		if !complete || len(b)-used-hlen < plen {
			return used, reply, false, nil
		}
		p := b[used+hlen : used+hlen+plen]
		used += hlen + plen
		switch {
		case op == ws.OpPing:
			reply = client.AppendFrame(reply, ws.OpPong, p)
		case op == ws.OpClose:
			var body []byte // a close without a status code is echoed without one
			if len(p) >= 2 {
				code, _ := ws.ParseCloseFrameData(p)
				body = ws.NewCloseFrameBody(code, "")
			}
			return used, client.AppendFrame(reply, ws.OpClose, body), true, nil
		case op == ws.OpPong:
		case op == ws.OpContinuation:
			if lc.frag == nil {
				return used, reply, true, errLeanWS
			}
			lc.frag = append(lc.frag, p...)
			if len(lc.frag) > maxLeanFrame {
				return used, reply, true, errLeanWS
			}
			if fin {
				lc.data(lc.frag)
				lc.frag = nil
			}
		case lc.frag != nil:
			return used, reply, true, errLeanWS // a new message inside a fragmented one
		case !fin:
			lc.frag = append(make([]byte, 0, 2*len(p)), p...)
		default:
			lc.data(p)
		}
	}
}

// data handles one data message.
func (lc *leanConn) data(p []byte) {
	kind, err := parseLeanFrame(p, lc)
	w := lc.w
	switch {
	case err != nil:
		w.badFrames.Add(1)
	case kind == leanResync:
		w.resyncs.Add(1)
	case kind == leanDegraded:
		w.degraded.Add(1)
	case kind == leanSummary:
		w.summaries.Add(1)
	}
}

// leanWorker runs the lean receivers of one worker: a gnet client whose
// loops read every connection, and a heartbeat goroutine.
type leanWorker struct {
	gid         int64
	hist        *histShards
	measureFrom *atomic.Int64
	measureTo   *atomic.Int64
	cli         *gnet.Client
	logw        io.Writer

	resyncs, degraded, summaries, badFrames atomic.Int64
	// disconnects counts connections lost before the end (closing set).
	disconnects atomic.Int64
	closing     atomic.Bool
	open        sync.WaitGroup // one per enrolled connection until OnClose

	mu    sync.Mutex
	conns []*leanConn
	every time.Duration // heartbeat, from the first hello
	stop  chan struct{}
	done  chan struct{}
}

func newLeanWorker(w *worker, loops int, logw io.Writer) (*leanWorker, error) {
	lw := &leanWorker{gid: w.spec.GID, hist: w.hist, measureFrom: &w.measureFrom, measureTo: &w.measureTo, logw: logw,
		stop: make(chan struct{}), done: make(chan struct{})}
	cli, err := gnet.NewClient(leanHandler{lw},
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(loops),
		gnet.WithReadBufferCap(64<<10),
		gnet.WithLogger(leanGnetLogger{logw}))
	if err != nil {
		return nil, err
	}
	if err := cli.Start(); err != nil {
		return nil, err
	}
	lw.cli = cli
	go lw.heartbeat()
	return lw, nil
}

// leanHandler is the gnet event handler of lean receivers.
type leanHandler struct {
	lw *leanWorker
}

func (leanHandler) OnBoot(gnet.Engine) gnet.Action         { return gnet.None }
func (leanHandler) OnShutdown(gnet.Engine)                 {}
func (leanHandler) OnOpen(gnet.Conn) ([]byte, gnet.Action) { return nil, gnet.None }
func (leanHandler) OnTick() (time.Duration, gnet.Action)   { return time.Hour, gnet.None }
func (h leanHandler) OnClose(c gnet.Conn, _ error) gnet.Action {
	if !h.lw.closing.Load() {
		h.lw.disconnects.Add(1)
	}
	h.lw.open.Done()
	return gnet.None
}

func (h leanHandler) OnTraffic(c gnet.Conn) gnet.Action {
	lc, _ := c.Context().(*leanConn)
	b, _ := c.Peek(-1)
	lc.now = time.Now().UnixNano()
	used, reply, closed, err := lc.frames(b, nil)
	if used > 0 { // gnet's Discard(0) would drop the whole buffer: a frame's head
		_, _ = c.Discard(used)
	}
	if len(reply) > 0 {
		_, _ = c.Write(reply)
	}
	if err != nil {
		fmt.Fprintf(h.lw.logw, "bench: lean receiver %d: %v\n", lc.r.idx, err)
	}
	if closed {
		return gnet.Close
	}
	return gnet.None
}

// leanGnetLogger sends gnet's warnings and errors to the worker's log and
// keeps stdout, the worker's answer channel, clean.
type leanGnetLogger struct{ w io.Writer }

func (leanGnetLogger) Debugf(string, ...any) {}
func (leanGnetLogger) Infof(string, ...any)  {}
func (l leanGnetLogger) Warnf(f string, a ...any) {
	fmt.Fprintf(l.w, "bench: gnet: "+f+"\n", a...)
}
func (l leanGnetLogger) Errorf(f string, a ...any) {
	fmt.Fprintf(l.w, "bench: gnet: "+f+"\n", a...)
}
func (l leanGnetLogger) Fatalf(f string, a ...any) {
	fmt.Fprintf(l.w, "bench: gnet: "+f+"\n", a...)
}

// dial connects member idx: upgrade with its token, read the hello (and
// any frames that came with it) blocking, then hand the socket to gnet.
func (lw *leanWorker) dial(ctx context.Context, sp *workerSpec, signer *auth.Signer, r *receiver) error {
	tok, err := signer.Sign(sp.Prefix+strconv.Itoa(r.idx), 0, 24*time.Hour)
	if err != nil {
		return err
	}
	local := ""
	if len(sp.Addrs) > 0 {
		local = sp.Addrs[min(r.idx/sp.PerAddr, len(sp.Addrs)-1)]
	}
	nd := client.Dialer(10*time.Second, local)
	d := ws.Dialer{
		ReadBufferSize: sp.ReadBuf,
		Timeout:        20 * time.Second,
		NetDial:        nd.DialContext,
		Header:         ws.HandshakeHeaderHTTP(http.Header{"Authorization": []string{"Bearer " + tok}}),
	}
	nc, br, _, err := d.Dial(ctx, sp.WS)
	if err != nil {
		var se ws.StatusError
		if errors.As(err, &se) {
			return fmt.Errorf("bench: upgrade refused: HTTP %d", int(se))
		}
		return err
	}
	lc := &leanConn{r: r, w: lw}
	if err := lw.readHello(nc, br, lc); err != nil {
		nc.Close()
		return err
	}
	lw.open.Add(1)
	gc, err := lw.cli.EnrollContext(nc, lc) // closes nc, keeps a dup
	if err != nil {
		lw.open.Done()
		return err
	}
	lc.gc = gc
	lw.mu.Lock()
	lw.conns = append(lw.conns, lc)
	lw.mu.Unlock()
	return nil
}

// readHello reads the hello frame and whatever frames the upgrade's reader
// buffered after it, so that gnet starts at a frame boundary with nothing
// left in user space.
func (lw *leanWorker) readHello(nc net.Conn, br *bufio.Reader, lc *leanConn) error {
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	defer nc.SetReadDeadline(time.Time{})
	var src io.Reader = nc
	if br != nil {
		src = br
	}
	rd := wsutil.Reader{Source: src, State: ws.StateClientSide, MaxMessageSize: maxLeanFrame, CheckUTF8: true}
	hello := false
	for !hello || (br != nil && br.Buffered() > 0) {
		hdr, err := rd.NextFrame()
		if err != nil {
			return fmt.Errorf("bench: reading hello: %w", err)
		}
		p, err := io.ReadAll(&rd)
		if err != nil {
			return fmt.Errorf("bench: reading hello: %w", err)
		}
		switch hdr.OpCode {
		case ws.OpClose:
			return fmt.Errorf("bench: server closed the connection before hello")
		case ws.OpPing:
			if _, err := nc.Write(client.AppendFrame(nil, ws.OpPong, p)); err != nil {
				return err
			}
			continue
		case ws.OpPong:
			continue
		}
		if hello {
			lc.now = time.Now().UnixNano()
			lc.data(p)
			continue
		}
		f, err := wire.DecodeServer(p)
		if err != nil {
			return fmt.Errorf("bench: first frame: %w", err)
		}
		h, ok := f.(*wire.Hello)
		if !ok {
			return fmt.Errorf("bench: first frame is %q, want hello", f.FrameType())
		}
		hello = true
		lw.mu.Lock()
		if lw.every == 0 && h.HeartbeatS > 0 {
			lw.every = time.Duration(h.HeartbeatS) * time.Second
		}
		lw.mu.Unlock()
	}
	return nil
}

// leanPing is the ping frame every lean connection (and every kernel
// receiver of bench peer connected to fanfare) sends each heartbeat,
// the same bytes for all (AsyncWrite does not copy: it must not change),
// masked once.
var leanPing = client.AppendFrame(nil, ws.OpText, wire.AppendPing(nil, &wire.Ping{}))

// heartbeat pings every connection once per heartbeat interval, so that the
// server's idle timeout never closes a receiver that only listens.
func (lw *leanWorker) heartbeat() {
	defer close(lw.done)
	for {
		lw.mu.Lock()
		every := lw.every
		lw.mu.Unlock()
		if every <= 0 {
			every = 30 * time.Second
		}
		t := time.NewTimer(every)
		select {
		case <-lw.stop:
			t.Stop()
			return
		case <-t.C:
		}
		lw.mu.Lock()
		conns := lw.conns
		lw.mu.Unlock()
		for _, lc := range conns {
			_ = lc.gc.AsyncWrite(leanPing, nil)
		}
	}
}

// leanClose is the close frame (1000) lean connections end with.
var leanClose = client.AppendFrame(nil, ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))

// close sends every connection a close frame, closes it, waits (bounded)
// for gnet to report them closed, and stops the client.
func (lw *leanWorker) close() {
	lw.closing.Store(true)
	close(lw.stop)
	<-lw.done
	lw.mu.Lock()
	conns := lw.conns
	lw.mu.Unlock()
	for _, lc := range conns {
		_ = lc.gc.AsyncWrite(leanClose, func(c gnet.Conn, _ error) error { return c.Close() })
	}
	closed := make(chan struct{})
	go func() { lw.open.Wait(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
	}
	_ = lw.cli.Stop()
}
