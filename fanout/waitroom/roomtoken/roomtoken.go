// Package roomtoken signs and verifies waiting-room access tokens: the JWT
// a user receives in the granted frame and presents to the protected
// service. The service needs only this package and the HS256 secret or the
// Ed25519 public key; it never calls the waiting room.
//
// Claims: sub (uid), room, exp (session end), iat. Verify accepts only the
// algorithm that matches the key it is given (no alg confusion, no "none").
package roomtoken

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Errors.
var (
	// ErrInvalid is returned for any token that does not verify: bad
	// signature, wrong algorithm, expired, malformed or for another room.
	ErrInvalid = errors.New("roomtoken: invalid access token")
	// ErrKey is returned for an unusable key.
	ErrKey = errors.New("roomtoken: unusable key")
)

// MinSecretLen is the shortest HS256 secret accepted.
const MinSecretLen = 32

// Claims are an access token's claims.
type Claims struct {
	Room string `json:"room"`
	jwt.RegisteredClaims
}

// UID is the admitted user (sub).
func (c *Claims) UID() string { return c.Subject }

// Signer signs access tokens.
type Signer struct {
	method jwt.SigningMethod
	key    any
	pub    ed25519.PublicKey // EdDSA only
	kid    string            // EdDSA only
}

// NewHS256 returns a Signer using a shared secret of at least MinSecretLen bytes.
func NewHS256(secret []byte) (*Signer, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("%w: HS256 secret shorter than %d bytes", ErrKey, MinSecretLen)
	}
	return &Signer{method: jwt.SigningMethodHS256, key: append([]byte(nil), secret...)}, nil
}

// NewEdDSA returns a Signer using an Ed25519 private key; the protected
// service verifies with the public key alone. Tokens carry the key's id
// (KeyID) in their kid header.
func NewEdDSA(priv ed25519.PrivateKey) (*Signer, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: Ed25519 private key has %d bytes", ErrKey, len(priv))
	}
	pub := priv.Public().(ed25519.PublicKey)
	return &Signer{method: jwt.SigningMethodEdDSA, key: priv, pub: pub, kid: KeyID(pub)}, nil
}

// ParsePrivateKeyPEM reads an Ed25519 private key in PKCS#8 PEM, as
// `openssl genpkey -algorithm ed25519` writes it.
func ParsePrivateKeyPEM(b []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%w: no PEM block", ErrKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKey, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: a %T, not an Ed25519 private key", ErrKey, k)
	}
	return priv, nil
}

// KeyID is a public key's id: the first 16 characters of the unpadded
// base64url SHA-256 of the key.
func KeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(h[:])[:16]
}

// PublicKey returns the Ed25519 public key tokens verify with, nil for an
// HS256 signer (whose secret must stay secret).
func (s *Signer) PublicKey() ed25519.PublicKey { return s.pub }

// JWKS returns the JSON Web Key Set (RFC 7517, RFC 8037) of an EdDSA
// signer's public key, for protected services that fetch keys by URL; nil
// for an HS256 signer.
func (s *Signer) JWKS() []byte {
	if s.pub == nil {
		return nil
	}
	type jwk struct {
		Kty string `json:"kty"`
		Crv string `json:"crv"`
		X   string `json:"x"`
		Alg string `json:"alg"`
		Use string `json:"use"`
		Kid string `json:"kid"`
	}
	b, _ := json.Marshal(struct {
		Keys []jwk `json:"keys"`
	}{[]jwk{{Kty: "OKP", Crv: "Ed25519", X: base64.RawURLEncoding.EncodeToString(s.pub), Alg: "EdDSA", Use: "sig", Kid: s.kid}}})
	return b
}

// Sign returns a token for uid in room, valid until exp.
func (s *Signer) Sign(uid, room string, now, exp time.Time) (string, error) {
	c := Claims{Room: room, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   uid,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(exp),
	}}
	t := jwt.NewWithClaims(s.method, c)
	if s.kid != "" {
		t.Header["kid"] = s.kid
	}
	tok, err := t.SignedString(s.key)
	if err != nil {
		return "", fmt.Errorf("roomtoken: sign: %w", err)
	}
	return tok, nil
}

// Verify checks token with key ([]byte secret for HS256, or an
// ed25519.PublicKey for EdDSA) and, when room is not empty, that it was
// issued for room. Expiry is checked against the current time with leeway.
func Verify(token string, key any, room string, leeway time.Duration) (*Claims, error) {
	var method string
	switch k := key.(type) {
	case []byte:
		if len(k) < MinSecretLen {
			return nil, fmt.Errorf("%w: HS256 secret shorter than %d bytes", ErrKey, MinSecretLen)
		}
		method = jwt.SigningMethodHS256.Alg()
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%w: Ed25519 public key has %d bytes", ErrKey, len(k))
		}
		method = jwt.SigningMethodEdDSA.Alg()
	default:
		return nil, fmt.Errorf("%w: %T", ErrKey, key)
	}
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return key, nil },
		jwt.WithValidMethods([]string{method}), jwt.WithExpirationRequired(), jwt.WithLeeway(leeway))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if c.Subject == "" {
		return nil, fmt.Errorf("%w: no sub", ErrInvalid)
	}
	if room != "" && c.Room != room {
		return nil, fmt.Errorf("%w: issued for room %q", ErrInvalid, c.Room)
	}
	return &c, nil
}

// Verify checks token with the signer's own key (the secret, or the
// public key of an EdDSA signer) as the package-level Verify does.
func (s *Signer) Verify(token, room string, leeway time.Duration) (*Claims, error) {
	if s.pub != nil {
		return Verify(token, s.pub, room, leeway)
	}
	return Verify(token, s.key, room, leeway)
}
