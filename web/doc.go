// Package web serves fanfare's browser pages from the binary: the demo at
// /demo/ (a chat between tabs, levels, catch-up, a waiting room), the
// admin console at /admin/, the hosted waiting-room page at
// /rooms/{room}/ (rooms.go: what a site sends its visitors to, themed by
// the room's site object; an unknown room is a 404 page), and the
// JavaScript SDK at /sdk/. The pages
// are plain ES modules, HTML and CSS embedded with go:embed: there is no
// front-end build step, and nothing is loaded from outside the node.
//
// Invariants: every file answers with an explicit Content-Type, an ETag
// (its SHA-256), Cache-Control no-cache (a browser revalidates, so a new
// binary's pages are never mixed with an old one's), X-Content-Type-Options
// nosniff and a Content-Security-Policy that allows only the node's own
// scripts, styles and connections (frame-ancestors 'none'). A page that is
// turned off is not registered at all: its paths answer the API's JSON 404.
//
// The demo's token route (POST /demo/token) exists only when Config.Dev is
// set, which cmd/fanfared does in embedded mode with the demo on: it signs
// short-lived tokens for uids in the "demo-" namespace only, joins them to
// the demo's own groups only, is rate limited (Dev.Rate, Dev.Burst) and
// bounds each demo group's members (Dev.MaxMembers).
//
// Goroutines: none of its own; handlers run on the API's server.
package web
