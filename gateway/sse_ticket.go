// This file holds event-stream tickets (docs/protocol.md §14.2): a browser's
// EventSource cannot send an Authorization header, so a client trades its
// bearer token for a ticket that opens one stream and nothing else.

package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"sync"
	"time"

	"github.com/fanfare-im/fanfare/gateway/auth"
)

// A ticket is base64url(payload) "." base64url(mac), where payload is
//
//	version (1) | not after, Unix s (8) | token expiry, Unix s, 0 none (8) |
//	tier (1) | nonce (12) | uid (1..auth.MaxUIDBytes)
//
// and mac the first 16 bytes of HMAC-SHA256 over "fanfare/sse-ticket/v1"
// and the payload, keyed by a key derived from the node's ticket secret
// (fanfared: the JWT secret, so every node of a cluster accepts the
// tickets of the others). A ticket is not a token: no other route takes
// it, and it cannot be turned back into one.
const (
	sseTicketVersion = 1
	ticketNonce      = 12
	ticketFixed      = 1 + 8 + 8 + 1 + ticketNonce
	ticketMAC        = 16
	ticketDomain     = "fanfare/sse-ticket/v1"
)

// errTicket is every refusal of a ticket: a client learns only that it
// must ask for a new one.
var errTicket = &clientError{base: ErrUnauthorized, msg: "invalid, expired or used ticket; ask POST /v1/events/ticket for a new one"}

// errTicketsFull: the replay cache is at its bound.
var errTicketsFull = RetryLater(&clientError{base: ErrNotReady, msg: "too many tickets in use; try again"}, DefaultRetryAfter)

// tickets mints and redeems tickets. Redeemed nonces are kept until their
// ticket expires, so a ticket opens one stream on this node (a ticket
// replayed on another node of a cluster within its lifetime is not seen
// there: keep the lifetime short). The cache holds at most max nonces.
type tickets struct {
	key []byte
	ttl time.Duration
	max int
	now func() time.Time

	mu   sync.Mutex
	used map[[ticketNonce]byte]int64 // nonce -> not after, Unix s
}

func newTickets(secret []byte, ttl time.Duration, max int) *tickets {
	if len(secret) == 0 {
		// No shared secret: tickets of this process only.
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ticketDomain))
	return &tickets{key: m.Sum(nil), ttl: ttl, max: max, now: time.Now, used: make(map[[ticketNonce]byte]int64)}
}

func (t *tickets) mac(payload []byte) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte(ticketDomain))
	m.Write(payload)
	return m.Sum(nil)[:ticketMAC]
}

// mint returns a ticket for c and when it stops being accepted.
func (t *tickets) mint(c auth.Claims) (string, time.Time) {
	notAfter := t.now().Add(t.ttl)
	p := make([]byte, 0, ticketFixed+len(c.UID))
	p = append(p, sseTicketVersion)
	p = binary.BigEndian.AppendUint64(p, uint64(notAfter.Unix()))
	var exp int64
	if !c.Expires.IsZero() {
		exp = c.Expires.Unix()
	}
	p = binary.BigEndian.AppendUint64(p, uint64(exp))
	p = append(p, byte(c.Tier))
	var nonce [ticketNonce]byte
	_, _ = rand.Read(nonce[:])
	p = append(p, nonce[:]...)
	p = append(p, c.UID...)
	enc := base64.RawURLEncoding
	return enc.EncodeToString(p) + "." + enc.EncodeToString(t.mac(p)), notAfter
}

// maxTicketLen bounds a ticket's text before it is decoded.
var maxTicketLen = base64.RawURLEncoding.EncodedLen(ticketFixed+auth.MaxUIDBytes) + 1 + base64.RawURLEncoding.EncodedLen(ticketMAC)

// redeem checks s and marks it used: a ticket opens one stream.
func (t *tickets) redeem(s string) (auth.Claims, error) {
	if len(s) > maxTicketLen {
		return auth.Claims{}, errTicket
	}
	dot := -1
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			dot = i
			break
		}
	}
	if dot < 0 {
		return auth.Claims{}, errTicket
	}
	enc := base64.RawURLEncoding
	p, err1 := enc.DecodeString(s[:dot])
	mac, err2 := enc.DecodeString(s[dot+1:])
	if err1 != nil || err2 != nil || len(p) <= ticketFixed || p[0] != sseTicketVersion || !hmac.Equal(mac, t.mac(p)) {
		return auth.Claims{}, errTicket
	}
	now := t.now()
	notAfter := int64(binary.BigEndian.Uint64(p[1:9]))
	exp := int64(binary.BigEndian.Uint64(p[9:17]))
	if now.Unix() > notAfter || (exp != 0 && now.Unix() >= exp) {
		return auth.Claims{}, errTicket
	}
	var nonce [ticketNonce]byte
	copy(nonce[:], p[18:18+ticketNonce])
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.used[nonce]; ok {
		return auth.Claims{}, errTicket
	}
	if len(t.used) >= t.max {
		t.sweepLocked(now)
		if len(t.used) >= t.max {
			return auth.Claims{}, errTicketsFull
		}
	}
	t.used[nonce] = notAfter
	c := auth.Claims{UID: string(p[ticketFixed:]), Tier: int(p[17])}
	if exp != 0 {
		c.Expires = time.Unix(exp, 0)
	}
	return c, nil
}

// sweep forgets the nonces of expired tickets.
func (t *tickets) sweep() {
	t.mu.Lock()
	t.sweepLocked(t.now())
	t.mu.Unlock()
}

func (t *tickets) sweepLocked(now time.Time) {
	for n, notAfter := range t.used {
		if now.Unix() > notAfter {
			delete(t.used, n)
		}
	}
}
