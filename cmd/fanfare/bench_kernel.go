package main

import (
	"bufio"
	"bytes"
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
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/sys/unix"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// Kernel receivers (-receivers kernel, used by bench peer) are the lean
// receivers' ledger on a receive loop of their own that can talk to other
// servers than fanfared and reads the receive time from the kernel. Each
// socket is dialed and upgraded with the SDK's dialer, its protocol's
// handshake is done blocking (fanfare and the raw floor, which speaks
// fanfare's push frames: the hello; Centrifugo: connect with a JWT, then
// subscribe), and then the socket is handed to a few epoll loops
// (golang.org/x/sys/unix; gnet, which the lean receivers use, reads with
// read(2) and so cannot return control messages). Each readable socket gets one recvmsg(2) whose SCM_TIMESTAMPNS
// control message is the time the kernel queued the data (SO_TIMESTAMPNS):
// latency is taken from that, not from when the loop got to run, so the
// receivers' own scheduling delay on a loaded machine is left out. For TCP
// the kernel reports the time of the last segment the read consumed, so a
// read that gathers several frames gives all of them that later time (the
// error is on the side of more latency).
//
// Every message is identified by the publisher's own counter, the body's
// "n" (1, 2, ...), the same for every server; its send time is the body's
// "t". Fanfare's frames are read with wire.ScanPush; Centrifugo's JSON
// protocol frames hold one or more newline-separated replies, each
// scanned for the publication's "n" and "t". Nothing is allocated per
// frame.

// Server protocols of kernel receivers (workerSpec.Peer).
const (
	peerFanfare    = "fanfare"
	peerCentrifugo = "centrifugo"
)

// receiversKernel is the -receivers value of kernel receivers.
const receiversKernel = "kernel"

// kernelConn is one kernel receiver's socket and its parse state, owned by
// its loop.
type kernelConn struct {
	r       *receiver
	fd      int
	pending []byte // an incomplete frame carried to the next read
	frag    []byte // a fragmented data message being assembled (rare)
	closed  bool
	// pullTo is the end of the range being repaired by pull (0 = none in
	// flight); with the server's seqs only (workerSpec.Seqs).
	pullTo int64
}

// kernelWorker runs the kernel receivers of one worker.
type kernelWorker struct {
	peer        string
	gid         int64
	seqs        bool // the ledger counts the server's seqs and repairs gaps by pull (workerSpec.Seqs)
	hist        *histShards
	measureFrom *atomic.Int64
	measureTo   *atomic.Int64
	logw        io.Writer
	loops       []*kernelLoop
	next        atomic.Int64 // round-robin over loops

	badFrames, disconnects atomic.Int64
	// With seqs: gaps seen in the pushed seqs, resync and summary frames,
	// pull requests sent, messages first received by a pull, and error
	// answers to pulls.
	gaps, resyncs, summaries, pulls, pulled, pullErrors atomic.Int64
	closing                                             atomic.Bool

	mu    sync.Mutex
	conns []*kernelConn
	every time.Duration // fanfare's heartbeat, from the first hello
	// firstClose is the code and reason of the first close frame a
	// server sent before the end.
	firstClose string
	stop       chan struct{}
	wg         sync.WaitGroup
}

// kernelLoop is one epoll set and the goroutine that waits on it.
type kernelLoop struct {
	w     *kernelWorker
	epfd  int
	mu    sync.Mutex
	conns map[int32]*kernelConn // by fd
	buf   []byte
	oob   []byte
	reply []byte
}

func newKernelWorker(w *worker, loops int, logw io.Writer) (*kernelWorker, error) {
	kw := &kernelWorker{peer: w.spec.Peer, gid: w.spec.GID, seqs: w.spec.Seqs && w.spec.Peer == peerFanfare, hist: w.hist, measureFrom: &w.measureFrom, measureTo: &w.measureTo, logw: logw,
		stop: make(chan struct{})}
	for range loops {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			kw.close()
			return nil, fmt.Errorf("bench: epoll: %w", err)
		}
		l := &kernelLoop{w: kw, epfd: epfd, conns: map[int32]*kernelConn{}, buf: make([]byte, 64<<10), oob: make([]byte, 256)}
		kw.loops = append(kw.loops, l)
		kw.wg.Go(l.run)
	}
	kw.wg.Go(kw.heartbeat)
	return kw, nil
}

