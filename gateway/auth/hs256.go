package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
)

// The HS256 fast path. golang-jwt spends about 4 µs and 40 allocations on
// an HS256 token (a map for the header, reflection over the claims, a new
// HMAC per call); at the upgrade rates a reconnect storm brings (20,000/s
// on one core leaves 50 µs for the whole handshake) that is a tenth of the
// budget. fastHS256 verifies the tokens fanfare's own Signer and usual
// issuers mint (compact JSON, no escapes, integer times, aud a string)
// with a pooled HMAC and a scanner that reads only the claims fanfare
// checks, and decides three ways:
//
//   - fastOK: the signature and every claim check pass exactly as the
//     golang-jwt parser configured by NewVerifier would pass them;
//   - fastBadSig: the header is {"alg":"HS256",...} and the signature does
//     not match. golang-jwt refuses such a token whatever its claims (it
//     checks the signature before the claims), so the refusal is the same;
//   - fastUnsure: anything else (another algorithm, escapes, duplicate or
//     case-variant claim names, nested values, fractional or quoted times,
//     a claim check that fails): Verify asks golang-jwt, which gives the
//     exact outcome and error (an expired token stays ErrExpired).
//
// So the fast path never accepts what golang-jwt refuses and never refuses
// what it accepts; TestFastPathAgrees checks both on generated tokens and
// FuzzFastPath on arbitrary ones.

type fastResult uint8

const (
	fastUnsure fastResult = iota
	fastOK
	fastBadSig
)

// hsState is the per-call scratch of the fast path, pooled per Verifier.
type hsState struct {
	mac hash.Hash
	in  []byte // a segment's or the signing input's bytes
	buf []byte // decoded header, then claims
	sum [sha256.Size]byte
	sig [sha256.Size + 3]byte
}

// hsFast verifies HS256 tokens without golang-jwt (see above).
type hsFast struct {
	pool     sync.Pool
	leeway   time.Duration
	now      func() time.Time
	issuer   string
	audience string
}

func newHSFast(secret []byte, leeway time.Duration, now func() time.Time, issuer, audience string) *hsFast {
	key := append([]byte(nil), secret...)
	f := &hsFast{leeway: leeway, now: now, issuer: issuer, audience: audience}
	f.pool.New = func() any {
		return &hsState{mac: hmac.New(sha256.New, key), in: make([]byte, 0, 512), buf: make([]byte, 0, 512)}
	}
	if f.now == nil {
		f.now = time.Now
	}
	return f
}

// errFastBadSig is the cause of a fastBadSig refusal: golang-jwt's.
var errFastBadSig = fmt.Errorf("%w: %w", jwt.ErrTokenSignatureInvalid, jwt.ErrSignatureInvalid)

// verify returns the claims of token and fastOK, fastBadSig, or
// fastUnsure when golang-jwt must decide.
func (f *hsFast) verify(token string) (Claims, fastResult) {
	h, rest, ok := strings.Cut(token, ".")
	if !ok {
		return Claims{}, fastUnsure
	}
	p, s, ok := strings.Cut(rest, ".")
	if !ok || strings.IndexByte(s, '.') >= 0 {
		return Claims{}, fastUnsure
	}
	st := f.pool.Get().(*hsState)
	defer f.pool.Put(st)
	// Header: {"alg":"HS256"} plus simple members.
	if !st.decode(h) || !headerIsHS256(st.buf) {
		return Claims{}, fastUnsure
	}
	// A signature longer than 32 bytes encode to: golang-jwt refuses it
	// too (a length mismatch), but let it say why.
	if len(s) > base64.RawURLEncoding.EncodedLen(sha256.Size) {
		return Claims{}, fastUnsure
	}
	st.in = append(st.in[:0], s...)
	n, err := base64.RawURLEncoding.Decode(st.sig[:], st.in)
	if err != nil {
		return Claims{}, fastUnsure
	}
	// The signing input is the first two segments as they are.
	st.in = append(st.in[:0], token[:len(h)+1+len(p)]...)
	st.mac.Reset()
	_, _ = st.mac.Write(st.in)
	if !hmac.Equal(st.sig[:n], st.mac.Sum(st.sum[:0])) {
		return Claims{}, fastBadSig
	}
	if !st.decode(p) {
		return Claims{}, fastUnsure
	}
	var c fastClaims
	if !c.scan(st.buf) || !f.valid(&c) {
		return Claims{}, fastUnsure
	}
	return Claims{UID: string(c.sub), Tier: c.tier, Expires: time.Unix(c.exp, 0)}, fastOK
}

