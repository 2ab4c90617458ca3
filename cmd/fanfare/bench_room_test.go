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
		MaxNormalWait, MaxWait time.Duration
		Overdue, Admissions    int
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.Bytes())
	}
	if r.Admissions != 2300 || r.PerLevel[0].Count != 2000 {
		t.Fatalf("got %d admissions, %d normal; want 2300, 2000", r.Admissions, r.PerLevel[0].Count)
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
