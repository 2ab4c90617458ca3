package socket

import (
	"bufio"
	"bytes"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// TestAccumulateSplits: the header is found at the same place, with the same
// remainder, whatever way the request is cut.
func TestAccumulateSplits(t *testing.T) {
	req := append(upgradeRequest("/ws", "alice", "X-Pad: "+strings.Repeat("p", 300)), text("after").encode()...)
	want := bytes.Index(req, crlfcrlf) + 4
	for cut := 0; cut <= len(req); cut++ {
		hdr, rest, tooBig := feedAll(req, []int{cut}, 8<<10)
		if tooBig || len(hdr) != want || !bytes.Equal(rest, req[want:]) {
			t.Fatalf("cut at %d: got header %d bytes, rest %d, tooBig %v; want %d, %d, false", cut, len(hdr), len(rest), tooBig, want, len(req)-want)
		}
	}
	hdr, _, _ := feedAll(req, everyByte(len(req)), 8<<10)
	if len(hdr) != want {
		t.Fatalf("byte by byte: got header of %d bytes, want %d", len(hdr), want)
	}
	if _, _, tooBig := feedAll(req, everyByte(len(req)), 256); !tooBig {
		t.Fatalf("got a header over the limit accepted")
	}
}

// feedAll runs accumulate over data cut at cuts and returns the first
// result that is not "need more".
func feedAll(data []byte, cuts []int, limit int) (hdr, rest []byte, tooBig bool) {
	c := &Conn{}
	defer func() {
		if c.hs != nil {
			putBuf(c.hs)
		}
	}()
	prev := 0
	pieces := [][]byte{}
	for _, cut := range cuts {
		if cut > prev && cut < len(data) {
			pieces = append(pieces, data[prev:cut])
			prev = cut
		}
	}
	pieces = append(pieces, data[prev:])
	for i, p := range pieces {
		hdr, rest, tooBig = accumulate(c, p, limit)
		if tooBig {
			return nil, nil, true
		}
		if hdr != nil {
			// Whatever came after the header, including later pieces.
			r := append(bytes.Clone(rest), bytes.Join(pieces[i+1:], nil)...)
			return bytes.Clone(hdr), r, false
		}
	}
	return nil, nil, false
}

func FuzzHandshake(f *testing.F) {
	f.Add(upgradeRequest("/ws", "alice"), uint16(10))
	f.Add(upgradeRequest("/rooms/a/ws", "", "Authorization: Bearer bob:2", "Origin: http://example.com"), uint16(50))
	f.Add(upgradeRequest("/ws", "bad"), uint16(3))
	f.Add(upgradeRequest("/x", "alice"), uint16(0))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), uint16(7))
	f.Add([]byte("GET /ws?token=%zz HTTP/1.1\r\nHost: a\r\n\r\n"), uint16(7))
	f.Add(bytes.Replace(upgradeRequest("/ws", "a"), []byte("13"), []byte("8"), 1), uint16(99))
	s, err := New(Config{Authenticator: &fakeAuth{}, MaxConnsPerIP: -1, MaxConnsPerUser: 1, MaxHeaderBytes: 1024})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		whole, wrest, wbig := feedAll(data, nil, s.cfg.MaxHeaderBytes)
		split, srest, sbig := feedAll(data, []int{int(cut)}, s.cfg.MaxHeaderBytes)
		if !bytes.Equal(whole, split) || !bytes.Equal(wrest, srest) || wbig != sbig {
			t.Fatalf("split at %d changed the result: header %q/%q tooBig %v/%v", cut, whole, split, wbig, sbig)
		}
		if whole == nil {
			return
		}
		c := &Conn{remote: netip.MustParseAddrPort("127.0.0.1:1000")}
		resp, status, _ := s.decide(c, whole)
		r, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(resp)), nil)
		if err != nil {
			t.Fatalf("answer is not HTTP: %q: %v", resp, err)
		}
		switch {
		case status == 0 && r.StatusCode != http.StatusSwitchingProtocols:
			t.Fatalf("accepted but answered %d", r.StatusCode)
		case status == 0 && r.Header.Get("Sec-WebSocket-Accept") == "":
			t.Fatalf("101 without Sec-WebSocket-Accept: %q", resp)
		case status == 0 && r.Header.Get("Sec-WebSocket-Extensions") != "":
			t.Fatalf("an extension was negotiated: %q", resp)
		case status != 0 && r.StatusCode != status:
			t.Fatalf("refused with %d but answered %d", status, r.StatusCode)
		case status != 0 && (status < 400 || status > 599):
			t.Fatalf("refusal status %d", status)
		case status != 0 && (c.active || c.userSlot):
			t.Fatalf("a refusal kept its reservations")
		}
		s.releaseSlots(c)
		if n := s.active.Load(); n != 0 {
			t.Fatalf("active count %d after release, want 0", n)
		}
		s.userMu.Lock()
		n := len(s.perUser)
		s.userMu.Unlock()
		if n != 0 {
			t.Fatalf("per-user map holds %d entries after release", n)
		}
	})
}