// dial connects receiver r, does its protocol's handshake and hands the
// socket to a loop.
func (kw *kernelWorker) dial(ctx context.Context, sp *workerSpec, signer *auth.Signer, r *receiver) error {
	uid := sp.Prefix + strconv.Itoa(r.idx)
	hdr := http.Header{}
	var tok string
	var err error
	switch sp.Peer {
	case peerFanfare:
		if tok, err = signer.Sign(uid, 0, 24*time.Hour); err != nil {
			return err
		}
		hdr.Set("Authorization", "Bearer "+tok)
	case peerCentrifugo:
		if tok, err = centrifugoToken(sp.Secret, uid); err != nil {
			return err
		}
	}
	local := ""
	if len(sp.Addrs) > 0 {
		local = sp.Addrs[min(r.idx/sp.PerAddr, len(sp.Addrs)-1)]
	}
	d := ws.Dialer{
		ReadBufferSize: sp.ReadBuf,
		Timeout:        20 * time.Second,
		NetDial:        client.Dialer(10*time.Second, local).DialContext,
		Header:         ws.HandshakeHeaderHTTP(hdr),
	}
	nc, br, _, err := d.Dial(ctx, sp.WS)
	if err != nil {
		var se ws.StatusError
		if errors.As(err, &se) {
			return fmt.Errorf("bench: upgrade refused: HTTP %d", int(se))
		}
		return err
	}
	defer nc.Close() // the loop keeps a duplicate of the descriptor
	if err := kw.handshake(nc, br, sp, tok); err != nil {
		return err
	}
	var early []byte // whole frames the upgrade's reader buffered after the handshake
	if br != nil && br.Buffered() > 0 {
		early, _ = br.Peek(br.Buffered())
	}
	return kw.enroll(nc, r, early)
}

// centrifugoToken is a Centrifugo connection JWT (HS256, sub = uid).
func centrifugoToken(secret, uid string) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": uid, "exp": time.Now().Add(24 * time.Hour).Unix(),
	}).SignedString([]byte(secret))
}

// handshake does the protocol's blocking part on nc: read fanfare's hello,
// or connect and subscribe to Centrifugo.
func (kw *kernelWorker) handshake(nc net.Conn, br *bufio.Reader, sp *workerSpec, tok string) error {
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	defer nc.SetDeadline(time.Time{})
	var src io.Reader = nc
	if br != nil {
		src = br
	}
	read := func() ([]byte, error) {
		for {
			p, op, err := wsutil.ReadServerData(&readerConn{Reader: src, Conn: nc})
			if err != nil {
				return nil, err
			}
			if op == ws.OpText || op == ws.OpBinary {
				return p, nil
			}
		}
	}
	switch sp.Peer {
	case peerFanfare:
		p, err := read()
		if err != nil {
			return fmt.Errorf("bench: reading hello: %w", err)
		}
		f, err := wire.DecodeServer(p)
		if err != nil {
			return fmt.Errorf("bench: first frame: %w", err)
		}
		h, ok := f.(*wire.Hello)
		if !ok {
			return fmt.Errorf("bench: first frame is %q, want hello", f.FrameType())
		}
		kw.mu.Lock()
		if kw.every == 0 && h.HeartbeatS > 0 {
			kw.every = time.Duration(h.HeartbeatS) * time.Second
		}
		kw.mu.Unlock()
	case peerCentrifugo:
		cmds := `{"id":1,"connect":{"token":"` + tok + `"}}` + "\n" + `{"id":2,"subscribe":{"channel":"` + sp.Channel + `"}}`
		if _, err := nc.Write(client.AppendFrame(nil, ws.OpText, []byte(cmds))); err != nil {
			return err
		}
		for subscribed := false; !subscribed; {
			p, err := read()
			if err != nil {
				return fmt.Errorf("bench: centrifugo handshake: %w", err)
			}
			for line := range bytes.SplitSeq(p, []byte("\n")) {
				if bytes.Contains(line, []byte(`"error"`)) {
					return fmt.Errorf("bench: centrifugo refused: %s", line)
				}
				if bytes.HasPrefix(line, []byte(`{"id":2`)) {
					subscribed = true
				}
			}
		}
	}
	return nil
}

// readerConn reads from a buffered reader and writes to the connection
// (wsutil answers control frames with writes).
type readerConn struct {
	io.Reader
	net.Conn
}

func (rc *readerConn) Read(p []byte) (int, error) { return rc.Reader.Read(p) }

