package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMaxConnsPerIPDefault: a public port caps connections per address by
// default, loopback excepted (a proxy on the host, load generators).
func TestMaxConnsPerIPDefault(t *testing.T) {
	cfg, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConnsPerIP != defaultMaxConnsPerIP || defaultMaxConnsPerIP <= 0 {
		t.Fatalf("got -max-conns-per-ip %d by default, want %d (> 0)", cfg.MaxConnsPerIP, defaultMaxConnsPerIP)
	}
	ex, err := cfg.ipCapExempt()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"127.0.0.1", "::1"} {
		if !slices.ContainsFunc(ex, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr(a)) }) {
			t.Errorf("%s is not exempt by default (got %v)", a, ex)
		}
	}
	if slices.ContainsFunc(ex, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr("203.0.113.7")) }) {
		t.Errorf("a public address is exempt by default (got %v)", ex)
	}
	if _, err := loadConfig([]string{"-max-conns-per-ip-exempt", "10.0.0.0/33"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("a malformed exemption was accepted")
	}
}

// TestMaxConnsPerIPAtAccept: past -max-conns-per-ip, a connection is
// answered 429 at accept, before it sends its request.
func TestMaxConnsPerIPAtAccept(t *testing.T) {
	// The cap does not depend on the store: embedded mode only.
	ts := startServer(t, "embedded", "-max-conns-per-ip", "2", "-max-conns-per-ip-exempt", "")
	addr := strings.TrimPrefix(ts.ws, "ws://")
	for range 2 { // handshakes in progress count
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
	}
	time.Sleep(50 * time.Millisecond) // accepted
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("3rd connection from one address, nothing sent: got %v (%v), want 429 at once", resp, err)
	}
}
