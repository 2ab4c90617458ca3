package client

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// TestAppendFrame: a frame the SDK writes reads back, as a server reads it,
// as one final masked frame with the payload, in every length form.
func TestAppendFrame(t *testing.T) {
	for _, n := range []int{0, 125, 126, 0xffff, 0x10000} {
		p := bytes.Repeat([]byte{'x'}, n)
		b := AppendFrame([]byte("keep"), ws.OpText, p)
		if !bytes.HasPrefix(b, []byte("keep")) {
			t.Fatalf("n=%d: dst's bytes not kept", n)
		}
		r := bytes.NewReader(b[4:])
		h, err := ws.ReadHeader(r)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		got := make([]byte, h.Length)
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		ws.Cipher(got, h.Mask, 0)
		if !h.Fin || !h.Masked || h.OpCode != ws.OpText || !bytes.Equal(got, p) || r.Len() != 0 {
			t.Fatalf("n=%d: got header %+v, %d payload bytes (equal %v), %d left; want final masked text with the payload",
				n, h, len(got), bytes.Equal(got, p), r.Len())
		}
	}
}

func TestDialer(t *testing.T) {
	d := Dialer(3*time.Second, "")
	if d.Timeout != 3*time.Second || d.KeepAlive >= 0 || d.LocalAddr != nil || d.Control != nil {
		t.Fatalf("got %+v, want a 3s timeout, no keep-alive, no local address", d)
	}
	d = Dialer(time.Second, "127.0.0.1")
	if d.LocalAddr == nil || d.LocalAddr.String() != "127.0.0.1:0" || d.Control == nil {
		t.Fatalf("got local address %v, control set %v; want 127.0.0.1:0 with the socket option", d.LocalAddr, d.Control != nil)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial from 127.0.0.1: %v", err)
	}
	c.Close()
}
