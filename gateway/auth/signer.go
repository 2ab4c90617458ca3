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

// SignerConfig configures a Signer: either Secret (HS256) or PrivateKey.
type SignerConfig struct {
	// Secret is the HS256 key, at least MinSecretBytes long.
	Secret []byte
	// PrivateKey is a PEM private key (PKCS#8 RSA or Ed25519, or PKCS#1
	// "RSA PRIVATE KEY"): RS256 or EdDSA. It takes precedence over Secret.
	PrivateKey []byte
	// KeyID, when set, goes into the token header as kid.
	KeyID string
	// Issuer and Audience, when set, go into iss and aud.
	Issuer   string
	Audience string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Validate reports every problem of c.
func (c SignerConfig) Validate() error {
	var errs []error
	switch {
	case len(c.PrivateKey) > 0:
		if _, err := parsePrivateKey(c.PrivateKey); err != nil {
			errs = append(errs, fmt.Errorf("auth: PrivateKey: %w", err))
		}
	case len(c.Secret) == 0:
		errs = append(errs, errors.New("auth: no signing key: set Secret or PrivateKey"))
	case len(c.Secret) < MinSecretBytes:
		errs = append(errs, fmt.Errorf("auth: Secret is %d bytes, want at least %d", len(c.Secret), MinSecretBytes))
	}
	return errors.Join(errs...)
}

// Signer mints user tokens (fanfare token, tests, load generators). Safe
// for concurrent use.
type Signer struct {
	method jwt.SigningMethod
	key    any
	cfg    SignerConfig
}

// NewSigner returns a Signer for cfg.
func NewSigner(cfg SignerConfig) (*Signer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Signer{cfg: cfg}
	if cfg.Now == nil {
		s.cfg.Now = time.Now
	}
	if len(cfg.PrivateKey) > 0 {
		k, _ := parsePrivateKey(cfg.PrivateKey) // checked by Validate
		switch k.(type) {
		case *rsa.PrivateKey:
			s.method = jwt.SigningMethodRS256
		case ed25519.PrivateKey:
			s.method = jwt.SigningMethodEdDSA
		}
		s.key = crypto.Signer(k)
	} else {
		s.method = jwt.SigningMethodHS256
		s.key = append([]byte(nil), cfg.Secret...)
	}
	return s, nil
}

// Method returns the signing algorithm (HS256, RS256 or EdDSA).
func (s *Signer) Method() string { return s.method.Alg() }

// Sign returns a token for uid at VIP tier (0..MaxTier, the lvl claim) that expires after ttl.
func (s *Signer) Sign(uid string, tier int, ttl time.Duration) (string, error) {
	if err := validUID(uid); err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	if tier < 0 || tier > MaxTier {
		return "", fmt.Errorf("auth: tier %d out of range 0..%d", tier, MaxTier)
	}
	if ttl <= 0 {
		return "", fmt.Errorf("auth: ttl %v must be positive", ttl)
	}
	now := s.cfg.Now()
	claims := jwt.MapClaims{
		"sub": uid,
		"lvl": tier,
		"iat": now.Unix(),
		"exp": now.Add(ttl).Unix(),
	}
	if s.cfg.Issuer != "" {
		claims["iss"] = s.cfg.Issuer
	}
	if s.cfg.Audience != "" {
		claims["aud"] = s.cfg.Audience
	}
	t := jwt.NewWithClaims(s.method, claims)
	if s.cfg.KeyID != "" {
		t.Header["kid"] = s.cfg.KeyID
	}
	signed, err := t.SignedString(s.key)
	if err != nil {
		return "", fmt.Errorf("auth: sign: %w", err)
	}
	return signed, nil
}
