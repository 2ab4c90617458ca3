// Package gate puts a fanfare waiting room in front of a Go HTTP service:
// an http.Handler middleware that lets through only requests carrying a
// valid access token of one room (the token a user receives in the
// granted frame, docs/protocol.md §6.3, §6.7) and sends everybody else to
// the room's queue page.
//
// A token is accepted when its signature verifies with the configured key
// (an HS256 secret, an Ed25519 public key, or the keys of fanfared's
// published key set GET /v1/rooms/jwks), it has not expired, it was
// issued for the configured room, and, when the application supplies
// Config.User, it names the request's user. The algorithm is fixed by the
// key: a token signed "none", or HS256 with a public key as its secret,
// never verifies (fanout/waitroom/roomtoken).
//
// Where the token comes from, in order: the query parameter TokenName (as
// the room's redirect_url delivers it; the gate then sets its own cookie
// and redirects to the same URL without the parameter, so the token does
// not stay in the address bar, history or Referer), the gate's cookie,
// the header X-Fanfare-Access. A visitor without a valid token is
// redirected (303) to QueueURL with a return parameter: the path and
// query it asked for, on SiteURL's origin when that is set. The gate
// redirects only to QueueURL and to paths of the request's own host
// (never to a "//host" path), so it cannot be made an open redirector.
//
// # Keys fetched by URL
//
// With JWKSURL the key set is fetched at the first request, used for
// JWKSMaxAge (5 min), and fetched again at most once per JWKSMinInterval
// (30 s) when a token names an unknown kid (a key rotation). A failed
// fetch keeps the keys known. Fetches are serialized (fetchMu); lookups
// take keysMu for reading only.
//
// The package imports the standard library and roomtoken only, so a
// service vendors little with it.
package gate
