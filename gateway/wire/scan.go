package wire

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner is a strict, allocation-free JSON tokenizer over one input. It
// validates as it goes (RFC 8259 grammar, UTF-8 in strings, nesting depth)
// and hands out raw value spans that alias the input.
type scanner struct {
	data  []byte
	pos   int
	depth int
	// pairs refuses \u escapes of UTF-16 surrogates that are not a high
	// one followed by a low one (client frames: a lone surrogate would be
	// stored and relayed as is, and many JSON readers reject it; server
	// frames are read leniently, unquote turns one into U+FFFD).
	pairs bool
	// why describes the first syntax error; errPos is where it was found.
	why    string
	errPos int
}

// errSyntax is the internal marker of a syntax failure; the scanner's why
// and errPos say what and where.
type syntaxMarker struct{}

func (syntaxMarker) Error() string { return "syntax" }

var errSyntaxMarker error = syntaxMarker{}

func (s *scanner) fail(why string) error {
	if s.why == "" {
		s.why = why
		s.errPos = s.pos
	}
	return errSyntaxMarker
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// eof reports whether only whitespace is left.
func (s *scanner) eof() bool {
	s.ws()
	return s.pos == len(s.data)
}

// beginObject consumes '{' (after whitespace) and enters one nesting level.
func (s *scanner) beginObject() error {
	s.ws()
	if s.pos >= len(s.data) {
		return s.fail("unexpected end of input")
	}
	if s.data[s.pos] != '{' {
		return s.fail("expected an object")
	}
	return s.enter()
}

func (s *scanner) enter() error {
	s.depth++
	if s.depth > MaxDepth {
		return s.fail("nested too deep")
	}
	s.pos++
	return nil
}

// objectNext moves to the next member of an object whose '{' was consumed;
// n is the number of members read so far. It returns the member's raw key
// (without quotes, escapes not decoded) positioned at the value, or ok false
// after consuming the closing '}'.
func (s *scanner) objectNext(n int) (key []byte, ok bool, err error) {
	s.ws()
	if s.pos >= len(s.data) {
		return nil, false, s.fail("unexpected end of input")
	}
	c := s.data[s.pos]
	if c == '}' {
		s.pos++
		s.depth--
		return nil, false, nil
	}
	if n > 0 {
		if c != ',' {
			return nil, false, s.fail("expected ',' or '}'")
		}
		s.pos++
		s.ws()
	}
	if s.pos >= len(s.data) || s.data[s.pos] != '"' {
		return nil, false, s.fail("expected a string key")
	}
	raw, err := s.str()
	if err != nil {
		return nil, false, err
	}
	s.ws()
	if s.pos >= len(s.data) || s.data[s.pos] != ':' {
		return nil, false, s.fail("expected ':'")
	}
	s.pos++
	s.ws()
	return raw[1 : len(raw)-1], true, nil
}

// arrayNext moves to the next element of an array whose '[' was consumed;
// n is the number of elements read so far. ok is false after the closing
// ']' was consumed.
func (s *scanner) arrayNext(n int) (ok bool, err error) {
	s.ws()
	if s.pos >= len(s.data) {
		return false, s.fail("unexpected end of input")
	}
	c := s.data[s.pos]
	if c == ']' {
		s.pos++
		s.depth--
		return false, nil
	}
	if n > 0 {
		if c != ',' {
			return false, s.fail("expected ',' or ']'")
		}
		s.pos++
		s.ws()
	}
	return true, nil
}

// array walks the array at the current position, calling each with every
// element's index once the scanner stands on that element; each must
// consume the element. With nullOK, null is accepted in its place: null
// is then true and each is not called.
func (s *scanner) array(nullOK bool, each func(n int) error) (null bool, err error) {
	s.ws()
	if nullOK && s.pos < len(s.data) && s.data[s.pos] == 'n' {
		_, err := s.literal("null")
		return true, err
	}
	if err := s.beginArray(); err != nil {
		return false, err
	}
	for n := 0; ; n++ {
		ok, err := s.arrayNext(n)
		if err != nil {
			return false, err
		}
		if !ok {
			return false, nil
		}
		if err := each(n); err != nil {
			return false, err
		}
	}
}

// beginArray consumes '[' (after whitespace).
func (s *scanner) beginArray() error {
	s.ws()
	if s.pos >= len(s.data) || s.data[s.pos] != '[' {
		return s.fail("expected an array")
	}
	return s.enter()
}

// value validates the value at the current position and returns its raw
// bytes (strings with their quotes).
func (s *scanner) value() ([]byte, error) {
	s.ws()
	if s.pos >= len(s.data) {
		return nil, s.fail("unexpected end of input")
	}
	start := s.pos
	switch c := s.data[s.pos]; c {
	case '{':
		if err := s.enter(); err != nil {
			return nil, err
		}
		for n := 0; ; n++ {
			_, ok, err := s.objectNext(n)
			if err != nil {
				return nil, err
			}
			if !ok {
				break
			}
			if _, err := s.value(); err != nil {
				return nil, err
			}
		}
	case '[':
		if _, err := s.array(false, func(int) error { _, err := s.value(); return err }); err != nil {
			return nil, err
		}
	case '"':
		return s.str()
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return s.number()
		}
		return nil, s.fail("invalid character")
	}
	return s.data[start:s.pos], nil
}

