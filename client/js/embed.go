// Package fanfarejs holds the JavaScript SDK (@fanfare/client) so that a Go
// server can serve it: FS has the ES module sources under src/ and the
// TypeScript declarations index.d.ts, exactly as they are in client/js (no
// build step), e.g. http.FileServerFS(fanfarejs.FS) under /sdk/ gives
// /sdk/src/index.js.
package fanfarejs

import "embed"

// FS holds src/*.js and index.d.ts.
//
//go:embed src/*.js index.d.ts
var FS embed.FS
