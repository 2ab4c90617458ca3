package auth

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
)

// Errors. Every Verify failure wraps ErrInvalidToken; an expired token
// also wraps ErrExpired.
var (
	ErrInvalidToken = errors.New("auth: invalid token")
	ErrExpired      = errors.New("auth: token expired")
)

// Bounds and defaults.
const (
	// MaxTier is the highest VIP tier a token's lvl claim carries (0 normal, 1..3 VIP). "Tier" is the user's rank; "level" means degradation only.
	MaxTier = 3
	// MaxUIDBytes bounds the sub claim.
	MaxUIDBytes = 128
	// MinSecretBytes is the shortest HS256 secret accepted (RFC 7518 §3.2:
	// a key of the hash's size, 256 bits).
	MinSecretBytes = 32
	// MinRSABits is the smallest RSA modulus accepted.
	MinRSABits = 2048
	// DefaultLeeway is the clock skew allowed on exp, nbf and iat.
	DefaultLeeway = 30 * time.Second
	// DefaultMaxTokenBytes bounds a token before it is parsed.
	DefaultMaxTokenBytes = 4096
)

// Claims are what fanfare reads from a verified token.
type Claims struct {
	UID     string    // sub
	Tier    int       // lvl: 0 normal, 1..3 VIP
	Expires time.Time // exp
}

// tokenClaims is the JSON payload of a token.
type tokenClaims struct {
	jwt.RegisteredClaims
	Lvl json.RawMessage `json:"lvl,omitempty"`
}

// Validate implements jwt.ClaimsValidator: it runs after the registered
// claims (exp, nbf, iat, iss, aud) were checked.
func (c *tokenClaims) Validate() error {
	if err := validUID(c.Subject); err != nil {
		return err
	}
	_, err := parseTier(c.Lvl)
	return err
}

// validUID checks a uid: non-empty, at most MaxUIDBytes, valid UTF-8,
// no control characters (uids end up in logs, keys and frames).
func validUID(uid string) error {
	if uid == "" {
		return errors.New("sub: required")
	}
	if len(uid) > MaxUIDBytes {
		return fmt.Errorf("sub: longer than %d bytes", MaxUIDBytes)
	}
	if !utf8.ValidString(uid) {
		return errors.New("sub: invalid UTF-8")
	}
	for _, r := range uid {
		if unicode.IsControl(r) {
			return errors.New("sub: control character")
		}
	}
	return nil
}

// parseTier reads the lvl claim: absent or null = 0; otherwise an integer
// literal 0..MaxLevel.
func parseTier(raw json.RawMessage) (int, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return 0, nil
	}
	if len(s) != 1 || s[0] < '0' || s[0] > '0'+MaxTier {
		return 0, fmt.Errorf("lvl: want an integer 0..%d, got %.16s", MaxTier, s)
	}
	return int(s[0] - '0'), nil
}

// verifyError carries the kind (ErrInvalidToken or ErrExpired) and the
// cause; it wraps ErrInvalidToken in every case.
type verifyError struct {
	kind  error
	cause error
}

func (e *verifyError) Error() string {
	if e.kind == ErrInvalidToken {
		return e.kind.Error() + ": " + e.cause.Error()
	}
	return ErrInvalidToken.Error() + ": " + e.kind.Error() + ": " + e.cause.Error()
}

func (e *verifyError) Unwrap() []error { return []error{ErrInvalidToken, e.kind, e.cause} }

func invalid(cause error) error {
	if errors.Is(cause, jwt.ErrTokenExpired) {
		return &verifyError{kind: ErrExpired, cause: cause}
	}
	return &verifyError{kind: ErrInvalidToken, cause: cause}
}

// parsePublicKeys decodes every PEM block of data: PKIX "PUBLIC KEY"
// (RSA or Ed25519), PKCS#1 "RSA PUBLIC KEY" or a "CERTIFICATE".
func parsePublicKeys(data []byte) ([]crypto.PublicKey, error) {
	var keys []crypto.PublicKey
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var (
			key any
			err error
		)
		switch block.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				key = cert.PublicKey
			}
		default:
			return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
		}
		if err != nil {
			return nil, err
		}
		switch k := key.(type) {
		case *rsa.PublicKey:
			if k.N.BitLen() < MinRSABits {
				return nil, fmt.Errorf("RSA key of %d bits, want at least %d", k.N.BitLen(), MinRSABits)
			}
		case ed25519.PublicKey:
		default:
			return nil, fmt.Errorf("unsupported key type %T (want RSA or Ed25519)", key)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("no PEM block found")
	}
	return keys, nil
}

// parsePrivateKey decodes one PEM private key: PKCS#8 (RSA or Ed25519) or
// PKCS#1 "RSA PRIVATE KEY".
func parsePrivateKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		if k.N.BitLen() < MinRSABits {
			return nil, fmt.Errorf("RSA key of %d bits, want at least %d", k.N.BitLen(), MinRSABits)
		}
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("unsupported key type %T (want RSA or Ed25519)", key)
}
