package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

func TestBenchRoomReportsWaitsPerLevel(t *testing.T) {
	var out bytes.Buffer
	args := []string{"bench", "room", "-normal", "2000", "-vips", "300", "-spread", "20s", "-admit-rate", "5", "-max-wait", "3m", "-json"}
	if err := run(context.Background(), args, func(string) string { return "" }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var r struct {
		PerLevel []struct {
			Count    int
			P50, Max time.Duration
		}
		MaxNormalWait, MaxWait             time.Duration
		Overdue, Admissions                int
		Violations, RejectedFull, Capacity int
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.Bytes())
	}
	// The max-wait guarantee: every entrant is admitted or refused
	// room_full at entry (2,300 users at 5/s do not fit in 3 minutes),
	// and nobody admitted waited past max_wait.
	if r.Admissions+r.RejectedFull != 2300 || r.RejectedFull == 0 || r.Violations != 0 {
		t.Fatalf("got %d admissions, %d refused, %d violations; want 2300 in all, some refused, none late", r.Admissions, r.RejectedFull, r.Violations)
	}
	// VIPs wait less than normal users, higher levels least.
	if !(r.PerLevel[3].P50 < r.PerLevel[1].P50 && r.PerLevel[1].P50 < r.PerLevel[0].P50) {
		t.Errorf("p50 waits by level %v, %v, %v: want VIP3 < VIP1 < normal", r.PerLevel[3].P50, r.PerLevel[1].P50, r.PerLevel[0].P50)
	}
	// The max-wait guarantee: nobody waits longer than max_wait plus the
	// time to admit those already overdue at 5/s.
	if bound := r.MaxWait + time.Duration(r.Overdue)*time.Second/5 + time.Second; r.MaxNormalWait > bound {
		t.Errorf("longest normal wait %v beyond %v", r.MaxNormalWait, bound)
	}
}
