package waitroom

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
)

// Site describes the web site a room stands in front of (docs/protocol.md
// §6.7): where a granted user goes, how the access token travels there,
// whether visitors without a user token may enter, and what the hosted
// queue page shows. Every field is optional. A Site is immutable once it
// is part of a stored RoomConfig: an update replaces it whole.
//
// It is stored with the room's configuration (JSON in the embedded
// journal and in Redis), so its size is bounded: MaxSiteBytes over all its
// strings.
type Site struct {
	// TargetURL is the absolute http(s) URL a granted user is sent to.
	TargetURL string `json:"target_url,omitempty"`
	// TokenIn is how the access token travels to TargetURL: TokenInQuery
	// (default) or TokenInCookie.
	TokenIn string `json:"token_in,omitempty"`
	// TokenName is the query parameter or cookie name; "" = DefaultTokenName.
	TokenName string `json:"token_name,omitempty"`
	// Anonymous lets visitors without a user token enter: the server gives
	// each an identity of its own bound to its ticket, tier 0.
	Anonymous bool `json:"anonymous,omitempty"`
	// Title, Text: plain text for the queue page (no HTML; the page
	// escapes it).
	Title string `json:"title,omitempty"`
	Text  string `json:"text,omitempty"`
	// LogoURL is an absolute https URL or an absolute path on the page's host.
	LogoURL string `json:"logo_url,omitempty"`
	// Colors of the page, CSS hex colours (#rgb or #rrggbb).
	Colors SiteColors `json:"colors,omitzero"`
	// Strings are the page's texts by language tag, then key.
	Strings map[string]map[string]string `json:"strings,omitempty"`
	// DefaultLang is the language of Strings used when the visitor's is
	// not there.
	DefaultLang string `json:"default_lang,omitempty"`
}

// SiteColors are the queue page's colours.
type SiteColors struct {
	Background string `json:"background,omitempty"`
	Text       string `json:"text,omitempty"`
	Accent     string `json:"accent,omitempty"`
}

// Ways an access token travels to the target (Site.TokenIn).
const (
	TokenInQuery  = "query"
	TokenInCookie = "cookie"
)

// Site bounds and defaults.
const (
	// DefaultTokenName is the query parameter or cookie carrying the access token.
	DefaultTokenName = "fanfare_access"
	// MaxSiteBytes bounds the sum of a Site's string lengths (keys included).
	MaxSiteBytes = 16 << 10
	// MaxSiteURLBytes bounds TargetURL and LogoURL.
	MaxSiteURLBytes = 2048
	// MaxSiteTitleBytes and MaxSiteTextBytes bound Title and Text.
	MaxSiteTitleBytes = 200
	MaxSiteTextBytes  = 2000
	// MaxSiteLangs bounds the languages of Strings, MaxSiteKeys the keys
	// of one language, MaxSiteStringBytes one string.
	MaxSiteLangs       = 16
	MaxSiteKeys        = 64
	MaxSiteStringBytes = 500
)

var (
	siteColorRE = regexp.MustCompile(`^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$`)
	// A cookie or query name: an RFC 6265 token, kept to a safe subset.
	siteTokenNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	// A language tag (BCP 47 shape, loosely) and a string key.
	siteLangRE = regexp.MustCompile(`^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8}){0,3}$`)
	siteKeyRE  = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)
)

// Empty reports whether s sets nothing (a room without a site).
func (s *Site) Empty() bool {
	return s == nil || (s.TargetURL == "" && s.TokenIn == "" && s.TokenName == "" && !s.Anonymous &&
		s.Title == "" && s.Text == "" && s.LogoURL == "" && s.Colors == SiteColors{} && len(s.Strings) == 0 &&
		s.DefaultLang == "")
}

// AllowsAnonymous reports whether visitors without a user token may enter.
func (s *Site) AllowsAnonymous() bool { return s != nil && s.Anonymous }

// CookieToken reports whether the access token travels in a cookie.
func (s *Site) CookieToken() bool { return s != nil && s.TokenIn == TokenInCookie }

// Name returns the token's query parameter or cookie name.
func (s *Site) Name() string {
	if s == nil || s.TokenName == "" {
		return DefaultTokenName
	}
	return s.TokenName
}