// enroll duplicates nc's descriptor, turns on kernel receive timestamps and
// adds it to a loop.
func (kw *kernelWorker) enroll(nc net.Conn, r *receiver, early []byte) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return errors.New("bench: not a TCP connection")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.Dup(int(s)) }); err != nil {
		return err
	}
	if derr != nil {
		return derr
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bench: SO_TIMESTAMPNS: %w", err)
	}
	kc := &kernelConn{r: r, fd: fd, pending: append([]byte(nil), early...)}
	l := kw.loops[int(kw.next.Add(1))%len(kw.loops)]
	l.mu.Lock()
	l.conns[int32(fd)] = kc
	l.mu.Unlock()
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)}); err != nil {
		l.mu.Lock()
		delete(l.conns, int32(fd))
		l.mu.Unlock()
		unix.Close(fd)
		return err
	}
	kw.mu.Lock()
	kw.conns = append(kw.conns, kc)
	kw.mu.Unlock()
	return nil
}

func (l *kernelLoop) run() {
	events := make([]unix.EpollEvent, 256)
	for {
		n, err := unix.EpollWait(l.epfd, events, 200)
		if l.w.closing.Load() {
			return
		}
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			fmt.Fprintf(l.w.logw, "bench: epoll_wait: %v\n", err)
			return
		}
		for _, ev := range events[:n] {
			l.mu.Lock()
			kc := l.conns[ev.Fd]
			l.mu.Unlock()
			if kc != nil && !kc.closed {
				l.readable(kc)
			}
		}
	}
}

// readable does one recvmsg on kc and handles the whole frames read.
func (l *kernelLoop) readable(kc *kernelConn) {
	n, oobn, _, _, err := unix.Recvmsg(kc.fd, l.buf, l.oob, 0)
	if err == unix.EAGAIN || err == unix.EINTR {
		return
	}
	if err != nil || n == 0 {
		l.drop(kc)
		return
	}
	now := kernelStamp(l.oob[:oobn])
	if now == 0 {
		now = time.Now().UnixNano()
	}
	b := l.buf[:n]
	if len(kc.pending) > 0 {
		kc.pending = append(kc.pending, b...)
		b = kc.pending
	}
	used, closed := l.frames(kc, b, now)
	if used < len(b) {
		rest := b[used:]
		if len(kc.pending) > 0 {
			kc.pending = kc.pending[:copy(kc.pending, rest)]
		} else {
			kc.pending = append(kc.pending[:0], rest...)
		}
	} else {
		kc.pending = kc.pending[:0]
	}
	if len(l.reply) > 0 {
		_, _ = unix.Write(kc.fd, l.reply)
		l.reply = l.reply[:0]
	}
	if closed {
		l.drop(kc)
	}
}

// closedBy keeps the first close frame's code and reason the server sent
// (what ended a receiver before the end of the run).
func (kw *kernelWorker) closedBy(p []byte) {
	if kw.closing.Load() {
		return
	}
	code, reason := ws.ParseCloseFrameData(p)
	kw.mu.Lock()
	if kw.firstClose == "" {
		kw.firstClose = strconv.Itoa(int(code)) + " " + reason
	}
	kw.mu.Unlock()
}

// drop forgets a connection that ended.
func (l *kernelLoop) drop(kc *kernelConn) {
	if kc.closed {
		return
	}
	kc.closed = true
	if !l.w.closing.Load() {
		l.w.disconnects.Add(1)
	}
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, kc.fd, nil)
}

// kernelStamp returns the SCM_TIMESTAMPNS time (Unix ns) in the control
// messages oob, 0 when there is none. It reads the cmsghdr by hand:
// unix.ParseSocketControlMessage allocates.
func kernelStamp(oob []byte) int64 {
	const hdr = unix.SizeofCmsghdr
	for len(oob) >= hdr {
		clen := int(binary.NativeEndian.Uint64(oob[0:8]))
		level := int32(binary.NativeEndian.Uint32(oob[8:12]))
		typ := int32(binary.NativeEndian.Uint32(oob[12:16]))
		if clen < hdr || clen > len(oob) {
			return 0
		}
		if level == unix.SOL_SOCKET && typ == unix.SCM_TIMESTAMPNS && clen >= hdr+16 {
			sec := int64(binary.NativeEndian.Uint64(oob[hdr : hdr+8]))
			nsec := int64(binary.NativeEndian.Uint64(oob[hdr+8 : hdr+16]))
			return sec*1e9 + nsec
		}
		adv := (clen + 7) &^ 7
		if adv > len(oob) {
			return 0
		}
		oob = oob[adv:]
	}
	return 0
}

