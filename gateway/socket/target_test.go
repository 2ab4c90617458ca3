package socket

import (
	"net/url"
	"testing"
)

// targetAgrees checks parseTarget and queryCredentials against the
// net/url functions they stand in for.
func targetAgrees(t *testing.T, uri string) {
	t.Helper()
	if p, q, ok := parseTarget([]byte(uri)); ok {
		u, err := url.ParseRequestURI(uri)
		if err != nil {
			t.Fatalf("parseTarget(%q) took it, url.ParseRequestURI refuses it: %v", uri, err)
		}
		if string(p) != u.Path || string(q) != u.RawQuery {
			t.Fatalf("parseTarget(%q) = %q, %q; url: %q, %q", uri, p, q, u.Path, u.RawQuery)
		}
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return
	}
	if tok, tic, ok := queryCredentials(u.RawQuery); ok {
		v, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			t.Fatalf("queryCredentials(%q) took it, url.ParseQuery refuses it: %v", u.RawQuery, err)
		}
		if tok != v.Get("token") || tic != v.Get("ticket") {
			t.Fatalf("queryCredentials(%q) = %q, %q; url: %q, %q", u.RawQuery, tok, tic, v.Get("token"), v.Get("ticket"))
		}
	}
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		uri           string
		path, query   string
		ok            bool
		token, ticket string
	}{
		{"/ws", "/ws", "", true, "", ""},
		{"/ws?token=abc.def-_", "/ws", "token=abc.def-_", true, "abc.def-_", ""},
		{"/ws?", "/ws", "", true, "", ""},
		{"/rooms/a/ws?ticket=t1&token=&x=1", "/rooms/a/ws", "ticket=t1&token=&x=1", true, "", "t1"},
		{"/ws?token=a&token=b", "/ws", "token=a&token=b", true, "a", ""},
		{"/ws?token", "/ws", "token", true, "", ""},
		{"/ws?a=1?b=2", "/ws", "a=1?b=2", true, "", ""},
		{"//host/ws", "//host/ws", "", true, "", ""},
		{"/w%73", "", "", false, "", ""},
		{"ws", "", "", false, "", ""},
		{"http://h/ws", "", "", false, "", ""},
		{"/ws\x7f", "", "", false, "", ""},
	} {
		p, q, ok := parseTarget([]byte(tc.uri))
		if ok != tc.ok || string(p) != tc.path || string(q) != tc.query {
			t.Errorf("parseTarget(%q) = %q, %q, %v; want %q, %q, %v", tc.uri, p, q, ok, tc.path, tc.query, tc.ok)
		}
		if ok {
			tok, tic, qok := queryCredentials(string(q))
			if !qok || tok != tc.token || tic != tc.ticket {
				t.Errorf("queryCredentials(%q) = %q, %q, %v; want %q, %q", q, tok, tic, qok, tc.token, tc.ticket)
			}
		}
		targetAgrees(t, tc.uri)
	}
	for _, q := range []string{"token=a%20b", "token=a+b", "token=a;b=c"} {
		if _, _, ok := queryCredentials(q); ok {
			t.Errorf("queryCredentials(%q) decided; want it left to url.ParseQuery", q)
		}
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"/ws?token=a&ticket=b", "/ws?token=a%2", "/x;y?token=1;2", "//a?b", "/ws?=&&token=x=y"} {
		f.Add(s)
	}
	f.Fuzz(targetAgrees)
}
