package auth

import (
	"math/big"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func big1() *big.Int { return big.NewInt(1) }

func BenchmarkVerify(b *testing.B) {
	kp := keys()
	v, err := NewVerifier(Config{
		Secret: secret,
		PublicKeys: []PublicKey{
			{PEM: pubPEM(b, &kp.rsaKey.PublicKey)},
			{PEM: pubPEM(b, kp.edKey.Public())},
		},
		Now: clock,
	})
	if err != nil {
		b.Fatal(err)
	}
	claims := base(map[string]any{"lvl": 1})
	for _, tc := range []struct {
		alg string
		m   jwt.SigningMethod
		key any
	}{
		{"HS256", jwt.SigningMethodHS256, secret},
		{"RS256", jwt.SigningMethodRS256, kp.rsaKey},
		{"EdDSA", jwt.SigningMethodEdDSA, kp.edKey},
	} {
		tok := mint(b, tc.m, tc.key, claims, nil)
		b.Run("alg="+tc.alg, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(tok); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifications/s")
		})
	}
}

func BenchmarkSign(b *testing.B) {
	s, err := NewSigner(SignerConfig{Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Sign("user-00042", 1, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
