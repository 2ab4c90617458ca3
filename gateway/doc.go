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
// # Goroutines and locks
//
// API.Serve owns the http.Server goroutine and waits for it before
// returning; net/http runs one goroutine per connection. API holds no
// locks: its mutable state (draining flag, address) is atomic, and routes
// must be registered before serving.
package gateway
