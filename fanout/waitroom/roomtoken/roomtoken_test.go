package roomtoken_test

import (
	"crypto/ed25519"
	"crypto/rand"
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
