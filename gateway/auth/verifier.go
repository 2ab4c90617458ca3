package auth

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Config configures a Verifier. At least one key (Secret or PublicKeys) is
// required; everything else has a working zero value.
type Config struct {
	// Secret is the HS256 key (FANFARE_JWT_SECRET), at least
	// MinSecretBytes long. Empty: HS256 tokens are refused.
	Secret []byte
	// PublicKeys verify RS256 (RSA) and EdDSA (Ed25519) tokens. Empty:
	// those algorithms are refused.
	PublicKeys []PublicKey
	// Leeway is the clock skew allowed on exp, nbf and iat. 0 means
	// DefaultLeeway; negative means none.
	Leeway time.Duration
	// Issuer, when set, must equal the iss claim.
	Issuer string
	// Audience, when set, must be in the aud claim.
	Audience string
	// MaxTokenBytes bounds a token before parsing; 0 means
	// DefaultMaxTokenBytes.
	MaxTokenBytes int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// PublicKey is one PEM-encoded verification key (PKIX "PUBLIC KEY", PKCS#1
// "RSA PUBLIC KEY" or a "CERTIFICATE"; several blocks may be concatenated).
// A token whose header kid equals ID is checked against this key only; a
// token without a matching kid is checked against every key of its
// algorithm.
type PublicKey struct {
	ID  string
	PEM []byte
}

// Validate reports every problem of c.
func (c Config) Validate() error {
	var errs []error
	if len(c.Secret) == 0 && len(c.PublicKeys) == 0 {
		errs = append(errs, errors.New("auth: no verification key: set Secret or PublicKeys"))
	}
	if len(c.Secret) > 0 && len(c.Secret) < MinSecretBytes {
		errs = append(errs, fmt.Errorf("auth: Secret is %d bytes, want at least %d", len(c.Secret), MinSecretBytes))
	}
	for i, k := range c.PublicKeys {
		if _, err := parsePublicKeys(k.PEM); err != nil {
			errs = append(errs, fmt.Errorf("auth: PublicKeys[%d] (kid %q): %w", i, k.ID, err))
		}
	}
	if c.MaxTokenBytes < 0 {
		errs = append(errs, errors.New("auth: MaxTokenBytes is negative"))
	}
	return errors.Join(errs...)
}

type verificationKey struct {
	id  string
	key crypto.PublicKey
}

// Verifier checks user tokens. Safe for concurrent use.
type Verifier struct {
	parser   *jwt.Parser
	secret   []byte
	rsaKeys  []verificationKey
	edKeys   []verificationKey
	maxBytes int
	fast     *hsFast // HS256 without golang-jwt when it decides alike (hs256.go); nil without Secret
}

// NewVerifier returns a Verifier for cfg.
func NewVerifier(cfg Config) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &Verifier{maxBytes: cfg.MaxTokenBytes}
	if v.maxBytes == 0 {
		v.maxBytes = DefaultMaxTokenBytes
	}
	var methods []string
	if len(cfg.Secret) > 0 {
		v.secret = append([]byte(nil), cfg.Secret...)
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	for _, pk := range cfg.PublicKeys {
		keys, _ := parsePublicKeys(pk.PEM) // checked by Validate
		for _, k := range keys {
			switch k.(type) {
			case *rsa.PublicKey:
				v.rsaKeys = append(v.rsaKeys, verificationKey{pk.ID, k})
			case ed25519.PublicKey:
				v.edKeys = append(v.edKeys, verificationKey{pk.ID, k})
			}
		}
	}
	if len(v.rsaKeys) > 0 {
		methods = append(methods, jwt.SigningMethodRS256.Alg())
	}
	if len(v.edKeys) > 0 {
		methods = append(methods, jwt.SigningMethodEdDSA.Alg())
	}
	leeway := cfg.Leeway
	switch {
	case leeway == 0:
		leeway = DefaultLeeway
	case leeway < 0:
		leeway = 0
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(methods),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(leeway),
	}
	if cfg.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(cfg.Now))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	if v.secret != nil {
		v.fast = newHSFast(v.secret, leeway, cfg.Now, cfg.Issuer, cfg.Audience)
	}
	return v, nil
}

// Methods returns the accepted algorithms (HS256, RS256, EdDSA).
func (v *Verifier) Methods() []string {
	var m []string
	if v.secret != nil {
		m = append(m, "HS256")
	}
	if len(v.rsaKeys) > 0 {
		m = append(m, "RS256")
	}
	if len(v.edKeys) > 0 {
		m = append(m, "EdDSA")
	}
	return m
}

// Verify checks token's signature, algorithm and claims and returns the
// claims. Failures wrap ErrInvalidToken (and ErrExpired when expired).
func (v *Verifier) Verify(token string) (Claims, error) {
	if len(token) > v.maxBytes {
		return Claims{}, invalid(fmt.Errorf("token longer than %d bytes", v.maxBytes))
	}
	if v.fast != nil {
		switch c, r := v.fast.verify(token); r {
		case fastOK:
			return c, nil
		case fastBadSig:
			return Claims{}, invalid(errFastBadSig)
		}
	}
	return v.verifySlow(token)
}

// verifySlow is Verify through golang-jwt, for every algorithm and for the
// HS256 tokens the fast path leaves to it.
func (v *Verifier) verifySlow(token string) (Claims, error) {
	var tc tokenClaims
	if _, err := v.parser.ParseWithClaims(token, &tc, v.keyFor); err != nil {
		return Claims{}, invalid(err)
	}
	lvl, _ := parseTier(tc.Lvl) // checked by tokenClaims.Validate
	return Claims{UID: tc.Subject, Tier: lvl, Expires: tc.ExpiresAt.Time}, nil
}

// keyFor picks the verification key(s) for a parsed, not yet verified
// token. The parser has already refused algorithms not in WithValidMethods,
// so the method switch only routes.
func (v *Verifier) keyFor(t *jwt.Token) (any, error) {
	switch t.Method.Alg() {
	case "HS256":
		if v.secret == nil {
			break
		}
		return v.secret, nil
	case "RS256":
		return pickKeys(v.rsaKeys, t)
	case "EdDSA":
		return pickKeys(v.edKeys, t)
	}
	return nil, fmt.Errorf("algorithm %q not accepted", t.Method.Alg())
}

func pickKeys(keys []verificationKey, t *jwt.Token) (any, error) {
	if kid, ok := t.Header["kid"].(string); ok && kid != "" {
		for _, k := range keys {
			if k.id == kid {
				return k.key, nil
			}
		}
	}
	if len(keys) == 1 {
		return keys[0].key, nil
	}
	set := jwt.VerificationKeySet{Keys: make([]jwt.VerificationKey, len(keys))}
	for i, k := range keys {
		set.Keys[i] = k.key
	}
	return set, nil
}