// frames handles the whole WebSocket frames at the start of b, read at
// now (Unix ns), and returns the bytes they took and whether the
// connection is done. Replies (pongs, the close echo, Centrifugo's pong)
// are appended to l.reply.
func (l *kernelLoop) frames(kc *kernelConn, b []byte, now int64) (used int, closed bool) {
	for {
		hlen, plen, fin, op, complete, err := parseWSHeader(b[used:])
		if err != nil {
			l.w.badFrames.Add(1)
			return len(b), true
		}
		if !complete || len(b)-used-hlen < plen {
			return used, false
		}
		p := b[used+hlen : used+hlen+plen]
		used += hlen + plen
		switch {
		case op == ws.OpPing:
			l.reply = client.AppendFrame(l.reply, ws.OpPong, p)
		case op == ws.OpClose:
			l.w.closedBy(p)
			return used, true
		case op == ws.OpPong:
		case op == ws.OpContinuation:
			if kc.frag == nil {
				l.w.badFrames.Add(1)
				return used, true
			}
			kc.frag = append(kc.frag, p...)
			if fin {
				l.data(kc, kc.frag, now)
				kc.frag = nil
			}
		case !fin:
			kc.frag = append(make([]byte, 0, 2*len(p)), p...)
		default:
			l.data(kc, p, now)
		}
	}
}

// kernelSink hands fanfare's pushed messages to the ledger.
type kernelSink struct {
	l   *kernelLoop
	kc  *kernelConn
	now int64
}

func (s *kernelSink) PushedMsg(gid, seq int64, body []byte) {
	if s.l.w.seqs {
		s.l.seqMessage(s.kc, gid, seq, body, s.now, false)
		return
	}
	s.l.message(s.kc, body, s.now)
}

// data handles one data message.
func (l *kernelLoop) data(kc *kernelConn, p []byte, now int64) {
	switch l.w.peer {
	case peerFanfare:
		sink := kernelSink{l: l, kc: kc, now: now}
		typ, err := wire.ScanPush(p, &sink)
		if err != nil {
			l.w.badFrames.Add(1)
			return
		}
		if l.w.seqs {
			l.repair(kc, typ, p, now)
		}
	case peerCentrifugo:
		for len(p) > 0 {
			line := p
			if i := bytes.IndexByte(p, '\n'); i >= 0 {
				line, p = p[:i], p[i+1:]
			} else {
				p = nil
			}
			if len(line) == 2 && line[0] == '{' && line[1] == '}' {
				// Centrifugo's ping: answer with a pong, also {}.
				l.reply = client.AppendFrame(l.reply, ws.OpText, line)
				continue
			}
			l.message(kc, line, now)
		}
	}
}

// message records one message body (or a frame holding one) in the ledger.
func (l *kernelLoop) message(kc *kernelConn, body []byte, now int64) {
	seq := benchField(body, `"n":`)
	if seq <= 0 {
		return // not a bench message (a reply, a join)
	}
	w := l.w
	sent := benchField(body, `"t":`)
	in := sent >= w.measureFrom.Load() && sent < w.measureTo.Load()
	if kc.r.mark(seq, in) && in {
		w.hist.record(kc.r.idx, (now-sent)/1000)
	}
}

// seqMessage records message seq of gid (the server's seq, workerSpec.Seqs)
// in the ledger; pulled says it came in a pull's answer, where a message
// already pushed is no duplicate. A pushed seq past the one after the
// highest seen is a gap: the missing range is pulled at once (the SDK
// waits GapWait first; on one node's ordered pushes a gap is a loss, not
// a reordering).
func (l *kernelLoop) seqMessage(kc *kernelConn, gid, seq int64, body []byte, now int64, pulled bool) (fresh bool) {
	w := l.w
	if gid != w.gid {
		return false
	}
	sent := benchField(body, `"t":`)
	in := sent >= w.measureFrom.Load() && sent < w.measureTo.Load()
	fresh, gapFrom := kc.r.markSeq(seq, in, pulled)
	if fresh && in {
		w.hist.record(kc.r.idx, (now-sent)/1000)
	}
	if fresh && pulled {
		w.pulled.Add(1)
	}
	if gapFrom > 0 && !pulled {
		w.gaps.Add(1)
		l.pull(kc, gapFrom, seq-1)
	}
	return fresh
}

