// Package gateway is fanfare's connection layer: the WebSocket server
// (gateway/socket) and the HTTP API (API), with the protocol codec in
// gateway/wire and token checks in gateway/auth.
//
// # Errors
//
// Errors become wire codes and HTTP statuses in exactly one place:
// MapError, driven by the errorRules table in errors.go. HTTP handlers
// return errors and the route wrapper writes them (WriteError); the
// WebSocket path builds its error frames with AppendErrorFrame. Both use
// the same table, so a code never differs between the two transports.
// On member endpoints (ScopeMember) an unknown group answers exactly like
// a group the caller does not belong to, so gids cannot be probed.
// Retryable replies (429, 503) always carry a retry hint: the error's own
// (errors implementing RetryAfter, e.g. fanout.RetryError) or
// DefaultRetryAfter; HTTP sends it as Retry-After in whole seconds,
// rounded up, and as retry_after_ms in the body.
//
// # HTTP API
//
// API serves /healthz, /readyz, /metrics and the routes registered with
// HandleUser (Bearer JWT checked by a Verifier; the claims are in the
// request context, see CallerFrom), HandleAdmin (the admin token, compared
// in constant time) and HandleUserOrAdmin. Request bodies are capped
// (413), unknown paths and methods get JSON errors (404, 405), panics in
// handlers become logged 500s.
//
// # Goroutine model
//
// The gateway starts no goroutine per connection and no timer of its own;
// every goroutine it runs is owned by a Run or Serve that waits for it.
//
//   - gnet's event loops (socket.Server, Config.NumLoops, one per CPU by
//     default) run every Handler callback of their connections, one
//     connection's callbacks serialized: Admit, OnOpen, OnMessage and
//     OnClose of Chat and Rooms (through Sockets). They never block.
//     OnMessage decodes the frame, applies the in-process frame limits and
//     then answers at once (pong, a decode error), hands a send to
//     fanout.Engine.Send (which only enqueues), or queues the work on a
//     pool. The socket layer's deadlines (handshake, idle, message, close)
//     are swept by a gnet ticker on each loop, not by timers.
//   - Chat's connect pool (ChatConfig.ConnectWorkers, -connect-workers 8; queue
//     ConnectQueue, -connect-queue, past it the socket is closed with 1013): OnOpen queues
//     the registration, Engine.ConnectReady (store reads, presence bits),
//     which writes hello from inside it; the frames that came before hello
//     are answered there too, in order.
//   - Chat's frame pool (Workers, -frame-workers 32; WorkQueue, -frame-queue, past it overloaded):
//     pulls and reads, and, with ChatConfig.RemoteLimiter, the send checks
//     that go to Redis, queued by connection (submitKey) so that one
//     connection's sends reach the engine in the order they were sent.
//   - Rooms' join pool (RoomsConfig.Workers, 16): Manager.Join. A room's
//     updates are written by the waiting room's own goroutines (its driver,
//     see fanout/waitroom), through Rooms.deliver.
//   - Rooms' sweeper (one goroutine of Rooms.Run, once a second): closes
//     the tickets of polling visitors whose polls stopped (the HTTP polling
//     path, roompoll.go) and of admitted sessions held past their socket
//     in a site room, once their access token expired. The polling
//     handlers join on the HTTP request's goroutine (bounded by
//     JoinTimeout); a poller's frames arrive through poller.deliver.
//   - API.Serve owns the http.Server; net/http runs one goroutine per
//     HTTP connection, and handlers may block (store, engine, Redis).
//     An event stream (Events, GET /v1/events) keeps its request's
//     goroutine: it registers the stream with the engine, then writes
//     what Chat.Push and the replies queue on it, until the stream ends.
//     Events.Run is one sweeper: heartbeats, lifetimes, token expiry.
//   - The engine's goroutines call into Chat: a group's shard worker runs
//     Chat.Push and the send's Done callback (the ack or error frame);
//     Chat.Degraded runs on whoever changed a level: a shard worker (group
//     triggers), the engine's controller (node triggers, expiry of forced
//     levels) or an admin HTTP handler (a forced level).
//   - PresenceFeed.Run (docs/architecture.md §7.1): one goroutine, a round
//     per interval, owning the feed's per-group state; it reads the
//     presence index and, in cluster mode, one pipelined Redis call per
//     round, and writes presence frames through Chat.SendPresence
//     (socket.Server.Broadcast). The member route reads the index and the
//     cluster itself, on its HTTP goroutine.
//
// Pool work gets a context bounded by RequestTimeout (JoinTimeout for
// rooms). Chat.Run and Rooms.Run return once their workers did.
//
// # Who runs Push
//
// Chat.Push is the engine's Pusher. The shard worker that owns the group
// calls it, once per push (a committed batch, a merge window's batch or
// summary) and recipient set, with no engine lock held. It encodes each
// frame once (scratch from a sync.Pool: several workers push at once),
// queues the same bytes on every recipient's loop with Server.Broadcast
// or BroadcastBatch, and reports the bytes of one recipient's frames in
// Push.Bytes. It never blocks: a loop queue at its bound refuses the
// delivery, and the connection gets one resync for the group instead
// (gateway/socket).
//
// # Per-connection ordering
//
//   - hello is the first frame of a chat connection: it is queued before
//     the connection's presence bits are set (the ready step of
//     ConnectReady), so no push precedes it, and frames received before it
//     are held (at most 32, else 1008) and answered right after it, in
//     order, before later frames.
//   - A connection's frames leave in the order they were queued on its
//     loop (gateway/socket), pushes, replies and notices alike; pushes
//     may be dropped at the outbound bound (a resync follows), replies
//     never.
//   - A group's pushes come from its one shard worker, in commit order, so
//     they reach a connection in seq order. Nothing orders pushes of
//     different groups.
//   - A sender's ack is queued by the shard worker before the worker
//     pushes the committed batch, so on the sender's connection the ack
//     of a message comes before its push.
//   - A connection's sends reach Engine.Send in the order it sent them:
//     on the loop, or on its one pool worker when the limiter is remote.
//     Pulls and reads run on any frame worker: their answers may come in
//     any order and carry the request's id.
//
// # Lock order
//
// The gateway's own locks are session.mu (per chat connection: connected,
// ready and the early frames), roomSession.mu (per room connection),
// Rooms.pmu (the node's pollers and held sessions), poller.joinMu and
// poller.mu (per polling visitor), and API.readyMu. Calls into gateway/socket (Conn.Write, Conn.Close,
// Broadcast) take the socket loop's mu for a moment and call nothing back
// under it; so does every call from Chat to the socket layer.
//
//   - session.mu is held while hello is queued: session.mu before the
//     socket loop's mu. Hello is queued inside Engine.ConnectReady's
//     register step, which holds the uid's fanout leave stripe for
//     reading: fanout's leaveStripe.mu, then session.mu, then the loop's
//     mu. Nothing else is taken under session.mu but Chat.liveMu, a
//     leaf but for the socket loop's mu (a node-wide degraded frame is
//     queued to every live connection under it).
//   - roomSession.mu is a leaf. Room updates reach Rooms.deliver with the
//     waiting room's member.mu held: member.mu before the socket loop's mu.
//   - stream.mu (per event stream, sse_stream.go) is a leaf but for two
//     callers: hello is queued in the ready step (fanout's leaveStripe.mu,
//     then stream.mu), and Events.mu is held while the sweeper, a
//     node-wide degraded frame or the shutdown reach every stream
//     (Events.mu, then stream.mu). Chat.Push takes each recipient stream's
//     mu for a moment, with nothing else held.
//   - poller.joinMu is held across one Manager.Join (and so the waiting
//     room's locks, then member.mu, then poller.mu in poller.deliver);
//     Rooms.pmu comes before poller.mu (the sweeper reads deadlines under
//     it); nothing else is called under either. joinMu is never waited for
//     under pmu: the sweeper only tries it, after releasing pmu.
//   - API.readyMu is held across one Ready call (the store's ping), so that
//     concurrent probes share one answer; no gateway lock is taken with it.
//   - Chat.Push and the Done callbacks run with no engine lock held;
//     Chat.Degraded with none either (Levels releases its lock before it
//     reports a change).
//
// docs/architecture.md §14.2 has the order across the repository.
package gateway
