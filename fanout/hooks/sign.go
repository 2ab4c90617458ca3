package hooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Header names of a signed request (docs/protocol.md §13.1).
const (
	// HeaderTimestamp carries the unix time, in seconds, at which the
	// request was signed.
	HeaderTimestamp = "Fanfare-Timestamp"
	// HeaderSignature carries "v1=" and the lowercase hex HMAC-SHA256 of
	// the timestamp, a ".", and the raw request body, keyed with the
	// shared secret.
	HeaderSignature = "Fanfare-Signature"
	// HeaderKind names the request: "before_send" or "events".
	HeaderKind = "Fanfare-Hook"
)

// MinSecretBytes is the shortest secret accepted: a shorter one is a
// guessable key.
const MinSecretBytes = 16

// ErrBadSignature is what Verify returns for a request that is not signed
// with the secret, or not within the replay window.
var ErrBadSignature = errors.New("hooks: bad signature")

// Sign returns the HeaderSignature value for body signed at ts (unix
// seconds) with secret.
func Sign(secret []byte, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	var b [20]byte
	mac.Write(strconv.AppendInt(b[:0], ts, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify checks a request a receiver got: its timestamp must be within
// window of now (either side: a replayed request is refused once it is
// older than window) and its signature must match body under secret (a
// constant-time compare). It is what a receiver written in Go calls; the
// tests of this package and cmd/fanfared use it as receivers would.
func Verify(secret []byte, h http.Header, body []byte, now time.Time, window time.Duration) error {
	tsv := h.Get(HeaderTimestamp)
	ts, err := strconv.ParseInt(tsv, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: no or malformed %s", ErrBadSignature, HeaderTimestamp)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > window || d < -window {
		return fmt.Errorf("%w: timestamp %d outside the replay window", ErrBadSignature, ts)
	}
	want := Sign(secret, ts, body)
	if !hmac.Equal([]byte(h.Get(HeaderSignature)), []byte(want)) {
		return fmt.Errorf("%w: signature does not match", ErrBadSignature)
	}
	return nil
}

// setSigned sets the signature headers of req for body.
func setSigned(req *http.Request, secret []byte, kind string, now time.Time, body []byte) {
	ts := now.Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderKind, kind)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	if len(secret) > 0 {
		req.Header.Set(HeaderSignature, Sign(secret, ts, body))
	}
}
