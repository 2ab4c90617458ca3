package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rawToken builds a token from raw header and claims JSON, signed HS256
// with key (so that malformed, duplicate and case-variant members can be
// made, which jwt.MapClaims cannot).
func rawToken(header, claims string, key []byte) string {
	in := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(claims))
	m := hmac.New(sha256.New, key)
	m.Write([]byte(in))
	return in + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

const hs256Header = `{"alg":"HS256","typ":"JWT"}`

func unix(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }

// verifiers are the configurations the fast path is compared under.
func verifiers(t testing.TB) map[string]*Verifier {
	out := map[string]*Verifier{}
	for name, cfg := range map[string]Config{
		"plain":     {Secret: secret, Now: clock},
		"iss+aud":   {Secret: secret, Now: clock, Issuer: "fanfare", Audience: "chat"},
		"no-leeway": {Secret: secret, Now: clock, Leeway: -1},
		"leeway-2m": {Secret: secret, Now: clock, Leeway: 2 * time.Minute},
	} {
		v, err := NewVerifier(cfg)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = v
	}
	return out
}

// agree checks one token: what the fast path decides must be what
// golang-jwt decides, and Verify must equal golang-jwt in every case.
func agree(t testing.TB, v *Verifier, tok string) fastResult {
	t.Helper()
	fc, r := v.fast.verify(tok)
	sc, serr := v.verifySlow(tok)
	vc, verr := v.Verify(tok)
	switch r {
	case fastOK:
		if serr != nil {
			t.Fatalf("fast path accepts, golang-jwt refuses (%v): %s", serr, tok)
		}
		if fc.UID != sc.UID || fc.Tier != sc.Tier || !fc.Expires.Equal(sc.Expires) {
			t.Fatalf("claims: fast %+v, golang-jwt %+v: %s", fc, sc, tok)
		}
	case fastBadSig:
		if serr == nil {
			t.Fatalf("fast path refuses the signature, golang-jwt accepts: %s", tok)
		}
		if errors.Is(serr, ErrExpired) {
			t.Fatalf("fast path refuses the signature, golang-jwt says expired: %s", tok)
		}
	}
	if (verr == nil) != (serr == nil) || errors.Is(verr, ErrExpired) != errors.Is(serr, ErrExpired) {
		t.Fatalf("Verify: %v, golang-jwt: %v: %s", verr, serr, tok)
	}
	if verr != nil && !errors.Is(verr, ErrInvalidToken) {
		t.Fatalf("Verify error %v does not wrap ErrInvalidToken", verr)
	}
	if verr == nil && (vc.UID != sc.UID || vc.Tier != sc.Tier || !vc.Expires.Equal(sc.Expires)) {
		t.Fatalf("Verify claims %+v, golang-jwt %+v", vc, sc)
	}
	return r
}

