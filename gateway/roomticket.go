package gateway

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fanfare-im/fanfare/gateway/auth"
)

// Room tickets (docs/protocol.md §8.7) are the identity of a visitor of
// a waiting room on the HTTP polling path and the room socket's
// ?ticket= credential: opaque to clients, made by the server, an HMAC-SHA256
// over (room, uid, tier, expiry). Any node holding the same key accepts
// them, so a visitor can poll one node and wait on another's socket.
//
// Layout: "ft1." + base64url(payload) + "." + base64url(HMAC(key, "ft1." +
// base64url(payload))), payload = tier (1 byte) | expiry (Unix s, 8 bytes
// big-endian) | len(room) (1 byte) | room | uid; the tier byte's top bit
// marks an anonymous visitor's ticket.

// Ticket bounds and defaults.
const (
	// DefaultTicketTTL is a ticket's lifetime; answers renew it once half is
	// used (RoomsConfig.TicketTTL).
	DefaultTicketTTL = time.Hour
	// MinTicketKeyBytes is the shortest ticket key accepted.
	MinTicketKeyBytes = 32
	// MaxTicketBytes bounds a ticket before it is decoded: room 64 and
	// uid 128 bytes fit with room to spare.
	MaxTicketBytes = 512
	// AnonymousPrefix starts the uid the server mints for an anonymous
	// visitor, followed by 32 hex digits (128 random bits).
	AnonymousPrefix = "anon:"

	ticketVersion = "ft1."
	anonBit       = 0x80
)

// ErrBadTicket is any ticket that does not verify: malformed, forged,
// expired or for another room. It maps to 401 unauthorized.
var ErrBadTicket = fmt.Errorf("%w: invalid room ticket", ErrUnauthorized)

// DeriveTicketKey derives the ticket key from another server secret
// (HKDF-SHA256 with its own label), so that one configured secret serves
// two purposes without a ticket ever being a valid signature of the other.
func DeriveTicketKey(secret []byte) ([]byte, error) {
	if len(secret) < 16 {
		return nil, errors.New("gateway: ticket key source shorter than 16 bytes")
	}
	return hkdf.Key(sha256.New, secret, nil, "fanfare room ticket v1", 32)
}

// RoomTicket is what a verified ticket names.
type RoomTicket struct {
	Room string
	UID  string
	Tier int
	// Anonymous: the uid was minted by the server (site.anonymous).
	Anonymous bool
	Expires   time.Time
}

// RoomTickets signs and verifies room tickets with one key.
type RoomTickets struct {
	key []byte
	ttl time.Duration
	// macs pools keyed HMAC states: hmac.New costs two hashes of the
	// key, more than the MAC of a ticket itself (every poll checks one).
	macs sync.Pool
}

// NewRoomTickets returns a RoomTickets for key (at least MinTicketKeyBytes)
// issuing tickets valid for ttl (0 = DefaultTicketTTL).
func NewRoomTickets(key []byte, ttl time.Duration) (*RoomTickets, error) {
	if len(key) < MinTicketKeyBytes {
		return nil, fmt.Errorf("gateway: ticket key is %d bytes, want at least %d", len(key), MinTicketKeyBytes)
	}
	if ttl == 0 {
		ttl = DefaultTicketTTL
	}
	if ttl < time.Minute || ttl > 30*24*time.Hour {
		return nil, fmt.Errorf("gateway: ticket lifetime %v out of range 1m..720h", ttl)
	}
	rt := &RoomTickets{key: append([]byte(nil), key...), ttl: ttl}
	rt.macs.New = func() any { return hmac.New(sha256.New, rt.key) }
	return rt, nil
}

// TTL is the lifetime of the tickets Sign makes.
func (rt *RoomTickets) TTL() time.Duration { return rt.ttl }

// Sign returns a ticket for t's room, uid, tier and anonymity, valid
// until now+TTL (t.Expires is not read).
func (rt *RoomTickets) Sign(t RoomTicket, now time.Time) string {
	room, uid := t.Room, t.UID
	p := make([]byte, 0, 10+len(room)+len(uid))
	tb := byte(t.Tier)
	if t.Anonymous {
		tb |= anonBit
	}
	p = append(p, tb)
	p = binary.BigEndian.AppendUint64(p, uint64(now.Add(rt.ttl).Unix()))
	p = append(p, byte(len(room)))
	p = append(append(p, room...), uid...)
	enc := base64.RawURLEncoding
	out := make([]byte, 0, len(ticketVersion)+enc.EncodedLen(len(p))+1+enc.EncodedLen(sha256.Size))
	out = append(out, ticketVersion...)
	out = enc.AppendEncode(out, p)
	var mac [sha256.Size]byte
	rt.mac(mac[:0], out)
	out = append(out, '.')
	out = enc.AppendEncode(out, mac[:])
	return string(out)
}

// mac appends the HMAC of signed to dst.
func (rt *RoomTickets) mac(dst, signed []byte) []byte {
	h := rt.macs.Get().(hash.Hash)
	h.Reset()
	h.Write(signed)
	dst = h.Sum(dst)
	rt.macs.Put(h)
	return dst
}

// Verify checks tok (its MAC first, in constant time) and that it names
// room and has not expired at now. Every failure is ErrBadTicket.
func (rt *RoomTickets) Verify(tok, room string, now time.Time) (RoomTicket, error) {
	if len(tok) > MaxTicketBytes || len(tok) < len(ticketVersion) || tok[:len(ticketVersion)] != ticketVersion {
		return RoomTicket{}, ErrBadTicket
	}
	dot := -1
	for i := len(tok) - 1; i >= len(ticketVersion); i-- {
		if tok[i] == '.' {
			dot = i
			break
		}
	}
	if dot < 0 {
		return RoomTicket{}, ErrBadTicket
	}
	enc := base64.RawURLEncoding
	var macBuf, wantBuf [sha256.Size + 3]byte
	var buf [MaxTicketBytes]byte
	b := append(buf[:0], tok...)
	mac, err := enc.AppendDecode(macBuf[:0], b[dot+1:])
	if err != nil || !hmac.Equal(mac, rt.mac(wantBuf[:0], b[:dot])) {
		return RoomTicket{}, ErrBadTicket
	}
	var pbuf [MaxTicketBytes]byte
	p, err := enc.AppendDecode(pbuf[:0], b[len(ticketVersion):dot])
	if err != nil || len(p) < 10 {
		return RoomTicket{}, ErrBadTicket
	}
	t := RoomTicket{Tier: int(p[0] &^ anonBit), Anonymous: p[0]&anonBit != 0, Expires: time.Unix(int64(binary.BigEndian.Uint64(p[1:9])), 0)}
	n := int(p[9])
	if len(p) < 10+n || t.Tier > auth.MaxTier {
		return RoomTicket{}, ErrBadTicket
	}
	t.Room, t.UID = string(p[10:10+n]), string(p[10+n:])
	if t.Room != room || t.UID == "" || !utf8.ValidString(t.UID) || !now.Before(t.Expires) {
		return RoomTicket{}, ErrBadTicket
	}
	return t, nil
}

// newAnonymousUID mints an anonymous visitor's uid: AnonymousPrefix and
// 128 random bits in hex.
func newAnonymousUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return AnonymousPrefix + hex.EncodeToString(b[:])
}
