package waitroom_test

import (
	"strings"
	"testing"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// TestSiteValidate: each field at and past its bound; every problem is
// reported at once.
func TestSiteValidate(t *testing.T) {
	ok := func(s waitroom.Site) *waitroom.Site { return &s }
	cases := []struct {
		name string
		site *waitroom.Site
		want string // "" = valid
	}{
		{"nil", nil, ""},
		{"full", ok(waitroom.Site{TargetURL: "https://shop.example/a?b=c", TokenIn: "cookie", TokenName: "tok",
			Anonymous: true, Title: "Sale", Text: "line 1\nline 2", LogoURL: "/logo.png",
			Colors:  waitroom.SiteColors{Background: "#fff", Text: "#000000", Accent: "#FF0066"},
			Strings: map[string]map[string]string{"en": {"position": "You are {position}"}, "pt-BR": {"eta": "x"}}, DefaultLang: "en"}), ""},
		{"http target", ok(waitroom.Site{TargetURL: "http://localhost:3000/"}), ""},
		{"relative target", ok(waitroom.Site{TargetURL: "/checkout"}), "target_url"},
		{"javascript target", ok(waitroom.Site{TargetURL: "javascript:alert(1)"}), "target_url"},
		{"target with user", ok(waitroom.Site{TargetURL: "https://u:p@shop.example/"}), "user info"},
		{"target with fragment", ok(waitroom.Site{TargetURL: "https://shop.example/#x"}), "fragment"},
		{"target with space", ok(waitroom.Site{TargetURL: "https://shop.example/a b"}), "spaces"},
		{"long target", ok(waitroom.Site{TargetURL: "https://shop.example/" + strings.Repeat("a", 2048)}), "at most 2048"},
		{"token_in", ok(waitroom.Site{TokenIn: "header"}), "token_in"},
		{"token_name", ok(waitroom.Site{TokenName: "a b"}), "token_name"},
		{"title too long", ok(waitroom.Site{Title: strings.Repeat("t", 201)}), "title"},
		{"title at bound", ok(waitroom.Site{Title: strings.Repeat("t", 200)}), ""},
		{"title newline", ok(waitroom.Site{Title: "a\nb"}), "control character"},
		{"text NUL", ok(waitroom.Site{Text: "a\x00"}), "control character"},
		{"bad UTF-8", ok(waitroom.Site{Text: "\xff"}), "UTF-8"},
		{"http logo", ok(waitroom.Site{LogoURL: "http://cdn.example/l.png"}), "https"},
		{"protocol-relative logo", ok(waitroom.Site{LogoURL: "//evil.example/l.png"}), "//"},
		{"colour name", ok(waitroom.Site{Colors: waitroom.SiteColors{Accent: "red"}}), "colors.accent"},
		{"colour css", ok(waitroom.Site{Colors: waitroom.SiteColors{Text: "#fff;background:url(x)"}}), "colors.text"},
		{"language", ok(waitroom.Site{Strings: map[string]map[string]string{"<b>": {"k": "v"}}}), "language"},
		{"key", ok(waitroom.Site{Strings: map[string]map[string]string{"en": {"Bad-Key": "v"}}}), "key"},
		{"string too long", ok(waitroom.Site{Strings: map[string]map[string]string{"en": {"k": strings.Repeat("s", 501)}}}), "strings.en.k"},
		{"too many languages", ok(waitroom.Site{Strings: langs(17)}), "17 languages"},
		{"total size", ok(waitroom.Site{Strings: langs(16), Text: strings.Repeat("x", 2000)}), "bytes of text"},
		{"default_lang", ok(waitroom.Site{DefaultLang: "e"}), "default_lang"},
	}
	for _, c := range cases {
		err := c.site.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: got %v, want valid", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want an error naming %q", c.name, err, c.want)
		}
	}
	// Every problem at once.
	err := (&waitroom.Site{TokenIn: "x", TokenName: "a b", LogoURL: "ftp://x"}).Validate()
	for _, w := range []string{"token_in", "token_name", "logo_url"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("joined errors %v: missing %s", err, w)
		}
	}
	// A room's Validate includes its site's.
	rc := waitroom.RoomConfig{Name: "r", Site: &waitroom.Site{TokenIn: "x"}}.WithDefaults()
	if err := rc.Validate(); err == nil || !strings.Contains(err.Error(), "site.token_in") {
		t.Errorf("room validate: %v", err)
	}
}

// langs is n languages of 60 keys of 16 bytes each.
func langs(n int) map[string]map[string]string {
	out := make(map[string]map[string]string, n)
	for i := range n {
		kv := make(map[string]string, 60)
		for k := range 60 {
			kv["k"+strings.Repeat("x", k%5)+string(rune('a'+k%26))+string(rune('a'+k/26))] = strings.Repeat("v", 16)
		}
		out["l"+string(rune('a'+i))+"x"] = kv
	}
	return out
}
