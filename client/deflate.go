package client

// permessage-deflate (RFC 7692) on the receiving side, with Config.Deflate.
// The offer asks the server to compress every message on its own
// (server_no_context_takeover), so the client keeps no window between
// messages, and says the client keeps none either (it never compresses).
// fanfared's server side of the same extension is gateway/socket's
// deflate.go; this package may import only gateway/wire, so the few lines
// of inflating live here too, with the standard library's decompressor.

import (
	"bytes"
	"compress/flate"
	"errors"
	"io"
	"sync"

	"github.com/gobwas/httphead"
	"github.com/gobwas/ws/wsflate"
)

var deflateOffer = wsflate.Parameters{ServerNoContextTakeover: true, ClientNoContextTakeover: true}.Option()

// deflateAccepted reports whether the server's answer accepted the offer;
// an answer that keeps a server context (which the client cannot follow)
// is an error.
func deflateAccepted(exts []httphead.Option) (bool, error) {
	for _, opt := range exts {
		if !bytes.Equal(opt.Name, wsflate.ExtensionNameBytes) {
			continue
		}
		var p wsflate.Parameters
		if err := p.Parse(opt); err != nil {
			return false, err
		}
		if !p.ServerNoContextTakeover {
			return false, errors.New("permessage-deflate accepted without server_no_context_takeover")
		}
		return true, nil
	}
	return false, nil
}

// deflateTail ends a compressed message: the sync-flush marker stripped
// from the wire, then an empty final block so the reader stops at io.EOF.
var deflateTail = []byte{0x00, 0x00, 0xff, 0xff, 0x01, 0x00, 0x00, 0xff, 0xff}

type inflater struct {
	r   io.ReadCloser // flate.Resetter too
	src bytes.Reader
	in  io.Reader
}

var inflaters = sync.Pool{New: func() any {
	f := &inflater{}
	f.in = io.MultiReader(&f.src, bytes.NewReader(deflateTail))
	f.r = flate.NewReader(f.in)
	return f
}}

// errInflatedTooBig is returned when a compressed server message inflates
// past Config.MaxFrameBytes.
var errInflatedTooBig = errors.New("client: compressed message inflates past MaxFrameBytes")

// inflateMsg appends the inflated message src to dst, at most max bytes.
func inflateMsg(dst, src []byte, max int64) ([]byte, error) {
	f := inflaters.Get().(*inflater)
	defer inflaters.Put(f)
	f.src.Reset(src)
	f.in = io.MultiReader(&f.src, bytes.NewReader(deflateTail))
	if err := f.r.(flate.Resetter).Reset(f.in, nil); err != nil {
		return dst, err
	}
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := f.r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if max > 0 && int64(len(dst)-start) > max {
			return dst, errInflatedTooBig
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}
