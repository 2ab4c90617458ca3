package gateway

import (
	"testing"
	"unsafe"
)

// TestSessionSize keeps the chat session, held by every open connection,
// in the 24-byte allocation size class (the next is 32).
func TestSessionSize(t *testing.T) {
	if n := unsafe.Sizeof(session{}); n > 24 {
		t.Fatalf("gateway.session is %d bytes, want at most 24", n)
	}
}
