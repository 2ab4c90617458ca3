package socket

import (
	"testing"
	"unsafe"
)

// TestConnSize keeps Conn within the 384-byte allocation size class: one
// is held per open connection, and the next class up is 416 bytes.
func TestConnSize(t *testing.T) {
	if n := unsafe.Sizeof(Conn{}); n > 384 {
		t.Fatalf("socket.Conn is %d bytes, want at most 384 (the size class it is allocated in)", n)
	}
}
