package client

import (
	"net"
	"time"

	"github.com/gobwas/ws"
)

// The SDK's framing and dialing, exported for load generators that read
// sockets themselves instead of through a Conn (cmd/fanfare's lean
// receivers), so that they dial and frame exactly as the SDK does.

// AppendFrame appends one final, masked client frame of type op with
// payload p to dst, as a Conn writes it: the mask is random per frame.
func AppendFrame(dst []byte, op ws.OpCode, p []byte) []byte { return appendFrame(dst, op, p) }

// Dialer returns the TCP dialer a Conn uses (Config.DialTimeout and
// Config.LocalAddr): no TCP keep-alive; when localAddr is set, bound to
// it with IP_BIND_ADDRESS_NO_PORT on Linux, so that the source port is
// chosen at connect time per destination.
func Dialer(timeout time.Duration, localAddr string) *net.Dialer { return dialer(timeout, localAddr) }
