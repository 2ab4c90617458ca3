package socket

import (
	"bytes"
	"net/http"
	"testing"
	"time"
)

// firstRead writes the upgrade request and returns the bytes of the first
// read that completes the response head, and how long that took.
func firstRead(t *testing.T, c *wsClient, req []byte) ([]byte, time.Duration) {
	t.Helper()
	t0 := time.Now()
	c.write(req)
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, crlfcrlf) {
		n, err := c.nc.Read(buf)
		if err != nil {
			t.Fatalf("read after %q: %v", got, err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 101 ")) {
		t.Fatalf("got %q, want a 101", got)
	}
	return got, time.Since(t0)
}

// helloFrame is the encoded frame the tests' handlers write at open.
var helloFrame = []byte("\x81\x05hello")

// TestUpgradeHold: with UpgradeHold the 101 waits for the handler's first
// frame, written from another goroutine after a delay, and both arrive in
// one read; without it the 101 comes at once, alone.
func TestUpgradeHold(t *testing.T) {
	const delay = 50 * time.Millisecond
	for _, hold := range []time.Duration{0, 5 * time.Second} {
		t.Run("hold="+hold.String(), func(t *testing.T) {
			h := &echoHandler{onOpen: func(c *Conn) {
				go func() {
					time.Sleep(delay)
					_ = c.Write(NewTextFrame([]byte("hello")))
				}()
			}}
			s := startServer(t, Config{UpgradeHold: hold, Handler: h})
			c := rawDial(t, s)
			got, took := firstRead(t, c, upgradeRequest("/ws", "u1"))
			_, rest, _ := bytes.Cut(got, crlfcrlf)
			if hold == 0 {
				if len(rest) != 0 || took >= delay {
					t.Fatalf("without a hold: got %q after the 101 in %v, want nothing before %v", rest, took, delay)
				}
				return
			}
			if !bytes.Equal(rest, helloFrame) || took < delay {
				t.Fatalf("with a hold: got %q with the 101 after %v, want %q after at least %v", rest, took, helloFrame, delay)
			}
			// The connection works as usual after it.
			c.br.Reset(c.nc)
			c.sendText("x")
			c.expectText("x")
		})
	}
}

// TestUpgradeHoldEnds: a handler that writes nothing gets its 101 sent
// alone once UpgradeHold passes, not before, and not much later.
func TestUpgradeHoldEnds(t *testing.T) {
	const hold = 200 * time.Millisecond
	s := startServer(t, Config{UpgradeHold: hold})
	c := rawDial(t, s)
	got, took := firstRead(t, c, upgradeRequest("/ws", "u1"))
	if _, rest, _ := bytes.Cut(got, crlfcrlf); len(rest) != 0 {
		t.Fatalf("got %q after the 101, want nothing", rest)
	}
	// The sweep runs at least every UpgradeHold: at most two holds late
	// (plus scheduling slack on a loaded machine).
	if took < hold || took > 2*hold+time.Second {
		t.Fatalf("101 after %v, want between %v and about %v", took, hold, 2*hold)
	}
	c.br.Reset(c.nc)
	c.sendText("x")
	c.expectText("x")
}

// TestUpgradeHoldReplies: frames sent right behind the request are
// answered behind the held 101 (a pong through put, an echo through the
// flush), in order, and a handler's Close after them still sends the 101
// first.
func TestUpgradeHoldReplies(t *testing.T) {
	s := startServer(t, Config{UpgradeHold: 5 * time.Second})
	for _, tc := range []struct {
		name  string
		after []byte
		want  []out
	}{
		{"ping", ping("p").encode(), []out{pongOut("p")}},
		{"text", text("t").encode(), []out{echo("t")}},
		{"ping then text", append(ping("p").encode(), text("t").encode()...), []out{pongOut("p"), echo("t")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawDial(t, s)
			c.write(append(upgradeRequest("/ws", "u1"), tc.after...))
			if st, _, err := c.readResponse(); err != nil || st != http.StatusSwitchingProtocols {
				t.Fatalf("got %d, %v, want 101", st, err)
			}
			for _, w := range tc.want {
				op, p, err := c.readFrame(5 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				var got out
				switch op {
				case opText:
					got = echo(string(p))
				case opPong:
					got = pongOut(string(p))
				}
				if got != w {
					t.Fatalf("got %v, want %v", got, w)
				}
			}
		})
	}
	t.Run("close", func(t *testing.T) {
		h := &echoHandler{onOpen: func(c *Conn) { go c.Close(CloseTryAgainLater, "busy") }}
		s := startServer(t, Config{UpgradeHold: 5 * time.Second, Handler: h})
		c := rawDial(t, s)
		c.write(upgradeRequest("/ws", "u1"))
		if st, _, err := c.readResponse(); err != nil || st != http.StatusSwitchingProtocols {
			t.Fatalf("got %d, %v, want 101", st, err)
		}
		if code, _, err := c.expectClose(5 * time.Second); err != nil || code != CloseTryAgainLater {
			t.Fatalf("got close %d, %v, want %d", code, err, CloseTryAgainLater)
		}
	})
}
