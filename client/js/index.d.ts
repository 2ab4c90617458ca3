// Type declarations of @fanfare/client, written by hand to match src/*.js.
// Field names of what the server sends (queue, granted, rejected, sync
// groups, hello) are the wire's (docs/protocol.md); what the SDK makes is
// camelCase.

/** A WebSocket constructor with the browser's interface (the global one, or npm ws). */
export interface WebSocketLike {
  readonly readyState: number
  onopen: ((ev: any) => void) | null
  onmessage: ((ev: { data: any }) => void) | null
  onerror: ((ev: any) => void) | null
  onclose: ((ev: { code: number; reason: string }) => void) | null
  send(data: string): void
  close(code?: number, reason?: string): void
  /** npm ws only: drop the TCP connection at once. */
  terminate?(): void
}
export type WebSocketConstructor = new (url: string) => WebSocketLike

/** Error codes the server sends (docs/protocol.md §7.1, §6.4). */
export type ServerCode =
  | 'bad_request' | 'unauthorized' | 'forbidden' | 'not_found' | 'group_closed' | 'too_large'
  | 'rate_limited' | 'overloaded' | 'unavailable' | 'internal' | 'room_full' | 'room_closed'
/** Error codes the SDK produces itself. */
export type LocalCode =
  | 'closed' | 'connection_lost' | 'timeout' | 'queue_full' | 'protocol' | 'handshake' | 'no_http' | 'aborted'
export type ErrorCode = ServerCode | LocalCode

export declare const ServerCodes: Readonly<Record<string, ServerCode>>
export declare const LocalCodes: Readonly<Record<string, LocalCode>>

/** Every error the SDK rejects with or emits. */
export declare class FanfareError extends Error {
  constructor(code: string, message?: string, opts?: { retryAfterMs?: number; status?: number; cause?: unknown })
  readonly name: 'FanfareError'
  /** A server code (docs/protocol.md §7.1) or a local one. */
  readonly code: ErrorCode | string
  /** The server's human-readable message ('' when none). */
  readonly serverMessage: string
  /** The server's retry hint in ms (retry_after_ms, or Retry-After), 0 when absent. */
  readonly retryAfterMs: number
  /** The HTTP status of an HTTP answer or a refused upgrade (when known), else 0. */
  readonly status: number
  /** True for rate_limited, overloaded, unavailable, connection_lost and timeout. */
  readonly retryable: boolean
  /** True when the code came from the server. */
  readonly fromServer: boolean
}

/** One group message, delivered once per (gid, seq), in seq order per group. */
export interface Message {
  gid: number
  seq: number
  /** The sender's uid. */
  from: string
  /** Commit time, Unix ms. */
  ts: number
  /** 'text' or 'at_all'. */
  kind: string
  /** The body as the sender wrote it (parsed JSON). */
  body: unknown
  /** True when the message came by pull (gap fill, catch-up), false for a push. */
  pulled: boolean
}

/** The ack of a send. */
export interface Ack {
  /** The client message id the send went under (retries reuse it). */
  id: string
  gid: number
  /** The message's place in the group. */
  seq: number
  /** Commit time, Unix ms. */
  ts: number
}

/** The answer of pull(). */
export interface Page {
  gid: number
  messages: Message[]
  /** The group's last_seq when the last page was read. */
  lastSeq: number
}

/** One entry of GET /v1/sync, as the server sends it. */
export interface SyncGroup {
  gid: number
  last_seq: number
  last_read_seq: number
  unread: number
}

/** The hello frame of a connection. */
export interface Hello {
  type: 'hello'
  uid: string
  node: string
  heartbeat_s: number
  max_message_bytes: number
}

/** Delivery options (shared by connect()); every bound is enforced. */
export interface DeliveryOptions {
  /** Out-of-order pushes held per group while a gap is filled; beyond it the highest is dropped and pulled later. Default 1024. */
  maxBuffered?: number
  /** How long a gap revealed by a push may stay open before it is pulled (ms). Default 50; 0 = pull at once. */
  gapWaitMs?: number
  /** The most a summary's pull is delayed, at random (ms), so a large group does not pull at once. Default 1000; 0 = at once. */
  summaryJitterMs?: number
  /** How often groups at level 3+ (no pushes) are polled (ms). Default 10000. */
  pollIntervalMs?: number
  /** The most messages a catch-up delivers per group; older ones are skipped (event 'skipped'). Default 0 = no bound. */
  maxCatchUp?: number
  /** Reconnect and retry backoff bounds (ms): jittered, doubling from min to max. Defaults 250 and 30000. */
  backoffMinMs?: number
  backoffMaxMs?: number
}

