package socket

import "net/netip"

// Payload returns the frame's payload: the JSON object it carries, without
// the WebSocket header. Other transports (the gateway's Server-Sent Events
// streams) write these bytes as they are, so a push is still encoded once
// for every recipient whatever its transport. It must not be modified.
func (f *Frame) Payload() []byte {
	b := f.b
	if len(b) < 2 {
		return nil
	}
	// Server frames are unmasked: a 2-byte header, then a 16-bit or
	// 64-bit extended length for payloads of 126 bytes or more.
	switch n := b[1] & 0x7f; {
	case n < 126:
		return b[2:]
	case n == 126:
		return b[4:]
	default:
		return b[10:]
	}
}

// IPKey is what an address counts under for a per-address connection cap
// (Config.MaxConnsPerIP): an IPv4 address (IPv4-mapped IPv6 unmapped)
// itself, an IPv6 address its v6bits block. Other transports cap their
// connections with the same key.
func IPKey(a netip.Addr, v6bits int) netip.Addr { return ipKey(a, v6bits) }