// repair handles the frames that say messages are missing (resync, an L2
// summary) and the answers to pulls (messages, error): it asks for what is
// missing up to the frame's last seq, and goes on with the next page of an
// answer that stopped early. These frames are rare and decoded in full.
func (l *kernelLoop) repair(kc *kernelConn, typ string, p []byte, now int64) {
	w := l.w
	switch typ {
	case wire.TypeResync, wire.TypeSummary, wire.TypeMessages, wire.TypeError:
	default:
		return
	}
	f, err := wire.DecodeServer(p)
	if err != nil {
		w.badFrames.Add(1)
		return
	}
	switch f := f.(type) {
	case *wire.Resync:
		if f.GID == w.gid {
			w.resyncs.Add(1)
			l.pullMissing(kc, f.LastSeq)
		}
	case *wire.Summary:
		if f.GID == w.gid {
			w.summaries.Add(1)
			l.pullMissing(kc, f.LastSeq)
		}
	case *wire.Messages:
		if f.GID != w.gid {
			return
		}
		got := 0
		for i := range f.Messages {
			m := &f.Messages[i]
			if l.seqMessage(kc, m.GID, m.Seq, m.Body, now, true) {
				got++
			}
		}
		to := kc.pullTo
		kc.pullTo = 0
		switch {
		case f.NextSeq > 0 && f.NextSeq <= to:
			l.pull(kc, f.NextSeq, to)
		case got > 0:
			// Whatever is still missing up to where this pull was meant
			// to reach (a gap or resync seen while it was out extended
			// it). A page that brought nothing new ends the repair: the
			// rest is not in the store, and the ledger counts it lost.
			l.pullMissing(kc, min(f.LastSeq, max(to, kc.r.highest())))
		}
	case *wire.Error:
		if f.ID == kernelPullID {
			w.pullErrors.Add(1)
			kc.pullTo = 0
		}
	}
}

// kernelPullID is the id of every pull a kernel receiver sends (one at a
// time per connection).
const kernelPullID = "repair"

// pullMissing pulls from kc's first missing seq up to to, when any is
// missing there.
func (l *kernelLoop) pullMissing(kc *kernelConn, to int64) {
	if from := kc.r.firstMissing(); from <= to {
		l.pull(kc, from, to)
	}
}

// pull asks for seqs from..to on kc, unless a pull is already out: its
// answer then pulls what is still missing.
func (l *kernelLoop) pull(kc *kernelConn, from, to int64) {
	if from > to {
		return
	}
	if kc.pullTo != 0 {
		kc.pullTo = max(kc.pullTo, to)
		return
	}
	kc.pullTo = to
	l.w.pulls.Add(1)
	var b [160]byte
	req := wire.AppendPull(b[:0], &wire.Pull{ID: kernelPullID, GID: l.w.gid, FromSeq: from, ToSeq: to})
	l.reply = client.AppendFrame(l.reply, ws.OpText, req)
}

// benchField reads the non-negative integer after key in b (0 when
// absent), the way sentAt reads "t".
func benchField(b []byte, key string) int64 {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0
	}
	var v int64
	for _, c := range b[i+len(key):] {
		switch {
		case c >= '0' && c <= '9':
			v = v*10 + int64(c-'0')
		case c == ' ' && v == 0:
		default:
			return v
		}
	}
	return v
}

// heartbeat pings every fanfare connection once per heartbeat interval so
// that the server's idle timeout never closes a receiver that only
// listens. (Centrifugo pings the client; its pong is sent by data.)
func (kw *kernelWorker) heartbeat() {
	for {
		kw.mu.Lock()
		every := kw.every
		kw.mu.Unlock()
		if every <= 0 {
			every = 30 * time.Second
		}
		t := time.NewTimer(every)
		select {
		case <-kw.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if kw.peer != peerFanfare {
			continue
		}
		kw.mu.Lock()
		conns := kw.conns
		kw.mu.Unlock()
		for _, kc := range conns {
			_, _ = unix.Write(kc.fd, leanPing)
		}
	}
}

// kernelClose is the close frame (1000) kernel connections end with.
var kernelClose = client.AppendFrame(nil, ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))

// close sends every connection a close frame, stops the loops and closes
// the descriptors.
func (kw *kernelWorker) close() {
	if !kw.closing.CompareAndSwap(false, true) {
		return
	}
	close(kw.stop)
	kw.wg.Wait()
	kw.mu.Lock()
	conns := kw.conns
	kw.mu.Unlock()
	for _, kc := range conns {
		_, _ = unix.Write(kc.fd, kernelClose)
		unix.Close(kc.fd)
	}
	for _, l := range kw.loops {
		unix.Close(l.epfd)
	}
}