// Validate reports every problem with s at once; a nil Site is valid.
func (s *Site) Validate() error {
	if s == nil {
		return nil
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("waitroom: site."+format, a...)) }
	if s.TargetURL != "" {
		if err := checkURL(s.TargetURL, false); err != nil {
			bad("target_url: %v", err)
		}
	}
	switch s.TokenIn {
	case "", TokenInQuery, TokenInCookie:
	default:
		bad("token_in %q: must be %q or %q", s.TokenIn, TokenInQuery, TokenInCookie)
	}
	if s.TokenName != "" && !siteTokenNameRE.MatchString(s.TokenName) {
		bad("token_name %q: 1-64 of [A-Za-z0-9_.-]", s.TokenName)
	}
	if err := checkText(s.Title, MaxSiteTitleBytes, false); err != nil {
		bad("title: %v", err)
	}
	if err := checkText(s.Text, MaxSiteTextBytes, true); err != nil {
		bad("text: %v", err)
	}
	if s.LogoURL != "" {
		if err := checkURL(s.LogoURL, true); err != nil {
			bad("logo_url: %v", err)
		}
	}
	for name, c := range map[string]string{"background": s.Colors.Background, "text": s.Colors.Text, "accent": s.Colors.Accent} {
		if c != "" && !siteColorRE.MatchString(c) {
			bad("colors.%s %q: a CSS hex colour #rgb or #rrggbb", name, c)
		}
	}
	if len(s.Strings) > MaxSiteLangs {
		bad("strings: %d languages, at most %d", len(s.Strings), MaxSiteLangs)
	}
	for lang, kv := range s.Strings {
		if !siteLangRE.MatchString(lang) {
			bad("strings: language %q is not a language tag (en, pt-BR)", trunc(lang))
			continue
		}
		if len(kv) > MaxSiteKeys {
			bad("strings.%s: %d keys, at most %d", lang, len(kv), MaxSiteKeys)
		}
		for k, v := range kv {
			if !siteKeyRE.MatchString(k) {
				bad("strings.%s: key %q: 1-64 of [a-z0-9_]", lang, trunc(k))
				continue
			}
			if err := checkText(v, MaxSiteStringBytes, true); err != nil {
				bad("strings.%s.%s: %v", lang, k, err)
			}
		}
	}
	if s.DefaultLang != "" && !siteLangRE.MatchString(s.DefaultLang) {
		bad("default_lang %q is not a language tag", trunc(s.DefaultLang))
	}
	if n := s.size(); n > MaxSiteBytes {
		bad(": %d bytes of text, at most %d", n, MaxSiteBytes)
	}
	return errors.Join(errs...)
}

// size is the sum of s's string lengths, keys included.
func (s *Site) size() int {
	n := len(s.TargetURL) + len(s.TokenIn) + len(s.TokenName) + len(s.Title) + len(s.Text) + len(s.LogoURL) +
		len(s.Colors.Background) + len(s.Colors.Text) + len(s.Colors.Accent) + len(s.DefaultLang)
	for lang, kv := range s.Strings {
		n += len(lang)
		for k, v := range kv {
			n += len(k) + len(v)
		}
	}
	return n
}

func trunc(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

// checkText: valid UTF-8, at most max bytes, no control characters but
// (when lines) newlines and tabs.
func checkText(s string, max int, lines bool) error {
	if len(s) > max {
		return fmt.Errorf("%d bytes, at most %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return errors.New("invalid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) && !(lines && (r == '\n' || r == '\t')) {
			return fmt.Errorf("control character %U", r)
		}
	}
	return nil
}

// checkURL accepts an absolute http(s) URL (https only when pathOK, which
// also accepts an absolute path "/..." but not "//host").
func checkURL(raw string, pathOK bool) error {
	if len(raw) > MaxSiteURLBytes {
		return fmt.Errorf("%d bytes, at most %d", len(raw), MaxSiteURLBytes)
	}
	if strings.ContainsFunc(raw, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '\\' }) {
		return errors.New("spaces, control characters and backslashes are not allowed")
	}
	if pathOK && strings.HasPrefix(raw, "/") {
		if strings.HasPrefix(raw, "//") {
			return errors.New("a path must not start with //")
		}
		if _, err := url.Parse(raw); err != nil {
			return err
		}
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	switch {
	case pathOK && u.Scheme != "https":
		return errors.New("must be an https URL or an absolute path")
	case !pathOK && u.Scheme != "http" && u.Scheme != "https":
		return errors.New("must be an absolute http or https URL")
	case u.Host == "" || u.Opaque != "":
		return errors.New("must name a host")
	case u.User != nil:
		return errors.New("must not carry user info")
	case u.Fragment != "":
		return errors.New("must not carry a fragment")
	}
	return nil
}

// AccessLeeway is the clock skew VerifyAccess allows on an access token's expiry.
const AccessLeeway = 5 * time.Second

// VerifyAccess checks an access token this node's signer issued and that
// it is for room (GET /rooms/{room}/verify).
func (m *Manager) VerifyAccess(token, room string) (*roomtoken.Claims, error) {
	return m.signer.Verify(token, room, AccessLeeway)
}