func (s *scanner) literal(lit string) ([]byte, error) {
	if len(s.data)-s.pos < len(lit) || string(s.data[s.pos:s.pos+len(lit)]) != lit {
		return nil, s.fail("invalid literal")
	}
	start := s.pos
	s.pos += len(lit)
	return s.data[start:s.pos], nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (s *scanner) number() ([]byte, error) {
	d, start := s.data, s.pos
	i := s.pos
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		s.pos = i
		return nil, s.fail("invalid number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			s.pos = i
			return nil, s.fail("invalid number")
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			s.pos = i
			return nil, s.fail("invalid number")
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	s.pos = i
	return d[start:i], nil
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// str validates the string starting at the current '"' and returns it with
// its quotes.
func (s *scanner) str() ([]byte, error) {
	d, start := s.data, s.pos
	i := s.pos + 1
	for i < len(d) {
		c := d[i]
		switch {
		case c == '"':
			s.pos = i + 1
			return d[start:s.pos], nil
		case c == '\\':
			if i+1 >= len(d) {
				s.pos = i
				return nil, s.fail("unexpected end of input")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if !isHex4(d, i) {
					s.pos = i
					return nil, s.fail("invalid escape")
				}
				if r := rune(hex4(d[i+2:])); s.pairs && utf16.IsSurrogate(r) {
					if r >= 0xdc00 || !isHex4(d, i+6) || d[i+6] != '\\' || d[i+7] != 'u' ||
						!isLowSurrogate(rune(hex4(d[i+8:]))) {
						s.pos = i
						return nil, s.fail("unpaired UTF-16 surrogate escape")
					}
					i += 6
				}
				i += 6
			default:
				s.pos = i
				return nil, s.fail("invalid escape")
			}
		case c < 0x20:
			s.pos = i
			return nil, s.fail("control character in string")
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				s.pos = i
				return nil, s.fail("invalid UTF-8")
			}
			i += size
		}
	}
	s.pos = i
	return nil, s.fail("unexpected end of input")
}

// unquote decodes a raw JSON string (with quotes) that str validated. Lone
// surrogates become U+FFFD, as encoding/json does.
func unquote(raw []byte) string {
	body := raw[1 : len(raw)-1]
	if bytes.IndexByte(body, '\\') < 0 {
		return string(body)
	}
	return string(appendUnescaped(make([]byte, 0, len(body)), body))
}

// appendUnescaped appends the decoded content of a validated raw JSON
// string body (without quotes) to dst.
func appendUnescaped(dst, body []byte) []byte {
	for i := 0; i < len(body); {
		c := body[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch body[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := rune(hex4(body[i+2:]))
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if i+6 <= len(body) && body[i] == '\\' && body[i+1] == 'u' {
					r2 = utf16.DecodeRune(r, rune(hex4(body[i+2:])))
				}
				if r2 != utf8.RuneError {
					i += 6
					r = r2
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, body[i+1])
		}
		i += 2
	}
	return dst
}

// isHex4 reports whether the four bytes after d[i:i+2] (a \u the caller
// checks) are hex digits.
func isHex4(d []byte, i int) bool {
	return i+6 <= len(d) && isHex(d[i+2]) && isHex(d[i+3]) && isHex(d[i+4]) && isHex(d[i+5])
}

func isLowSurrogate(r rune) bool { return r >= 0xdc00 && r <= 0xdfff }

func hex4(b []byte) uint16 {
	var v uint16
	for _, c := range b[:4] {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= uint16(c - '0')
		case c >= 'a' && c <= 'f':
			v |= uint16(c - 'a' + 10)
		default:
			v |= uint16(c - 'A' + 10)
		}
	}
	return v
}

// canonKey returns the key with escapes decoded. It allocates only for keys
// that contain escapes, which well-behaved clients never send.
func canonKey(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	return appendUnescaped(nil, raw)
}

// parseInt parses a validated JSON number that must be an integer literal
// within int64.
func parseInt(raw []byte) (int64, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	neg := raw[0] == '-'
	i := 0
	if neg {
		i = 1
	}
	if i >= len(raw) {
		return 0, false
	}
	var v uint64
	for ; i < len(raw); i++ {
		c := raw[i]
		if !isDigit(c) {
			return 0, false
		}
		if v > (1<<63)/10 {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
		if v > 1<<63 {
			return 0, false
		}
	}
	if neg {
		return -int64(v), true // -(1<<63) wraps to itself: correct
	}
	if v > 1<<63-1 {
		return 0, false
	}
	return int64(v), true
}
