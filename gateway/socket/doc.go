// Package socket is fanfare's WebSocket connection layer: a multicore gnet
// v2 server that upgrades with gobwas/ws, decodes RFC 6455 frames
// incrementally, and writes precompiled frames to many connections at once.
//
// # Invariants
//
//   - No read ever blocks an event loop. The handshake is buffered until
//     "\r\n\r\n" (Config.MaxHeaderBytes, else 431) and then upgraded from
//     memory; frames are decoded from whatever bytes arrived, with partial
//     frames and fragmented messages held in the decoder. The decoder's
//     verdict does not depend on how the bytes were split across reads.
//   - Every client is bounded in time and memory: HandshakeTimeout (408),
//     MessageTimeout for a started frame or message (1008), IdleTimeout
//     without a frame (1001), CloseTimeout for the close handshake, token
//     expiry (1008). Frame and message sizes are checked against the
//     declared length before any payload is stored (1009), and storage grows
//     only as bytes arrive. Idle connections hold no buffers.
//   - Protocol violations close with the RFC 6455 code: 1002 framing, 1003
//     binary data (the protocol is JSON text), 1007 invalid UTF-8 (checked
//     as it arrives, fail-fast across fragments), 1009 too big.
//     permessage-deflate is negotiated only with Config.Deflate
//     (deflate.go): a compressed client message is inflated whole, within
//     MaxMessageBytes, then checked as UTF-8; the connection keeps at most
//     512 bytes of inflate history, and only once it has compressed.
//   - With Config.UpgradeHold the 101 is held, counted among the
//     connection's waiting bytes, until the first frame the handler
//     writes (or a pong, or a close frame), and goes out in the same
//     write ahead of it; without one it goes alone when the hold ends.
//     Nothing is ever written to a connection before its 101.
//   - Refusals happen before the upgrade, as plain HTTP: 404 path, 403
//     origin, 429 node/user caps or Handler.Admit, 401 token, 503 L4 or
//     shutdown. The per-address cap is checked at accept, before a byte of
//     the request is read (429 at once).
//   - Outbound frames are compiled once (Frame) and shared by every
//     recipient; with permessage-deflate, compressed once more, lazily,
//     and that variant shared by every deflate recipient. Frames for one connection are written in the order they
//     were queued, coalesced into one write (writev, at most 1024 slices)
//     per loop iteration. A connection whose unsent bytes pass
//     OutboundBound drops pushes and, once drained, gets exactly one resync
//     per group (Config.Resync); replies are never dropped, but past
//     OutboundHardBound the connection is closed (1008). A Broadcast
//     delivery refused at LoopQueueBound takes the same path: the
//     connection overflows, records the group's missed seq and gets its
//     resync once drained (a connection missing more than 128 groups at
//     once is closed with 1013). No Broadcast push with a group is dropped
//     without a resync or a close.
//   - Every byte written to a socket counts against its connection's
//     bounds, through one check (loop.put, and flush for queued frames):
//     pushes, pongs and resyncs stay within OutboundBound, replies and
//     handshake answers within OutboundHardBound, and a close frame may
//     take it at most closeAllowance (127 bytes) past that, so a
//     connection closed at the hard bound still gets its close frame
//     behind what it has not read. A pong that does not fit waits, one per
//     connection (a later ping replaces it), until the connection drains;
//     meanwhile its frames do not refresh the idle deadline, so a client
//     that pings and never reads is closed at IdleTimeout. The same holds
//     for any frame of a connection with bytes waiting of which the socket
//     took none since the last refresh: a client whose protocol-level
//     heartbeat (a text ping answered by a reply) runs while its reading
//     is stuck is closed at IdleTimeout too, not when its replies reach
//     the hard bound hours later.
//
// # Goroutine model
//
// gnet runs NumLoops event loops; each connection lives on one loop, and
// all of its state (decoder, deadlines, outbound chain) is touched only
// there. Handler methods for a connection run on its loop, serialized.
// Other goroutines reach a loop only through its queue: Conn.Write,
// Conn.Push, Conn.Close and Server.Broadcast append to the loop's inbox
// under its mutex and schedule at most one EventLoop.Execute task per loop
// until that task has run; the task (or the end of the current callback)
// flushes the inbox. A gnet ticker triggers a sweep task on every loop that
// enforces the deadlines. There are no per-connection goroutines or timers.
//
// # Lock order
//
// loop.mu of several loops: ascending loop index (Broadcast takes them
// all); a loop's mu also guards Conn.refHead of its connections.
// Server.ipMu and Server.userMu are leaves, never held with another lock.
// No lock is held while a Handler or Authenticator runs.
package socket
