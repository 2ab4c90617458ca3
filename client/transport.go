package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gobwas/httphead"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"
	"github.com/gobwas/ws/wsutil"
)

// dialer returns the TCP dialer for a Conn: bound to localAddr (when set)
// with IP_BIND_ADDRESS_NO_PORT, so the source port is chosen at connect time
// per destination and one source address is not limited to one ephemeral
// port range across all destinations.
func dialer(timeout time.Duration, localAddr string) *net.Dialer {
	d := &net.Dialer{Timeout: timeout, KeepAlive: -1}
	if localAddr != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(localAddr)}
		d.Control = bindNoPort
	}
	return d
}

// wsConn is one WebSocket connection: the socket, its frame reader and a
// write lock. Frames are written whole under wmu; reads happen on one
// goroutine at a time.
type wsConn struct {
	nc   net.Conn
	rd   wsutil.Reader
	buf  []byte // the last data message read; reused
	wmu  sync.Mutex
	wbuf []byte
	wto  time.Duration
	recv atomic.Uint64 // frames read, for dead-connection detection
	once sync.Once
	// permessage-deflate, when the server accepted it (deflate.go):
	// zstate tracks RSV1 of the message being read, zbuf holds the
	// inflated message, zmax bounds it.
	deflate bool
	zstate  wsflate.MessageState
	zbuf    []byte
	zmax    int64
}

// maxKeptBuf is the largest read buffer kept between messages; a bigger one
// (a large pull answer) is dropped so idle connections stay small.
const maxKeptBuf = 64 << 10

// dialWS connects to rawURL with the Bearer token and returns the upgraded
// connection.
func dialWS(ctx context.Context, cfg *Config, rawURL, token string) (*wsConn, error) {
	d := ws.Dialer{
		ReadBufferSize: cfg.ReadBufferSize,
		Timeout:        cfg.DialTimeout + cfg.HandshakeTimeout,
		NetDial:        dialer(cfg.DialTimeout, cfg.LocalAddr).DialContext,
	}
	if token != "" {
		d.Header = ws.HandshakeHeaderHTTP(http.Header{"Authorization": []string{"Bearer " + token}})
	}
	if cfg.Deflate {
		d.Extensions = []httphead.Option{deflateOffer}
	}
	nc, br, hs, err := d.Dial(ctx, rawURL)
	if err != nil {
		var se ws.StatusError
		if errors.As(err, &se) {
			return nil, &HandshakeError{Status: int(se)}
		}
		return nil, fmt.Errorf("client: dial %s: %w", rawURL, err)
	}
	// br, when set, holds the server's first frames that came with the
	// upgrade answer; it is a bufio.Reader of the same size over nc.
	if br == nil {
		br = bufio.NewReaderSize(nc, cfg.ReadBufferSize)
	}
	c := &wsConn{nc: nc, wto: cfg.WriteTimeout, zmax: cfg.MaxFrameBytes}
	c.rd = wsutil.Reader{
		Source:         br,
		State:          ws.StateClientSide,
		MaxMessageSize: cfg.MaxFrameBytes,
	}
	if cfg.Deflate {
		ok, err := deflateAccepted(hs.Extensions)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("client: dial %s: %w", rawURL, err)
		}
		if ok {
			c.deflate = true
			c.rd.State |= ws.StateExtended
			c.rd.Extensions = []wsutil.RecvExtension{&c.zstate}
		}
	}
	return c, nil
}

// read returns the next data message. The slice is valid until the next
// call. Control frames are handled here: pings answered, close answered and
// reported as an error.
func (c *wsConn) read() ([]byte, error) {
	for {
		hdr, err := c.rd.NextFrame()
		if err != nil {
			return nil, err
		}
		c.recv.Add(1)
		if hdr.OpCode.IsControl() {
			if err := c.control(hdr); err != nil {
				return nil, err
			}
			continue
		}
		if hdr.OpCode != ws.OpText && hdr.OpCode != ws.OpBinary {
			if err := c.rd.Discard(); err != nil {
				return nil, err
			}
			continue
		}
		if cap(c.buf) > maxKeptBuf {
			c.buf = nil
		}
		buf := c.buf[:0]
		if hdr.Fin && hdr.Length <= maxKeptBuf && int64(cap(buf)) < hdr.Length {
			buf = make([]byte, 0, hdr.Length)
		}
		for {
			if len(buf) == cap(buf) {
				buf = append(buf, 0)[:len(buf)]
			}
			n, err := c.rd.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
		}
		c.buf = buf
		if c.deflate && c.zstate.IsCompressed() {
			z, err := inflateMsg(c.zbuf[:0], buf, c.zmax)
			if cap(z) <= maxKeptBuf {
				c.zbuf = z
			}
			if err != nil {
				return nil, err
			}
			buf = z
		}
		// Checked once per message: wsutil's streaming check costs several
		// times more than utf8.Valid's ASCII fast path.
		if hdr.OpCode == ws.OpText && !utf8.Valid(buf) {
			return nil, wsutil.ErrInvalidUTF8
		}
		return buf, nil
	}
}

// control handles one control frame whose header was just read
// (ws.CheckHeader bounded its payload to 125 bytes).
func (c *wsConn) control(hdr ws.Header) error {
	var p [125]byte
	n := 0
	for {
		m, err := c.rd.Read(p[n:])
		n += m
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if n == len(p) && m == 0 {
			return ws.ErrProtocolControlPayloadOverflow
		}
	}
	payload := p[:n]
	switch hdr.OpCode {
	case ws.OpPing:
		return c.writeFrame(ws.OpPong, payload)
	case ws.OpClose:
		code, reason := ws.ParseCloseFrameData(payload)
		_ = c.writeFrame(ws.OpClose, ws.NewCloseFrameBody(code, ""))
		return wsutil.ClosedError{Code: code, Reason: reason}
	}
	return nil
}

// writeText writes one text frame.
func (c *wsConn) writeText(p []byte) error { return c.writeFrame(ws.OpText, p) }

// writeFrame writes one masked frame; a failed write closes the socket so
// the reader ends too.
func (c *wsConn) writeFrame(op ws.OpCode, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b := appendFrame(c.wbuf[:0], op, p)
	if cap(b) <= maxKeptBuf {
		c.wbuf = b
	}
	if err := c.nc.SetWriteDeadline(time.Now().Add(c.wto)); err != nil {
		c.close()
		return err
	}
	if _, err := c.nc.Write(b); err != nil {
		c.close()
		return err
	}
	return nil
}

// appendFrame appends a final, masked client frame with payload p.
func appendFrame(dst []byte, op ws.OpCode, p []byte) []byte {
	n := len(p)
	dst = append(dst, 0x80|byte(op))
	switch {
	case n < 126:
		dst = append(dst, 0x80|byte(n))
	case n <= 0xffff:
		dst = append(dst, 0x80|126, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0x80|127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	var mask [4]byte
	binary.LittleEndian.PutUint32(mask[:], rand.Uint32())
	dst = append(dst, mask[:]...)
	start := len(dst)
	dst = append(dst, p...)
	ws.Cipher(dst[start:], mask, 0)
	return dst
}

// closeWith sends a close frame with code (best effort) and closes.
func (c *wsConn) closeWith(code ws.StatusCode) {
	_ = c.writeFrame(ws.OpClose, ws.NewCloseFrameBody(code, ""))
	c.close()
}

// close closes the socket; the reader's next read fails.
func (c *wsConn) close() {
	c.once.Do(func() { c.nc.Close() })
}