// valid applies the checks of golang-jwt's validator as NewVerifier
// configures it (exp required, iat checked, leeway, iss, aud) and the
// claims' own (sub, lvl).
func (f *hsFast) valid(c *fastClaims) bool {
	now := f.now()
	if !c.has(claimExp) || !now.Before(time.Unix(c.exp, 0).Add(f.leeway)) {
		return false
	}
	if c.has(claimNbf) && now.Before(time.Unix(c.nbf, 0).Add(-f.leeway)) {
		return false
	}
	if c.has(claimIat) && now.Before(time.Unix(c.iat, 0).Add(-f.leeway)) {
		return false
	}
	if f.audience != "" && (!c.has(claimAud) || string(c.aud) != f.audience) {
		return false
	}
	if f.issuer != "" && (!c.has(claimIss) || string(c.iss) != f.issuer) {
		return false
	}
	return validUIDBytes(c.sub)
}

// decode base64url-decodes seg into st.buf, as golang-jwt's DecodeSegment
// does with its default options.
func (st *hsState) decode(seg string) bool {
	st.in = append(st.in[:0], seg...)
	n := base64.RawURLEncoding.DecodedLen(len(seg))
	if cap(st.buf) < n {
		st.buf = make([]byte, 0, n)
	}
	m, err := base64.RawURLEncoding.Decode(st.buf[:n], st.in)
	st.buf = st.buf[:m]
	return err == nil
}

// validUIDBytes is validUID for the bytes of a JSON string without
// escapes that are valid UTF-8 (the scanner checked both).
func validUIDBytes(b []byte) bool {
	if len(b) == 0 || len(b) > MaxUIDBytes {
		return false
	}
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			if b[i] < 0x20 || b[i] == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r >= 0x80 && r <= 0x9f { // C1 controls: unicode.IsControl
			return false
		}
		i += size
	}
	return true
}

// Claim names the scanner reads: RegisteredClaims' and lvl. encoding/json
// matches them case-insensitively, so a case variant is not simple.
const (
	claimSub = 1 << iota
	claimExp
	claimNbf
	claimIat
	claimIss
	claimAud
	claimJti
	claimLvl
)

var claimNames = [...]struct {
	name string
	bit  int
}{{"sub", claimSub}, {"exp", claimExp}, {"nbf", claimNbf}, {"iat", claimIat},
	{"iss", claimIss}, {"aud", claimAud}, {"jti", claimJti}, {"lvl", claimLvl}}

type fastClaims struct {
	seen          int
	sub, iss, aud []byte
	exp, nbf, iat int64
	tier          int
}

func (c *fastClaims) has(bit int) bool { return c.seen&bit != 0 }

