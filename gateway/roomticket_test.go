package gateway

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRoomTickets: a ticket verifies for its room until it expires and
// names its uid, tier and anonymity; a forged, truncated, re-signed,
// other-room, expired or oversized one is ErrBadTicket (401).
func TestRoomTickets(t *testing.T) {
	key := bytes.Repeat([]byte("k"), 32)
	rt, err := NewRoomTickets(key, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewRoomTickets(bytes.Repeat([]byte("o"), 32), time.Hour)
	now := time.Unix(1_800_000_000, 0)
	tok := rt.Sign(RoomTicket{Room: "sale", UID: "alice", Tier: 2}, now)
	anon := rt.Sign(RoomTicket{Room: "sale", UID: "anon:00ff", Anonymous: true}, now)

	got, err := rt.Verify(tok, "sale", now.Add(59*time.Minute))
	if err != nil || got.UID != "alice" || got.Tier != 2 || got.Anonymous || got.Room != "sale" || !got.Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("verify: %+v, %v", got, err)
	}
	if a, err := rt.Verify(anon, "sale", now); err != nil || !a.Anonymous || a.Tier != 0 || a.UID != "anon:00ff" {
		t.Fatalf("anonymous ticket: %+v, %v", a, err)
	}
	// A payload with a changed tier, signed with the wrong key.
	parts := strings.Split(tok, ".")
	p, _ := base64.RawURLEncoding.DecodeString(parts[1])
	p[0] = 3
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString(p) + "." + parts[2]
	bad := map[string]struct {
		tok, room string
		at        time.Time
	}{
		"other room":        {tok, "other", now},
		"expired":           {tok, "sale", now.Add(time.Hour)},
		"other key":         {other.Sign(RoomTicket{Room: "sale", UID: "alice"}, now), "sale", now},
		"tampered payload":  {tampered, "sale", now},
		"truncated mac":     {tok[:len(tok)-4], "sale", now},
		"no mac":            {parts[0] + "." + parts[1], "sale", now},
		"empty":             {"", "sale", now},
		"wrong version":     {"ft2." + parts[1] + "." + parts[2], "sale", now},
		"not base64":        {"ft1.%%%.%%%", "sale", now},
		"oversized":         {"ft1." + strings.Repeat("A", MaxTicketBytes) + ".x", "sale", now},
		"mac of the prefix": {"ft1.." + parts[2], "sale", now},
	}
	for name, c := range bad {
		if _, err := rt.Verify(c.tok, c.room, c.at); !errors.Is(err, ErrBadTicket) || !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: got %v, want ErrBadTicket", name, err)
		}
	}
	if _, err := NewRoomTickets(key[:31], 0); err == nil {
		t.Error("a 31-byte key was accepted")
	}
	if _, err := NewRoomTickets(key, time.Second); err == nil {
		t.Error("a 1 s lifetime was accepted")
	}
	k1, _ := DeriveTicketKey([]byte("secret-of-the-access-tokens-0123456789"))
	k2, _ := DeriveTicketKey([]byte("secret-of-the-access-tokens-0123456780"))
	if len(k1) != 32 || bytes.Equal(k1, k2) || bytes.Contains([]byte("secret-of-the-access-tokens-0123456789"), k1) {
		t.Errorf("derived keys: %x %x", k1, k2)
	}
}

// TestPollAfter: the suggested interval is short at the head, longer deep
// in the queue, bounded, jittered by at most 20%.
func TestPollAfter(t *testing.T) {
	rs := &Rooms{pollMin: time.Second, pollMax: 20 * time.Second, pollGrace: 10 * time.Second}
	cases := []struct {
		name   string
		u      waitroomUpdate
		lo, hi time.Duration
	}{
		{"head, paused", queueAt(0, "paused", 0), 800 * time.Millisecond, 1200 * time.Millisecond},
		{"near head", queueAt(50, "waiting", 10*time.Second), 800 * time.Millisecond, 1200 * time.Millisecond},
		{"middle", queueAt(5000, "waiting", 200*time.Second), 8 * time.Second, 12 * time.Second},
		{"deep", queueAt(500000, "waiting", 5*time.Hour), 16 * time.Second, 24 * time.Second},
		{"paused", queueAt(500, "paused", 0), 8 * time.Second, 12 * time.Second},
		{"granted", granted(), 16 * time.Second, 24 * time.Second},
		{"rejected", rejected(3 * time.Second), 2400 * time.Millisecond, 3600 * time.Millisecond},
	}
	for _, c := range cases {
		for range 50 {
			if d := rs.pollAfter(c.u); d < c.lo || d > c.hi {
				t.Fatalf("%s: got %v, want in [%v, %v]", c.name, d, c.lo, c.hi)
			}
		}
	}
	if got := rs.pollTimeout(5 * time.Second); got != 20*time.Second {
		t.Errorf("timeout of a 5 s interval: got %v, want 20s", got)
	}
}
