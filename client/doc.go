// Package client is fanfare's Go SDK: a connection to a fanfare node that
// sends with retries, delivers every group's messages exactly once and in
// order, and repairs what pushes miss by pulling. It speaks protocol v1
// (docs/protocol.md) through package gateway/wire, the only package of this
// module it imports.
//
// # Use
//
//	c, err := client.Dial(ctx, client.Config{URL: "ws://127.0.0.1:8081/ws", Token: tok, HTTPURL: "http://127.0.0.1:8080"})
//	ack, err := c.Send(ctx, gid, map[string]string{"text": "hi"})
//	for m := range c.Messages() { ... }
//	c.Close()
//
// # Invariants
//
//   - Delivery: for each tracked group, messages reach the app (Messages
//     or Config.OnMessage) in strictly increasing seq order, each (gid,
//     seq) once. Duplicated pushes and pull answers overlapping pushes are
//     dropped by seq. A group is tracked from its first push (the live
//     stream starts there), from Track, Config.Cursors, or sync. A push
//     or resync of an untracked group (HTTPURL set, SkipUnread not) waits
//     for a sync answer: the sync after a connect when it is under way,
//     else the group's own sync entry; its last_read_seq, not the push,
//     says where delivery starts, so a member added while its app
//     connects, or while it is online, still gets the messages since its
//     join (its node may push first a message stored later).
//   - Gaps: a push with seq > delivered+1 is held in the group's pending
//     buffer (bounded by MaxPending) and, if the gap is still open after
//     GapWait, exactly the missing range [delivered+1, first pending-1] is
//     pulled, 200 messages per pull frame. summary and resync frames raise
//     the group's known last_seq and the rest is pulled at once; at
//     degradation level 3 (no pushes) groups are polled every PollInterval.
//     Seqs below the member's join_seq, which the server never returns,
//     are skipped.
//   - Reconnect: after a connection drops, the Conn redials with jittered
//     exponential backoff (BackoffMin..BackoffMax), then syncs (GET
//     /v1/sync, when HTTPURL is set) or probes every tracked group with a
//     pull up to its last_seq, and pulls what it missed.
//   - Sends: a Send keeps its client_msg_id across retries (connection
//     loss, overloaded, unavailable, rate_limited honoring retry_after_ms,
//     a missing answer), so the server stores it once and a retry returns
//     the original seq. A send is never reported as done without its ack.
//   - Bounded: the Messages and Events channels, the pending buffers and
//     the frames read (MaxFrameBytes) are bounded. A slow Messages reader
//     never stalls the socket: pushes that do not fit are dropped and
//     pulled later, so acks and pull answers keep flowing.
//
// # Without WebSocket
//
// Config.Transport picks the transport. By default (TransportAuto) a Conn
// opens a WebSocket and, when HTTPURL is set and the upgrade fails for any
// reason but the server's own refusals (401, 429, 503), falls back to
// Server-Sent Events (docs/protocol.md §14): it reads the same frames from
// GET /v1/events and turns its send, pull and read frames into the HTTP
// requests that stand for them (sse.go), so everything above holds over
// either transport. Once a WebSocket of the Conn has worked, a failure
// without an HTTP answer is taken for an outage and does not fall back;
// a proxy's answer still does. After a fallback, redials use SSE for five minutes
// before trying a WebSocket again. TransportSSE forces it (no URL needed),
// TransportWebSocket turns it off; Conn.Transport says which is in use.
// Over SSE the heartbeat is the server's comment lines: a stream from which
// nothing arrived for two of its heartbeats is closed and redialed.
//
// # Goroutine model
//
// A Conn owns two goroutines while connected: the reader (reads frames,
// answers waiting requests, delivers in-order pushes inline when nothing is
// pending) and run (redials, syncs, fills gaps with pulls and delivers
// buffered and pulled messages, blocking on the Messages channel if
// needed). The heartbeat is a timer (time.AfterFunc) that pings every
// heartbeat interval and closes a connection from which no frame arrived
// for two intervals. Send, Pull, Sync, Read and Track run on the caller's
// goroutine; writes are serialized per connection. Close cancels run, which
// closes the socket, waits for the reader, then closes Messages and Events:
// no goroutine outlives Close. A Room owns one goroutine (reader and
// redial) plus its heartbeat timer.
//
// Lock order: Conn.mu (delivery state) may be held while taking Conn.smu
// or Conn.cmu, never the reverse; no lock is held while waiting for the
// network, except the per-connection write lock during one write.
// Config.OnMessage and OnEvent are called with Conn.mu held.
//
// # Presence
//
// Presence frames (docs/protocol.md §4.16) are kept per group (Conn.Online,
// a sync.Map written by the reader) and handed to Config.OnPresence on the
// reader, without Conn.mu; OnlineMembers and AllOnlineMembers read the
// member route over HTTP on the caller's goroutine.
package client