export interface ConnectOptions extends DeliveryOptions {
  /** The chat socket, ws://host:port/ws (wss:// behind TLS). Not needed with transport 'sse'. */
  url?: string
  /**
   * How to connect: 'auto' (default) opens a WebSocket and, with httpUrl, falls back to
   * Server-Sent Events (GET /v1/events, fetch streaming) when the upgrade fails for any
   * reason but the server's own 401, 429 or 503; 'websocket' never falls back; 'sse'
   * uses only the HTTP port (needs httpUrl). docs/protocol.md §14.
   */
  transport?: 'auto' | 'websocket' | 'sse'
  /** The user's JWT. Required unless refreshToken is given. */
  token?: string
  /** Called for a fresh token before every reconnect, and after an HTTP 401. Without it, an expired token ends the client. */
  refreshToken?: () => string | Promise<string>
  /** The HTTP API base (http://host:port): sync after every (re)connect, pulls while disconnected. Without it, tracked groups are caught up by pulls. */
  httpUrl?: string
  /** The WebSocket constructor; default globalThis.WebSocket (pass npm ws in Node). */
  WebSocket?: WebSocketConstructor | (new (...args: any[]) => any)
  /** {gid: last delivered seq} of an earlier session (client.cursors()): tracked and caught up from the start. */
  cursors?: Record<number, number>
  /** Groups found by sync and not tracked yet start at last_seq (only new messages) instead of last_read_seq. */
  skipUnread?: boolean
  /** The wait for each request's answer (ms); a send that times out is retried under the same id. Default 10000. */
  requestTimeoutMs?: number
  /** The wait for the hello frame after dialing (ms). Default 10000. */
  handshakeTimeoutMs?: number
  /** Heartbeat interval (ms); 0 = the server's heartbeat_s. A connection silent for a whole interval after a ping is dropped. */
  heartbeatMs?: number
  /** Retries of a retryable send, pull or sync failure after the first attempt (an HTTP request whose connection was cut counts). Default 10; 0 = none. */
  maxRetries?: number
  /** The longest retry_after_ms a send waits out; a longer hint rejects at once. Default 30000. */
  maxRetryAfterMs?: number
  /** Sends outstanding at once (waiting for a connection or an ack); one more rejects with 'queue_full'. Default 1000. */
  maxQueuedSends?: number
  /** The most messages one pull() returns. Default 10000. */
  maxPullRange?: number
  /** Reconnect attempts in a row before the client gives up ('close' with an error). Default Infinity. */
  maxReconnectAttempts?: number
  /** A connection that lived this long resets the backoff (ms). Default 10000. */
  stableAfterMs?: number
  /** Pages of GET /v1/sync followed at most (1000 groups each). Default 1000. */
  maxSyncPages?: number
}

export interface StateEvent {
  state: 'connecting' | 'connected' | 'disconnected' | 'reconnecting' | 'closed'
  hello?: Hello
  code?: number
  reason?: string
  attempt?: number
  delayMs?: number
  error?: FanfareError
}
export interface DegradedEvent {
  /** The group whose own level changed; 0 for the node. */
  gid: number
  /** That scope's level (0-4). */
  level: number
  /** The level in effect for gid: the higher of the node's and the group's. */
  effective: number
  /** The node's level. */
  node: number
}
/** A presence frame: a group's online count and, in small groups, who came and went (docs/protocol.md §4.16). */
export interface PresenceEvent {
  gid: number
  /** Distinct members online now (cluster-wide in cluster mode). */
  online: number
  /** When the count was taken, Unix ms. */
  ts: number
  /** Members who came online since the group's previous presence event (small groups only). */
  joined: string[]
  /** Members who went offline since then (small groups only). */
  left: string[]
  /** The lists are incomplete (cut, or shed under load): re-read onlineMembers() if you show one. */
  more: boolean
}
/** One page of GET /v1/groups/{gid}/online (docs/protocol.md §8.6). */
export interface OnlinePage {
  gid: number
  online: number
  ts: number
  /** False for groups above the server's list threshold: the count only. */
  listed: boolean
  /** Online members in uid order after the cursor. */
  members: string[]
  /** The cursor of the next page; '' on the last page. */
  nextCursor: string
}
export interface ClientEvents {
  message: Message
  state: StateEvent
  degraded: DegradedEvent
  presence: PresenceEvent
  resync: { gid: number; lastSeq: number }
  skipped: { gid: number; from: number; to: number }
  group_lost: { gid: number; error: FanfareError }
  error: FanfareError | Error
  frame: { type: string; [k: string]: unknown }
  close: { error?: FanfareError }
}

