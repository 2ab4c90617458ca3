// Package wire is fanfare's protocol v1: the WebSocket frames and HTTP API
// bodies of docs/protocol.md, with their codec. It imports only the standard
// library because the Go client SDK (package client) shares it with the
// server.
//
// # Encoding
//
// Server frames on the hot path are encoded with append-style functions
// (AppendMsg, AppendBatch, AppendAck, ...) that write into a caller-owned
// buffer and allocate nothing when the buffer has room. A frame is encoded
// once per group batch and the same bytes go to every recipient. String
// fields are escaped per RFC 8259 (invalid UTF-8 becomes U+FFFD, U+2028 and
// U+2029 are escaped for JavaScript consumers); message bodies are raw JSON
// inserted verbatim, so they must have been validated at ingress, which
// DecodeClient and DecodeSendRequest do.
//
// The struct types carry a frame's fields with JSON tags for encoding/json,
// but never the "type" discriminator: json.Marshal of a frame struct gives
// the object without "type" (what batch, summary and the HTTP API embed);
// use the Append functions to produce a whole frame.
//
// # Decoding
//
// DecodeClient decodes one client frame (send, read, pull, ping) strictly:
// the input must be one valid JSON object in UTF-8, nested at most MaxDepth
// deep, without duplicate known keys and without \u escapes of unpaired
// UTF-16 surrogates (which would be stored and relayed as is); known fields must have the right JSON
// type and range; unknown fields are ignored so that clients may add fields
// without breaking older servers. It allocates only the id string; the body
// of a send aliases the input. Every failure is a *DecodeError carrying the
// request's id when it could be read, so the server can echo it.
//
// DecodeServer decodes any server frame for clients; it is lenient about
// unknown fields and reports unknown frame types with ErrUnknownType so a
// client can skip frames added by newer servers.
//
// # Conventions
//
// Timestamps (ts, expires_at, since) are Unix milliseconds; durations carry
// their unit in the name (heartbeat_s, retry_after_ms, eta_s). gid 0 never
// names a group: where a gid is optional (degraded), 0 means absent.
//
// Package wire has no goroutines and no shared state; every function is
// safe for concurrent use.
package wire
