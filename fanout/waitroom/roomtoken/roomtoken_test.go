package roomtoken_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
)

func TestVerifyWithKeyAlone(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := roomtoken.NewHS256(secret)
	if err != nil {
		t.Fatal(err)
	}
	ed, err := roomtoken.NewEdDSA(priv)
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	exp := now.Add(time.Minute)
	hsTok, _ := hs.Sign("u1", "launch", now, exp)
	edTok, _ := ed.Sign("u1", "launch", now, exp)
	oldTok, _ := hs.Sign("u1", "launch", now.Add(-time.Hour), now.Add(-time.Minute))
	cases := []struct {
		name  string
		token string
		key   any
		room  string
		ok    bool
	}{
		{"hs256 secret", hsTok, secret, "launch", true},
		{"eddsa public key", edTok, pub, "launch", true},
		{"any room", edTok, pub, "", true},
		{"wrong room", hsTok, secret, "other", false},
		{"wrong secret", hsTok, []byte(strings.Repeat("x", 32)), "launch", false},
		{"wrong public key", edTok, otherPub, "launch", false},
		{"hs token, public key", hsTok, pub, "launch", false},
		{"ed token, secret", edTok, secret, "launch", false},
		{"expired", oldTok, secret, "launch", false},
		{"tampered", hsTok[:len(hsTok)-2] + "AA", secret, "launch", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl, err := roomtoken.Verify(c.token, c.key, c.room, time.Second)
			if c.ok {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				if cl.UID() != "u1" || cl.Room != "launch" || !cl.ExpiresAt.Time.Equal(exp.Truncate(time.Second)) {
					t.Fatalf("claims: got %+v", cl)
				}
				return
			}
			if !errors.Is(err, roomtoken.ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	if _, err := roomtoken.NewHS256([]byte("short")); !errors.Is(err, roomtoken.ErrKey) {
		t.Fatalf("short secret: got %v, want ErrKey", err)
	}
	if _, err := roomtoken.Verify("x", "string key", "", 0); !errors.Is(err, roomtoken.ErrKey) {
		t.Fatalf("string key: got %v, want ErrKey", err)
	}
}

// TestPEMAndJWKS: a key as openssl writes it signs tokens that verify with
// the public key taken from the signer's JWKS alone (what a protected
// service fetching keys by URL does); HS256 publishes nothing.
func TestPEMAndJWKS(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	got, err := roomtoken.ParsePrivateKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil || !got.Equal(priv) {
		t.Fatalf("ParsePrivateKeyPEM: %v", err)
	}
	s, err := roomtoken.NewEdDSA(got)
	if err != nil {
		t.Fatal(err)
	}
	var set struct {
		Keys []struct{ Kty, Crv, X, Alg, Use, Kid string }
	}
	if err := json.Unmarshal(s.JWKS(), &set); err != nil || len(set.Keys) != 1 {
		t.Fatalf("JWKS %s: %v", s.JWKS(), err)
	}
	k := set.Keys[0]
	x, err := base64.RawURLEncoding.DecodeString(k.X)
	if err != nil || k.Kty != "OKP" || k.Crv != "Ed25519" || k.Alg != "EdDSA" || k.Use != "sig" || k.Kid != roomtoken.KeyID(priv.Public().(ed25519.PublicKey)) {
		t.Fatalf("JWK %+v: %v", k, err)
	}
	now := time.Now()
	tok, err := s.Sign("alice", "sale", now, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := roomtoken.Verify(tok, ed25519.PublicKey(x), "sale", 0); err != nil || c.UID() != "alice" {
		t.Fatalf("verify with the JWKS key: %v", err)
	}
	hdr, _ := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[0])
	if !strings.Contains(string(hdr), `"kid":"`+k.Kid+`"`) {
		t.Errorf("token header %s has no kid %s", hdr, k.Kid)
	}
	for _, bad := range [][]byte{nil, []byte("not pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}})} {
		if _, err := roomtoken.ParsePrivateKeyPEM(bad); !errors.Is(err, roomtoken.ErrKey) {
			t.Errorf("ParsePrivateKeyPEM(%q): %v, want ErrKey", bad, err)
		}
	}
	hs, _ := roomtoken.NewHS256([]byte("0123456789abcdef0123456789abcdef"))
	if hs.JWKS() != nil || hs.PublicKey() != nil {
		t.Error("an HS256 signer publishes a key")
	}
}