export interface ClientStats {
  delivered: number
  pulled: number
  duplicates: number
  gaps: number
  pulls: number
  overflow: number
  reconnects: number
  sends: number
  retries: number
  outstandingSends: number
}

export interface SendOptions {
  /** A client message id of your own (1-128 bytes): retries reuse it, also across app restarts. */
  id?: string
  /** 'text' (default) or 'at_all'. */
  kind?: 'text' | 'at_all'
  signal?: AbortSignal
}

export declare class Emitter<E> {
  on<K extends keyof E>(event: K, fn: (arg: E[K]) => void): () => void
  once<K extends keyof E>(event: K, fn: (arg: E[K]) => void): () => void
  off<K extends keyof E>(event: K, fn?: (arg: E[K]) => void): this
  listenerCount<K extends keyof E>(event: K): number
}

export declare class Client extends Emitter<ClientEvents> {
  constructor(options: ConnectOptions)
  readonly hello: Hello | null
  readonly uid: string
  readonly connected: boolean
  /** The transport of the current connection; '' while disconnected. */
  readonly transport: 'websocket' | 'sse' | ''
  readonly state: StateEvent['state']
  readonly options: Required<DeliveryOptions> & Record<string, unknown>
  send(gid: number, body: unknown, opts?: SendOptions): Promise<Ack>
  pull(gid: number, fromSeq?: number, toSeq?: number, opts?: { signal?: AbortSignal }): Promise<Page>
  sync(opts?: { signal?: AbortSignal }): Promise<SyncGroup[]>
  track(gid: number, afterSeq?: number): void
  untrack(gid: number): void
  read(gid: number, seq: number): void
  ping(opts?: { signal?: AbortSignal }): Promise<number>
  level(gid?: number): number
  levels(): { node: number; groups: Record<number, number> }
  /** The latest presence event of gid; undefined before the first. */
  online(gid: number): PresenceEvent | undefined
  /** One page of gid's online members (members only; needs httpUrl). */
  onlineMembers(gid: number, opts?: { cursor?: string; limit?: number; signal?: AbortSignal }): Promise<OnlinePage>
  /** Every page of gid's online members. */
  allOnlineMembers(gid: number, opts?: { signal?: AbortSignal }): Promise<{ online: number; listed: boolean; members: string[] }>
  cursors(): Record<number, number>
  stats(): ClientStats
  reconnect(): void
  close(): Promise<void>
}

export declare function connect(options: ConnectOptions): Promise<Client>
export declare const clientDefaults: Readonly<Required<DeliveryOptions> & Record<string, number>>

/** The queue frame: the user's place, as the server sends it. */
export interface QueueFrame {
  type: 'queue'
  room: string
  /** scheduled: the room has not started (starts_at); no position yet. */
  status: 'waiting' | 'paused' | 'scheduled'
  /** Absent while scheduled. */
  position: number
  ahead: number
  total: number
  /** Estimated wait in whole seconds; absent while paused or scheduled. */
  eta_s?: number
  vip_ahead_notice: boolean
  local?: boolean
  /** While scheduled: the start, Unix ms, and the seconds until it by the server's clock. */
  starts_at?: number
  starts_in_s?: number
}
/** The granted frame: admitted. */
export interface GrantedFrame {
  type: 'granted'
  room: string
  access_token: string
  /** The token's exp, Unix ms. */
  expires_at: number
  /** Where a room with a site sends the user: its target_url, with the token in the query when token_in is "query". */
  redirect_url?: string
}
/** The rejected frame; the room ends. */
export interface RejectedFrame {
  type: 'rejected'
  room: string
  code: 'room_full' | 'room_closed' | 'rate_limited' | string
  retry_after_ms: number
}

export interface RoomOptions {
  /** The node's socket: ws://host:port, ws://host:port/ws or ws://host:port/rooms/{room}/ws. Optional with httpUrl (the room then polls). */
  url?: string
  /** The room's name (1-64 of [A-Za-z0-9_.-]). */
  room: string
  /** The user token: on the socket as ?token=, on POST enter as Authorization: Bearer. */
  token?: string
  refreshToken?: () => string | Promise<string>
  /** A ticket from an earlier enter: the socket's credential (?ticket=), and sent on the HTTP routes (X-Fanfare-Ticket). */
  ticket?: string
  /** The HTTP API, http(s)://host:port: enter over HTTP first (a ticket; in browsers also its cookie), then wait on the socket with it, or poll status when the socket cannot be opened. */
  httpUrl?: string
  /** With httpUrl: failed socket dials in a row before the room polls instead (a refused upgrade at once). Default 2. */
  pollFallbackAfter?: number
  /** Bounds of the server's poll_after_ms. Defaults 500 and 30000. */
  minPollMs?: number
  maxPollMs?: number
  /** The wait for each HTTP answer (ms). Default 10000. */
  requestTimeoutMs?: number
  WebSocket?: WebSocketConstructor | (new (...args: any[]) => any)
  /** Ping interval (ms); a socket silent for a whole interval after a ping is redialed. Default 30000. */
  heartbeatMs?: number
  backoffMinMs?: number
  backoffMaxMs?: number
  /** Redial attempts in a row before the room gives up. Default Infinity. */
  maxReconnectAttempts?: number
  stableAfterMs?: number
}