// TestFastPathCases pins what the fast path decides itself and what it
// leaves to golang-jwt, and that Verify's outcome is golang-jwt's.
func TestFastPathCases(t *testing.T) {
	v := verifiers(t)["plain"]
	va := verifiers(t)["iss+aud"]
	exp := unix(time.Hour)
	for _, tc := range []struct {
		name    string
		v       *Verifier
		tok     string
		want    fastResult
		ok      bool
		expired bool
	}{
		{"valid", v, rawToken(hs256Header, `{"sub":"u1","lvl":2,"exp":`+exp+`}`, secret), fastOK, true, false},
		{"valid, spaces and unknown claims", v, rawToken(` { "typ" : "JWT" , "alg" : "HS256" } `,
			"{ \"room\" : \"r1\", \"n\": -1.5e3, \"f\": false, \"sub\" : \"ü-1\" ,\n\"exp\" : "+exp+" } ", secret), fastOK, true, false},
		{"valid with iss and aud", va, rawToken(hs256Header, `{"sub":"u1","iss":"fanfare","aud":"chat","exp":`+exp+`}`, secret), fastOK, true, false},
		{"bad signature", v, rawToken(hs256Header, `{"sub":"u1","exp":`+exp+`}`, otherSecret), fastBadSig, false, false},
		{"bad signature, expired", v, rawToken(hs256Header, `{"sub":"u1","exp":`+unix(-time.Hour)+`}`, otherSecret), fastBadSig, false, false},
		{"expired", v, rawToken(hs256Header, `{"sub":"u1","exp":`+unix(-time.Hour)+`}`, secret), fastUnsure, false, true},
		{"expired within leeway", v, rawToken(hs256Header, `{"sub":"u1","exp":`+unix(-10*time.Second)+`}`, secret), fastOK, true, false},
		{"expired at leeway", v, rawToken(hs256Header, `{"sub":"u1","exp":`+unix(-DefaultLeeway)+`}`, secret), fastUnsure, false, true},
		{"no exp", v, rawToken(hs256Header, `{"sub":"u1"}`, secret), fastUnsure, false, false},
		{"nbf in the future", v, rawToken(hs256Header, `{"sub":"u1","nbf":`+unix(time.Minute)+`,"exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"iat in the future", v, rawToken(hs256Header, `{"sub":"u1","iat":`+unix(time.Minute)+`,"exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"wrong alg HS384", v, rawToken(`{"alg":"HS384"}`, `{"sub":"u1","exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"alg none", v, "eyJhbGciOiJub25lIn0." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"u1","exp":`+exp+`}`)) + ".", fastUnsure, false, false},
		{"two algs", v, rawToken(`{"alg":"HS256","alg":"none"}`, `{"sub":"u1","exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"wrong aud", va, rawToken(hs256Header, `{"sub":"u1","iss":"fanfare","aud":"other","exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"aud as array", va, rawToken(hs256Header, `{"sub":"u1","iss":"fanfare","aud":["x","chat"],"exp":`+exp+`}`, secret), fastUnsure, true, false},
		{"no aud", va, rawToken(hs256Header, `{"sub":"u1","iss":"fanfare","exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"wrong iss", va, rawToken(hs256Header, `{"sub":"u1","iss":"x","aud":"chat","exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"case variant of sub", v, rawToken(hs256Header, `{"sub":"u1","SUB":"u2","exp":`+exp+`}`, secret), fastUnsure, true, false},
		{"duplicate sub", v, rawToken(hs256Header, `{"sub":"u1","sub":"u2","exp":`+exp+`}`, secret), fastUnsure, true, false},
		{"escaped sub", v, rawToken(hs256Header, `{"sub":"u\u0031","exp":`+exp+`}`, secret), fastUnsure, true, false},
		{"fractional exp", v, rawToken(hs256Header, `{"sub":"u1","exp":`+exp+`.5}`, secret), fastUnsure, true, false},
		{"quoted exp", v, rawToken(hs256Header, `{"sub":"u1","exp":"`+exp+`"}`, secret), fastUnsure, true, false},
		{"lvl 4", v, rawToken(hs256Header, `{"sub":"u1","lvl":4,"exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"lvl null", v, rawToken(hs256Header, `{"sub":"u1","lvl":null,"exp":`+exp+`}`, secret), fastOK, true, false},
		{"empty sub", v, rawToken(hs256Header, `{"sub":"","exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"control in sub", v, rawToken(hs256Header, `{"sub":"a`+"\u0085"+`","exp":`+exp+`}`, secret), fastUnsure, false, false},
		{"nested claim", v, rawToken(hs256Header, `{"sub":"u1","x":{"y":1},"exp":`+exp+`}`, secret), fastUnsure, true, false},
		{"trailing data", v, rawToken(hs256Header, `{"sub":"u1","exp":`+exp+`}x`, secret), fastUnsure, false, false},
		{"four segments", v, rawToken(hs256Header, `{"sub":"u1","exp":`+exp+`}`, secret) + ".x", fastUnsure, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := agree(t, tc.v, tc.tok); got != tc.want {
				t.Errorf("fast path: got %d, want %d", got, tc.want)
			}
			_, err := tc.v.Verify(tc.tok)
			if (err == nil) != tc.ok || errors.Is(err, ErrExpired) != tc.expired {
				t.Errorf("Verify: got %v, want ok=%v expired=%v", err, tc.ok, tc.expired)
			}
		})
	}
}

// genToken makes a random token, mostly near-valid, from pieces that
// exercise each check of the fast path.
func genToken(r *rand.Rand) string {
	// Half the tokens take the first, valid, choice of every piece but
	// one, so that all three outcomes are common.
	clean := r.IntN(2) == 0
	pick := func(xs ...string) string {
		if clean && r.IntN(8) != 0 {
			return xs[0]
		}
		return xs[r.IntN(len(xs))]
	}
	ws := func() string { return pick("", "", "", " ", "\n", "\t ") }
	header := pick(hs256Header, `{"alg":"HS256"}`, `{"typ":"JWT","alg":"HS256","kid":"k1"}`,
		`{"alg":"HS384"}`, `{"alg":"none"}`, `{"alg":"RS256"}`, `{"ALG":"HS256"}`, `{"alg":"HS256","alg":"HS256"}`,
		`{"alg":"hs256"}`, `{"alg":["HS256"]}`, `{"alg":"HS256","x":{"a":1}}`, `{"alg":"HS256"`, `[]`, ` {"alg" : "HS256"} `)
	var members []string
	add := func(k, v string) { members = append(members, ws()+`"`+k+`"`+ws()+":"+ws()+v+ws()) }
	dur := func() time.Duration {
		if clean {
			return time.Duration(r.IntN(3600)) * time.Second
		}
		return time.Duration(r.IntN(7200)-3600)*time.Second + []time.Duration{0, DefaultLeeway, -DefaultLeeway}[r.IntN(3)]
	}
	if r.IntN(20) != 0 {
		add(pick("sub", "sub", "sub", "Sub", "SUB"), pick(`"u1"`, `"user-00042"`, `"ü"`, `""`, `"a\u0001"`, `"a`+"\u0085"+`"`, `"\u0041"`, `42`, `null`, `"`+strings.Repeat("x", 129)+`"`))
	}
	if r.IntN(10) != 0 {
		e := unix(dur())
		add(pick("exp", "exp", "exp", "exp", "Exp"), pick(e, e, e, e+".0", `"`+e+`"`, "null", "1e10", "-1", e+"e0", "0"+e))
	}
	if r.IntN(4) == 0 {
		add(pick("nbf", "iat"), unix(dur()))
	}
	if r.IntN(3) == 0 {
		add(pick("iss", "iss", "ISS"), pick(`"fanfare"`, `"other"`, `""`, `1`))
	}
	if r.IntN(3) == 0 {
		add("aud", pick(`"chat"`, `"other"`, `["chat"]`, `[]`, `""`, `null`))
	}
	if r.IntN(2) == 0 {
		add(pick("lvl", "lvl", "LVL"), pick("0", "1", "2", "3", "4", "-1", `"1"`, "1.0", "null", "true", "01"))
	}
	if r.IntN(3) == 0 {
		add(pick("room", "jti", "x"), pick(`"r1"`, `1.5`, `true`, `{"a":1}`, `[1]`, `"\"q"`, `"`+"\xff"+`"`))
	}
	if r.IntN(8) == 0 && len(members) > 0 {
		members = append(members, members[r.IntN(len(members))]) // a duplicate
	}
	r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	claims := "{" + strings.Join(members, ",") + "}" + pick("", "", "", " ", "x", "{}")
	key := secret
	if r.IntN(6) == 0 {
		key = otherSecret
	}
	if clean && r.IntN(3) != 0 {
		key = secret
	}
	tok := rawToken(header, claims, key)
	switch r.IntN(24) {
	case 0:
		tok = tok[:len(tok)-1]
	case 1:
		tok += "A"
	case 2:
		tok += "="
	case 3:
		tok = strings.Replace(tok, ".", "..", 1)
	case 4:
		i := r.IntN(len(tok))
		tok = tok[:i] + "_" + tok[i+1:]
	}
	return tok
}

// TestFastPathAgrees compares the fast path with golang-jwt on generated
// tokens under several verifier configurations.
func TestFastPathAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 1))
	counts := map[fastResult]int{}
	for name, v := range verifiers(t) {
		t.Run(name, func(t *testing.T) {
			for range 600 {
				counts[agree(t, v, genToken(r))]++
			}
		})
	}
	// The generator must reach every outcome often, or it tests little.
	t.Logf("fast path outcomes (unsure, ok, bad signature): %d %d %d", counts[fastUnsure], counts[fastOK], counts[fastBadSig])
	for _, res := range []fastResult{fastOK, fastBadSig, fastUnsure} {
		if counts[res] < 100 {
			t.Errorf("only %d tokens with fast result %d of 2400: %v", counts[res], res, counts)
		}
	}
}

// FuzzFastPath checks the fast path against golang-jwt on arbitrary
// headers, claims and signatures.
func FuzzFastPath(f *testing.F) {
	exp := unix(time.Hour)
	f.Add(hs256Header, `{"sub":"u1","lvl":1,"exp":`+exp+`}`, true, "")
	f.Add(`{"alg":"HS256"}`, `{"sub":"u1","exp":`+exp+`,"aud":"chat","iss":"fanfare"}`, true, "")
	f.Add(hs256Header, `{"sub":"u1","exp":`+exp+`}`, false, "")
	f.Add(hs256Header, `{"Sub":"u1","exp":1e3}`, true, "x")
	vs := verifiers(f)
	f.Fuzz(func(t *testing.T, header, claims string, good bool, suffix string) {
		key := otherSecret
		if good {
			key = secret
		}
		tok := rawToken(header, claims, key) + suffix
		for _, v := range vs {
			agree(t, v, tok)
		}
	})
}

func BenchmarkVerifyHS256(b *testing.B) {
	v, err := NewVerifier(Config{Secret: secret, Now: clock})
	if err != nil {
		b.Fatal(err)
	}
	tok := rawToken(hs256Header, fmt.Sprintf(`{"sub":"user-00042","lvl":1,"exp":%s,"iat":%s}`, unix(time.Hour), unix(-time.Minute)), secret)
	for _, bc := range []struct {
		name   string
		verify func(string) (Claims, error)
	}{{"path=fast", v.Verify}, {"path=golang-jwt", v.verifySlow}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.verify(tok); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifications/s")
		})
	}
}