// scan reads a claims object. It returns false for anything it does not
// decide exactly like encoding/json into tokenClaims.
func (c *fastClaims) scan(b []byte) bool {
	return scanObject(b, func(key []byte, v jsonValue) bool {
		bit := 0
		for _, n := range claimNames {
			if len(key) == len(n.name) && asciiEqualFold(key, n.name) {
				if string(key) != n.name {
					return false // a case variant: encoding/json would take it
				}
				bit = n.bit
				break
			}
		}
		if bit == 0 {
			return true // unknown claims are ignored
		}
		if c.seen&bit != 0 {
			return false // duplicate: the last one wins in encoding/json
		}
		c.seen |= bit
		var ok bool
		switch bit {
		case claimSub:
			c.sub, ok = v.str()
		case claimIss:
			c.iss, ok = v.str()
		case claimAud:
			c.aud, ok = v.str()
		case claimJti:
			_, ok = v.str()
		case claimExp:
			c.exp, ok = v.integer()
		case claimNbf:
			c.nbf, ok = v.integer()
		case claimIat:
			c.iat, ok = v.integer()
		case claimLvl:
			switch {
			case v.kind == 'n' && len(v.raw) == 1 && v.raw[0] <= '0'+MaxTier:
				c.tier, ok = int(v.raw[0]-'0'), true
			case v.kind == 'l' && string(v.raw) == "null":
				ok = true
			}
		}
		return ok
	}) && c.has(claimSub)
}

func asciiEqualFold(b []byte, lower string) bool {
	for i := range b {
		ch := b[i]
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		if ch != lower[i] {
			return false
		}
	}
	return true
}

// headerIsHS256 reports whether b is a JSON object whose only alg member
// is "HS256" and whose other members are simple.
func headerIsHS256(b []byte) bool {
	alg := 0
	return scanObject(b, func(key []byte, v jsonValue) bool {
		if string(key) != "alg" {
			return true
		}
		alg++
		s, ok := v.str()
		return ok && string(s) == "HS256"
	}) && alg == 1
}

// jsonValue is one scalar member value: kind 's' string (raw without the
// quotes, no escapes), 'n' number (raw literal, valid JSON), 'l' literal
// (true, false, null).
type jsonValue struct {
	kind byte
	raw  []byte
}

// str returns a string value that encoding/json would decode to the same
// bytes: valid UTF-8 (invalid bytes would become U+FFFD).
func (v jsonValue) str() ([]byte, bool) {
	return v.raw, v.kind == 's' && utf8.Valid(v.raw)
}

// integer returns a number without fraction or exponent of at most 15
// digits, which float64 (golang-jwt's NumericDate) holds exactly.
func (v jsonValue) integer() (int64, bool) {
	if v.kind != 'n' {
		return 0, false
	}
	b, neg := v.raw, false
	if b[0] == '-' {
		b, neg = b[1:], true
	}
	if len(b) == 0 || len(b) > 15 {
		return 0, false
	}
	var n int64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + int64(ch-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// scanObject walks a JSON object of scalar members, calling member for
// each. It returns false when b is not such an object (nested values,
// escapes, anything after the closing brace but whitespace) or when member
// does.
func scanObject(b []byte, member func(key []byte, v jsonValue) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		key, j, ok := scanString(b, i)
		if !ok {
			return false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		var v jsonValue
		if v, i, ok = scanScalar(b, i); !ok || !member(key, v) {
			return false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString reads a string without escapes or control characters at
// b[i] and returns its content and the index after it.
func scanString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch ch := b[j]; {
		case ch == '"':
			return b[i+1 : j], j + 1, true
		case ch == '\\' || ch < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

func scanScalar(b []byte, i int) (jsonValue, int, bool) {
	if i >= len(b) {
		return jsonValue{}, 0, false
	}
	switch ch := b[i]; {
	case ch == '"':
		s, j, ok := scanString(b, i)
		return jsonValue{kind: 's', raw: s}, j, ok
	case ch == '-' || ('0' <= ch && ch <= '9'):
		j, ok := scanNumber(b, i)
		if !ok {
			return jsonValue{}, 0, false
		}
		return jsonValue{kind: 'n', raw: b[i:j]}, j, true
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
			return jsonValue{kind: 'l', raw: b[i : i+len(lit)]}, i + len(lit), true
		}
	}
	return jsonValue{}, 0, false
}

// scanNumber reads a JSON number (RFC 8259 §6) at b[i].
func scanNumber(b []byte, i int) (int, bool) {
	digits := func(j int) int {
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
		return j
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(i)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}
