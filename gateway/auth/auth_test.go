package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var (
	secret      = []byte("0123456789abcdef0123456789abcdef")
	otherSecret = []byte("fedcba9876543210fedcba9876543210")
	now         = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock       = func() time.Time { return now }
)

type keyPair struct {
	rsaKey, rsaKey2 *rsa.PrivateKey
	edKey, edKey2   ed25519.PrivateKey
}

var keys = sync.OnceValue(func() keyPair {
	var kp keyPair
	var err error
	if kp.rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if kp.rsaKey2, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if _, kp.edKey, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	if _, kp.edKey2, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	return kp
})

func pubPEM(t testing.TB, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func privPEM(t testing.TB, priv any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// mint signs arbitrary claims with any method and key (test helper).
func mint(t testing.TB, m jwt.SigningMethod, key any, claims jwt.MapClaims, header map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	for k, v := range header {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func base(extra map[string]any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
	for k, v := range extra {
		switch v {
		case nil:
			delete(c, k)
		case "<null>":
			c[k] = nil
		default:
			c[k] = v
		}
	}
	return c
}

func TestVerify(t *testing.T) {
	kp := keys()
	all, err := NewVerifier(Config{
		Secret: secret,
		PublicKeys: []PublicKey{
			{PEM: pubPEM(t, &kp.rsaKey.PublicKey)},
			{PEM: pubPEM(t, kp.edKey.Public())},
		},
		Now: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	hsOnly, err := NewVerifier(Config{Secret: secret, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	rsaOnly, err := NewVerifier(Config{PublicKeys: []PublicKey{{PEM: pubPEM(t, &kp.rsaKey.PublicKey)}}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	strict, err := NewVerifier(Config{Secret: secret, Now: clock, Leeway: -1, Issuer: "fanfare", Audience: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	hs := func(c jwt.MapClaims) string { return mint(t, jwt.SigningMethodHS256, secret, c, nil) }
	rsaPubPEM := pubPEM(t, &kp.rsaKey.PublicKey)

	cases := []struct {
		name    string
		v       *Verifier
		token   string
		want    Claims
		wantErr error // nil = success
	}{
		{"hs256 valid", all, hs(base(nil)), Claims{UID: "alice", Expires: now.Add(time.Hour)}, nil},
		{"hs256 lvl 3", hsOnly, hs(base(map[string]any{"lvl": 3})), Claims{UID: "alice", Tier: 3, Expires: now.Add(time.Hour)}, nil},
		{"lvl null is 0", hsOnly, hs(base(map[string]any{"lvl": "<null>"})), Claims{UID: "alice", Expires: now.Add(time.Hour)}, nil},
		{"extra claims ignored (room token)", hsOnly, hs(base(map[string]any{"room": "sale", "jti": "x"})), Claims{UID: "alice", Expires: now.Add(time.Hour)}, nil},
		{"no iat is fine", hsOnly, hs(base(map[string]any{"iat": nil})), Claims{UID: "alice", Expires: now.Add(time.Hour)}, nil},
		{"rs256 valid", all, mint(t, jwt.SigningMethodRS256, kp.rsaKey, base(map[string]any{"lvl": 1}), nil),
			Claims{UID: "alice", Tier: 1, Expires: now.Add(time.Hour)}, nil},
		{"eddsa valid", all, mint(t, jwt.SigningMethodEdDSA, kp.edKey, base(map[string]any{"lvl": 2}), nil),
			Claims{UID: "alice", Tier: 2, Expires: now.Add(time.Hour)}, nil},
		{"expired within leeway", hsOnly, hs(base(map[string]any{"exp": now.Add(-10 * time.Second).Unix()})),
			Claims{UID: "alice", Expires: now.Add(-10 * time.Second)}, nil},
		{"issuer and audience match", strict, hs(base(map[string]any{"iss": "fanfare", "aud": []string{"x", "chat"}})),
			Claims{UID: "alice", Expires: now.Add(time.Hour)}, nil},

		{"expired", hsOnly, hs(base(map[string]any{"exp": now.Add(-time.Minute).Unix()})), Claims{}, ErrExpired},
		{"expired no leeway", strict, hs(base(map[string]any{"exp": now.Add(-time.Second).Unix(), "iss": "fanfare", "aud": "chat"})), Claims{}, ErrExpired},
		{"not yet valid", hsOnly, hs(base(map[string]any{"nbf": now.Add(time.Minute).Unix()})), Claims{}, ErrInvalidToken},
		{"issued in the future", hsOnly, hs(base(map[string]any{"iat": now.Add(time.Hour).Unix()})), Claims{}, ErrInvalidToken},
		{"missing exp", hsOnly, hs(base(map[string]any{"exp": nil})), Claims{}, ErrInvalidToken},
		{"exp not a number", hsOnly, hs(base(map[string]any{"exp": "tomorrow"})), Claims{}, ErrInvalidToken},
		{"wrong secret", hsOnly, mint(t, jwt.SigningMethodHS256, otherSecret, base(nil), nil), Claims{}, ErrInvalidToken},
		{"alg none", all, mint(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, base(nil), nil), Claims{}, ErrInvalidToken},
		{"alg none hand-made", all, "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + strings.Split(hs(base(nil)), ".")[1] + ".", Claims{}, ErrInvalidToken},
		{"rs256 to hs256-only", hsOnly, mint(t, jwt.SigningMethodRS256, kp.rsaKey, base(nil), nil), Claims{}, ErrInvalidToken},
		{"hs256 to rs256-only", rsaOnly, hs(base(nil)), Claims{}, ErrInvalidToken},
		{"hs256 signed with the RSA public key (alg confusion)", rsaOnly, mint(t, jwt.SigningMethodHS256, rsaPubPEM, base(nil), nil), Claims{}, ErrInvalidToken},
		{"eddsa to rs256-only", rsaOnly, mint(t, jwt.SigningMethodEdDSA, kp.edKey, base(nil), nil), Claims{}, ErrInvalidToken},
		{"hs512 not accepted", all, mint(t, jwt.SigningMethodHS512, secret, base(nil), nil), Claims{}, ErrInvalidToken},
		{"rs256 unknown key", all, mint(t, jwt.SigningMethodRS256, kp.rsaKey2, base(nil), nil), Claims{}, ErrInvalidToken},
		{"eddsa unknown key", all, mint(t, jwt.SigningMethodEdDSA, kp.edKey2, base(nil), nil), Claims{}, ErrInvalidToken},
		{"missing sub", hsOnly, hs(base(map[string]any{"sub": nil})), Claims{}, ErrInvalidToken},
		{"empty sub", hsOnly, hs(base(map[string]any{"sub": ""})), Claims{}, ErrInvalidToken},
		{"numeric sub", hsOnly, hs(base(map[string]any{"sub": 42})), Claims{}, ErrInvalidToken},
		{"sub with control char", hsOnly, hs(base(map[string]any{"sub": "a\nb"})), Claims{}, ErrInvalidToken},
		{"sub too long", hsOnly, hs(base(map[string]any{"sub": strings.Repeat("u", MaxUIDBytes+1)})), Claims{}, ErrInvalidToken},
		{"lvl 4", hsOnly, hs(base(map[string]any{"lvl": 4})), Claims{}, ErrInvalidToken},
		{"lvl -1", hsOnly, hs(base(map[string]any{"lvl": -1})), Claims{}, ErrInvalidToken},
		{"lvl string", hsOnly, hs(base(map[string]any{"lvl": "2"})), Claims{}, ErrInvalidToken},
		{"lvl fraction", hsOnly, hs(base(map[string]any{"lvl": 1.5})), Claims{}, ErrInvalidToken},
		{"wrong issuer", strict, hs(base(map[string]any{"iss": "other", "aud": "chat"})), Claims{}, ErrInvalidToken},
		{"missing audience", strict, hs(base(map[string]any{"iss": "fanfare"})), Claims{}, ErrInvalidToken},
		{"garbage", all, "not.a.jwt", Claims{}, ErrInvalidToken},
		{"empty", all, "", Claims{}, ErrInvalidToken},
		{"too long", all, hs(base(map[string]any{"pad": strings.Repeat("p", DefaultMaxTokenBytes)})), Claims{}, ErrInvalidToken},
		{"tampered payload", hsOnly, func() string {
			p := strings.Split(hs(base(nil)), ".")
			q := strings.Split(hs(base(map[string]any{"lvl": 3})), ".")
			return p[0] + "." + q[1] + "." + p[2]
		}(), Claims{}, ErrInvalidToken},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.v.Verify(tc.token)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Verify: got error %v, want none", err)
				}
				if got.UID != tc.want.UID || got.Tier != tc.want.Tier || !got.Expires.Equal(tc.want.Expires) {
					t.Fatalf("got %+v, want %+v", got, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Verify: got %+v, want error %v", got, tc.wantErr)
			}
			if !errors.Is(err, tc.wantErr) || !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("got error %v, want %v (and ErrInvalidToken)", err, tc.wantErr)
			}
			if got != (Claims{}) {
				t.Fatalf("got claims %+v with error, want zero", got)
			}
		})
	}
}

func TestVerifyKeyID(t *testing.T) {
	kp := keys()
	v, err := NewVerifier(Config{
		PublicKeys: []PublicKey{
			{ID: "k1", PEM: pubPEM(t, &kp.rsaKey.PublicKey)},
			{ID: "k2", PEM: pubPEM(t, &kp.rsaKey2.PublicKey)},
			{ID: "e1", PEM: pubPEM(t, kp.edKey.Public())},
		},
		Now: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		tok  string
		ok   bool
	}{
		{"kid k2", mint(t, jwt.SigningMethodRS256, kp.rsaKey2, base(nil), map[string]any{"kid": "k2"}), true},
		{"no kid tries all", mint(t, jwt.SigningMethodRS256, kp.rsaKey2, base(nil), nil), true},
		{"kid names the other key", mint(t, jwt.SigningMethodRS256, kp.rsaKey2, base(nil), map[string]any{"kid": "k1"}), false},
		{"unknown kid tries all", mint(t, jwt.SigningMethodRS256, kp.rsaKey, base(nil), map[string]any{"kid": "zz"}), true},
		{"eddsa kid", mint(t, jwt.SigningMethodEdDSA, kp.edKey, base(nil), map[string]any{"kid": "e1"}), true},
		{"rsa kid on eddsa token", mint(t, jwt.SigningMethodEdDSA, kp.edKey, base(nil), map[string]any{"kid": "k1"}), true},
	}
	for _, tc := range cases {
		_, err := v.Verify(tc.tok)
		if (err == nil) != tc.ok {
			t.Errorf("%s: got err %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if got, want := strings.Join(v.Methods(), ","), "RS256,EdDSA"; got != want {
		t.Errorf("Methods: got %s, want %s", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  Config
		want []string // substrings of the joined error; none = valid
	}{
		{"zero", Config{}, []string{"no verification key"}},
		{"short secret", Config{Secret: []byte("secret")}, []string{"at least 32"}},
		{"bad pem and short secret", Config{Secret: []byte("x"), PublicKeys: []PublicKey{{ID: "a", PEM: []byte("nope")}}},
			[]string{"at least 32", `PublicKeys[0] (kid "a"): no PEM block`}},
		{"small rsa", Config{PublicKeys: []PublicKey{{PEM: pubPEM(t, &small.PublicKey)}}}, []string{"1024 bits"}},
		{"private key as public", Config{PublicKeys: []PublicKey{{PEM: privPEM(t, keys().edKey)}}}, []string{"unsupported PEM block"}},
		{"negative max", Config{Secret: secret, MaxTokenBytes: -1}, []string{"MaxTokenBytes"}},
		{"ok", Config{Secret: secret}, nil},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: got %v, want nil", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: got nil, want errors %q", tc.name, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: got %q, want it to contain %q", tc.name, err, w)
			}
		}
		if _, nerr := NewVerifier(tc.cfg); nerr == nil {
			t.Errorf("%s: NewVerifier accepted an invalid config", tc.name)
		}
	}
}

func TestPublicKeyFormats(t *testing.T) {
	kp := keys()
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&kp.rsaKey.PublicKey)})
	tmpl := &x509.Certificate{SerialNumber: big1(), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, kp.edKey.Public(), kp.edKey)
	if err != nil {
		t.Fatal(err)
	}
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	bundle := append(append([]byte{}, pkcs1...), cert...)
	v, err := NewVerifier(Config{PublicKeys: []PublicKey{{PEM: bundle}}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"pkcs1 rsa":         mint(t, jwt.SigningMethodRS256, kp.rsaKey, base(nil), nil),
		"ed25519 from cert": mint(t, jwt.SigningMethodEdDSA, kp.edKey, base(nil), nil),
	} {
		if _, err := v.Verify(tok); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestSignerRoundTrip(t *testing.T) {
	kp := keys()
	rsaPKCS1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(kp.rsaKey)})
	verifier, err := NewVerifier(Config{
		Secret: secret,
		PublicKeys: []PublicKey{
			{PEM: pubPEM(t, &kp.rsaKey.PublicKey)},
			{PEM: pubPEM(t, kp.edKey.Public())},
		},
		Now: clock, Issuer: "fanfare", Audience: "chat",
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		cfg    SignerConfig
		method string
	}{
		{"hs256", SignerConfig{Secret: secret}, "HS256"},
		{"rs256 pkcs8", SignerConfig{PrivateKey: privPEM(t, kp.rsaKey), KeyID: "k1"}, "RS256"},
		{"rs256 pkcs1", SignerConfig{PrivateKey: rsaPKCS1}, "RS256"},
		{"eddsa", SignerConfig{PrivateKey: privPEM(t, kp.edKey)}, "EdDSA"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Now, tc.cfg.Issuer, tc.cfg.Audience = clock, "fanfare", "chat"
			s, err := NewSigner(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if s.Method() != tc.method {
				t.Fatalf("got method %s, want %s", s.Method(), tc.method)
			}
			for lvl := 0; lvl <= MaxTier; lvl++ {
				tok, err := s.Sign("bob", lvl, 90*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				c, err := verifier.Verify(tok)
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				want := Claims{UID: "bob", Tier: lvl, Expires: now.Add(90 * time.Second)}
				if c.UID != want.UID || c.Tier != want.Tier || !c.Expires.Equal(want.Expires) {
					t.Fatalf("got %+v, want %+v", c, want)
				}
			}
		})
	}
	s, _ := NewSigner(SignerConfig{Secret: secret, Now: clock})
	for _, bad := range []struct {
		uid string
		lvl int
		ttl time.Duration
	}{{"", 0, time.Minute}, {"u", 4, time.Minute}, {"u", -1, time.Minute}, {"u", 0, 0}, {"a\x00", 0, time.Minute}} {
		if tok, err := s.Sign(bad.uid, bad.lvl, bad.ttl); err == nil {
			t.Errorf("Sign(%q, %d, %v) = %s, want error", bad.uid, bad.lvl, bad.ttl, tok)
		}
	}
	for _, cfg := range []SignerConfig{{}, {Secret: []byte("short")}, {PrivateKey: []byte("junk")}} {
		if _, err := NewSigner(cfg); err == nil {
			t.Errorf("NewSigner(%+v): got nil error", cfg)
		}
	}
	// A token expires for a verifier whose clock moved past exp + leeway.
	tok, _ := s.Sign("bob", 0, time.Minute)
	later, _ := NewVerifier(Config{Secret: secret, Now: func() time.Time { return now.Add(2 * time.Minute) }})
	if _, err := later.Verify(tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("got %v, want ErrExpired", err)
	}
}
