package socket

import "encoding/binary"

// Incremental UTF-8 validation (RFC 3629: no surrogates, nothing above
// U+10FFFF, no overlong forms) as a DFA over byte classes, after Bjoern
// Hoehrmann's decoder. The state survives between calls, so a text message
// split across frames and reads is validated as it arrives and rejected at
// the first byte that no valid continuation could follow (fail-fast), which
// utf8.Valid on complete messages cannot do.

const (
	utf8Accept uint8 = 0
	utf8Reject uint8 = 12
)

// utf8d maps a byte to its class (first 256 entries), then a state plus a
// class to the next state.
var utf8d = [...]uint8{
	// 0x00-0x7f
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	// 0x80-0xff
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9,
	7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
	8, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
	10, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 3, 3, 11, 6, 6, 6, 5, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8,
	// transitions: state (multiple of 12) + class
	0, 12, 24, 36, 60, 96, 84, 12, 12, 12, 48, 72, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12,
	12, 0, 12, 12, 12, 12, 12, 0, 12, 0, 12, 12, 12, 24, 12, 12, 12, 12, 12, 24, 12, 24, 12, 12,
	12, 12, 12, 12, 12, 12, 12, 24, 12, 12, 12, 12, 12, 24, 12, 12, 12, 12, 12, 12, 12, 24, 12, 12,
	12, 12, 12, 12, 12, 12, 12, 36, 12, 36, 12, 12, 12, 36, 12, 12, 12, 12, 12, 36, 12, 36, 12, 12,
	12, 36, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12,
}

// utf8Step advances the validator state over b. It returns utf8Reject as
// soon as b cannot be part of valid UTF-8; utf8Accept means b ended on a
// character boundary; anything else means a sequence is incomplete.
func utf8Step(state uint8, b []byte) uint8 {
	i := 0
	for i < len(b) {
		if state == utf8Accept {
			// ASCII fast path: eight bytes at a time while on a boundary.
			for i+8 <= len(b) && binary.LittleEndian.Uint64(b[i:])&0x8080808080808080 == 0 {
				i += 8
			}
			for i < len(b) && b[i] < 0x80 {
				i++
			}
			if i == len(b) {
				return state
			}
		}
		state = utf8d[256+int(state)+int(utf8d[b[i]])]
		if state == utf8Reject {
			return state
		}
		i++
	}
	return state
}