export interface RoomEvents {
  queue: QueueFrame
  granted: GrantedFrame
  rejected: RejectedFrame
  state: { state: 'connecting' | 'open' | 'disconnected' | 'reconnecting' | 'polling' | 'closed'; code?: number; reason?: string; attempt?: number; delayMs?: number; error?: FanfareError }
  error: FanfareError
  close: { error?: FanfareError }
}

export declare class Room extends Emitter<RoomEvents> {
  constructor(options: RoomOptions)
  readonly room: string
  /** The latest queue frame, null before the first. */
  readonly last: QueueFrame | null
  readonly closed: boolean
  /** The ticket once entered over HTTP (or the ticket option); '' before. */
  readonly ticket: string
  /** How the room waits: 'socket', 'poll', or null before either. */
  readonly transport: 'socket' | 'poll' | null
  /** Resolves with the granted frame, or rejects with the rejection (code room_full / room_closed, retryAfterMs) or 'closed'. */
  granted(): Promise<GrantedFrame>
  /** Stop waiting (a waiting user keeps its place for the room's grace; an admitted user's session ends). */
  close(): void
  /** Give the place up now: POST /v1/rooms/{room}/leave with the ticket (entered over HTTP), then close(). */
  leave(): Promise<void>
}

/** A room's public site document (GET /v1/rooms/{room}/site). */
export interface RoomSiteDocument {
  room: string
  state: 'open' | 'closed' | string
  phase?: 'scheduled' | 'open' | 'ended' | string
  /** Unix ms, absent when unset. */
  starts_at?: number
  ends_at?: number
  site: {
    title?: string
    text?: string
    logo_url?: string
    colors?: { background?: string; text?: string; accent?: string }
    strings?: Record<string, Record<string, string>>
    default_lang?: string
    anonymous?: boolean
  }
  /** The answer's Date header, Unix ms (not enumerable). */
  readonly serverDate?: number
}

export declare function enterRoom(options: RoomOptions): Room
/** Fetches a room's site document; rejects not_found for an unknown room. */
export declare function roomSite(options: { httpUrl: string; room: string; requestTimeoutMs?: number }): Promise<RoomSiteDocument>
export declare function roomUrl(url: string, room: string): string
export declare const roomDefaults: Readonly<Record<string, number>>

/** The delivery engine (exported for tests and custom transports). */
export declare class Tracker {
  constructor(opts: {
    deliver: (m: Message) => void
    pull: (gid: number, from: number, to: number) => Promise<{ messages: Array<Omit<Message, 'pulled'>>; last_seq: number; next_seq?: number }>
    emit: (event: string, data: unknown) => void
    /** Sync is available: a group first seen by a push or a resync after the connect sync waits for its entry (null: not a member) and starts at its last_read_seq. */
    place?: ((gid: number) => Promise<{ gid: number; last_seq: number; last_read_seq: number } | null>) | null
    options?: DeliveryOptions
    now?: () => number
    random?: () => number
  })
  readonly stats: Omit<ClientStats, 'reconnects' | 'sends' | 'retries' | 'outstandingSends'>
  online: boolean
  /** On hello; syncing: a sync follows, and groups first seen by a push before it answers wait for it (endSync). */
  connected(opts?: { syncing?: boolean }): void
  endSync(): void
  disconnected(): void
  resume(opts?: { probe?: boolean }): void
  close(): void
  onMsg(f: object): void
  onBatch(f: object): void
  onSummary(f: object): void
  onResync(f: object): void
  onDegraded(f: object): void
  level(gid: number): number
  track(gid: number, afterSeq?: number): void
  untrack(gid: number): void
  applySync(groups: SyncGroup[], opts?: { skipUnread?: boolean }): void
  cursors(): Record<number, number>
  pendingCount(gid: number): number
  idle(): boolean
}
export declare const trackerDefaults: Readonly<Required<DeliveryOptions>>

/** The jittered backoff: a uniform draw in [d/2, d], d = min(max, min * 2^n). */
export declare function backoff(minMs: number, maxMs: number, n: number, random?: () => number): number
