// Package faultproxy is a TCP proxy for tests that puts network faults
// between a client and a server: fanfared and its Postgres or Redis, or a
// test client and fanfared. Each fault is switched at runtime, per
// direction, and applies to the connections already open as well as to new
// ones:
//
//   - Latency and Jitter: every chunk of bytes is delivered Latency plus a
//     random part of Jitter after it was read, in order (a chunk never
//     overtakes the one before it, as on one TCP stream).
//   - BytesPerSecond: the direction's throughput per connection is capped.
//   - Blackhole: nothing is delivered in that direction while the
//     connection stays up. The bytes are held, not discarded: on a real
//     network a one-way packet loss makes TCP retransmit, so what was sent
//     arrives after the fault ends (if the peer has not given up by then),
//     and nothing can vanish from the middle of a stream. Held bytes fill
//     the proxy's queue and then the kernel's buffers, so the sender's
//     writes block as they would on a dead link.
//   - ResetAfter: once that many bytes went through the direction since the
//     fault was set (or since the connection opened, for later ones), the
//     connection is reset (RST on both sides) in the middle of the stream.
//
// Proxy-wide: Refuse closes the listening socket, so new connections are
// refused (ECONNREFUSED) while the open ones go on; Partition holds both
// directions of every connection, old and new (a new one is accepted, as a
// dial through a partition may be, and then hears nothing); ResetAll
// resets every open connection.
//
// Why not toxiproxy: its Go module can be used as a library, but it has no
// reset after N bytes (its reset_peer toxic resets after a time, its
// limit_data toxic closes with a FIN), it pulls in an HTTP API, a logger
// and a router that tests do not need, and its faults are applied through
// a chain of goroutines per toxic. This package is small, has no
// dependencies beyond the standard library and gives each fault exactly
// the semantics the tests assert.
//
// Goroutines: Start runs one accept goroutine; each proxied connection has
// two per direction (a reader that timestamps chunks and a writer that
// delivers them under the faults in force), all owned by the Proxy: Close
// closes the listener and every connection and waits for them. Faults are
// read by the writers through atomic pointers; a change wakes every writer
// that waits on a blackhole. Only tests import this package.
package faultproxy
