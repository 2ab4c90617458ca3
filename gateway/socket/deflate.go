package socket

// permessage-deflate (RFC 7692), opt-in with Config.Deflate.
//
// Outbound, the server never keeps a compression context: every compressed
// message is a complete deflate stream of its own (server_no_context_takeover
// is always in the answer), so a push frame is compressed once, lazily, the
// first time a deflate connection is due to get it, and the same compressed
// bytes go to every deflate recipient; plain recipients get the plain bytes.
// Compression therefore costs the same for 10 or 100,000 recipients.
//
// Inbound, browsers offer "client_max_window_bits" but not
// "client_no_context_takeover", so a client may refer back into its earlier
// messages. The server answers client_max_window_bits=9 and keeps the last
// 512 bytes a connection sent (allocated on its first compressed message)
// as the inflate dictionary; a client that offers client_no_context_takeover
// gets it and the server keeps nothing. An offer with neither parameter, or
// with a server_max_window_bits below 15 (Go's flate always uses a 32 KiB
// window), is declined: the connection works, uncompressed. A compressed
// message is inflated in one go when its last fragment arrives, with its
// output capped at MaxMessageBytes (1009 past it, so a small deflate bomb
// costs at most that much) and then checked as UTF-8.
//
// The compressor and decompressor are github.com/klauspost/compress/flate
// (already in the module graph through pebble; faster than compress/flate
// at the same ratio), pooled, so nothing is held per connection but the
// 512-byte history of a client that compresses.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync"

	"github.com/gobwas/httphead"
	"github.com/gobwas/ws/wsflate"
	"github.com/klauspost/compress/flate"
)

// deflateClientBits is the client window the server asks for: the inflate
// history it keeps per compressing connection is 1<<deflateClientBits bytes.
// 9, not 8: zlib, which browsers use, turns a raw-deflate window of 8 into 9.
const deflateClientBits = 9

const deflateHistory = 1 << deflateClientBits

// negotiateDeflate is the ws.Upgrader's Negotiate hook: it accepts the
// first permessage-deflate offer the server can honour (see the file
// comment) and declines every other extension.
func (h *hsCheck) negotiateDeflate(opt httphead.Option) (httphead.Option, error) {
	if !h.s.cfg.Deflate || h.deflate || !bytes.Equal(opt.Name, wsflate.ExtensionNameBytes) {
		return httphead.Option{}, nil
	}
	var p wsflate.Parameters
	if err := p.Parse(opt); err != nil {
		return httphead.Option{}, nil // a malformed offer is declined, not failed
	}
	// Window bits 8..15 are values; 1 stands for a parameter without one.
	if p.ServerMaxWindowBits != 0 && p.ServerMaxWindowBits < 15 {
		return httphead.Option{}, nil
	}
	resp := wsflate.Parameters{ServerNoContextTakeover: true}
	switch {
	case p.ClientNoContextTakeover:
		resp.ClientNoContextTakeover = true
	case p.ClientMaxWindowBits >= 8:
		resp.ClientMaxWindowBits = min(p.ClientMaxWindowBits, deflateClientBits)
	case p.ClientMaxWindowBits != 0: // offered without a value
		resp.ClientMaxWindowBits = deflateClientBits
	default:
		return httphead.Option{}, nil
	}
	h.deflate, h.deflateNoCtx = true, resp.ClientNoContextTakeover
	return resp.Option(), nil
}

// deflateTail ends every compressed message: the sync-flush marker that
// RFC 7692 §7.2.1 strips from the wire, then an empty final stored block so
// the decompressor stops with io.EOF instead of waiting for more input.
var deflateTail = []byte{0x00, 0x00, 0xff, 0xff, 0x01, 0x00, 0x00, 0xff, 0xff}

// msgReader feeds the decompressor a message and then deflateTail, without
// allocating (flate wants an io.ByteReader, or it wraps its input in a
// bufio.Reader).
type msgReader struct {
	src []byte
	off int
}

func (r *msgReader) ReadByte() (byte, error) {
	switch {
	case r.off < len(r.src):
		r.off++
		return r.src[r.off-1], nil
	case r.off < len(r.src)+len(deflateTail):
		r.off++
		return deflateTail[r.off-1-len(r.src)], nil
	}
	return 0, io.EOF
}

func (r *msgReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		b, err := r.ReadByte()
		if err != nil {
			if n == 0 {
				return 0, err
			}
			break
		}
		p[n] = b
		n++
	}
	return n, nil
}

type inflater struct {
	r  io.ReadCloser // a flate reader; also a flate.Resetter
	in msgReader
}

var inflaters = sync.Pool{New: func() any {
	f := &inflater{}
	f.r = flate.NewReader(&f.in)
	return f
}}

var errInflateTooBig = errors.New("socket: inflated message too big")

// inflate appends the decompressed message src to dst, at most max bytes
// (errInflateTooBig beyond), with hist as the window of what came before.
func inflate(dst, src, hist []byte, max int) ([]byte, error) {
	f := inflaters.Get().(*inflater)
	defer inflaters.Put(f)
	f.in = msgReader{src: src}
	if err := f.r.(flate.Resetter).Reset(&f.in, hist); err != nil {
		return dst, err
	}
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		room := min(cap(dst), start+max+1)
		n, err := f.r.Read(dst[len(dst):room])
		dst = dst[:len(dst)+n]
		if len(dst)-start > max {
			return dst, errInflateTooBig
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// keepHistory sets *hist to the last deflateHistory bytes of *hist + out.
func keepHistory(hist *[]byte, out []byte) {
	if len(out) >= deflateHistory {
		*hist = append((*hist)[:0], out[len(out)-deflateHistory:]...)
		return
	}
	if drop := len(*hist) + len(out) - deflateHistory; drop > 0 {
		*hist = append((*hist)[:0], (*hist)[drop:]...)
	}
	*hist = append(*hist, out...)
}

type deflater struct {
	w   *flate.Writer
	buf bytes.Buffer
}

// deflaters[level] pools compressors of that level.
var deflaters [10]sync.Pool

// deflateFrame returns the compressed frame for payload (a final text frame
// with RSV1 set), or nil when compressing does not make it smaller.
func deflateFrame(payload []byte, level int) []byte {
	d, _ := deflaters[level].Get().(*deflater)
	if d == nil {
		d = &deflater{}
		d.w, _ = flate.NewWriter(&d.buf, level) // level is validated: 1..9
	}
	defer deflaters[level].Put(d)
	d.buf.Reset()
	d.w.Reset(&d.buf)
	_, _ = d.w.Write(payload) // writes to a bytes.Buffer do not fail
	_ = d.w.Flush()
	z := bytes.TrimSuffix(d.buf.Bytes(), deflateTail[:4])
	if len(z) >= len(payload) {
		return nil
	}
	out := appendFrameHeader(make([]byte, 0, 10+len(z)), 0x80|0x40|opText, len(z))
	return append(out, z...)
}

// appendFrameHeader appends an unmasked server frame header.
func appendFrameHeader(b []byte, b0 byte, n int) []byte {
	switch {
	case n < 126:
		return append(b, b0, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, b0, 126), uint16(n))
	}
	return binary.BigEndian.AppendUint64(append(b, b0, 127), uint64(n))
}

// payloadOf returns the payload of an unmasked server frame.
func payloadOf(b []byte) []byte {
	switch b[1] & 0x7f {
	case 126:
		return b[4:]
	case 127:
		return b[10:]
	}
	return b[2:]
}
