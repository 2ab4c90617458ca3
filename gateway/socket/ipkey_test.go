package socket

import (
	"net/netip"
	"testing"
)

// IPv6 addresses count per IPv6CapPrefix block for the per-IP cap (one
// host holds a whole /64), IPv4 per address, IPv4-mapped IPv6 as IPv4.
func TestIPKey(t *testing.T) {
	key := func(s string, bits int) netip.Addr { return ipKey(netip.MustParseAddr(s), bits) }
	if a, b := key("2001:db8:1:2::1", 64), key("2001:db8:1:2:ffff:ffff:ffff:ffff", 64); a != b {
		t.Errorf("one /64: keys %s and %s, want one", a, b)
	}
	if a, b := key("2001:db8:1:2::1", 64), key("2001:db8:1:3::1", 64); a == b {
		t.Errorf("two /64s share the key %s", a)
	}
	if a, b := key("2001:db8:1:2::1", 128), key("2001:db8:1:2::2", 128); a == b {
		t.Errorf("prefix 128: two addresses share the key %s", a)
	}
	if a, b := key("2001:db8:1:2::1", 48), key("2001:db8:1:ff::1", 48); a != b {
		t.Errorf("one /48: keys %s and %s, want one", a, b)
	}
	if a, b := key("192.0.2.7", 64), key("192.0.2.8", 64); a == b || a != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("IPv4: keys %s and %s, want each address itself", a, b)
	}
	if a := key("::ffff:192.0.2.7", 64); a != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("IPv4-mapped: key %s, want 192.0.2.7", a)
	}
	if a, b := key("fe80::1%eth0", 64), key("fe80::2%eth1", 64); a != b {
		t.Errorf("zones: keys %s and %s, want one /64", a, b)
	}
	if testing.AllocsPerRun(100, func() { key("2001:db8:1:2::1", 64) }) != 0 {
		t.Error("ipKey allocates")
	}
}

func TestIPv6CapPrefixBounds(t *testing.T) {
	for _, tc := range []struct {
		bits int
		ok   bool
	}{{0, true}, {15, false}, {16, true}, {64, true}, {128, true}, {129, false}, {-1, false}} {
		c := Config{IPv6CapPrefix: tc.bits}
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("IPv6CapPrefix %d: got %v, want ok=%v", tc.bits, err, tc.ok)
		}
	}
}
