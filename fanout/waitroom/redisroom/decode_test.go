package redisroom

import (
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// TestDecodeEntry: the fields of an entry as the scripts write it, and
// entries it must refuse.
func TestDecodeEntry(t *testing.T) {
	e, err := decodeEntry("u1", "2|w|1700000000|1699999990|-120.000|2209999880.000|1700000005|0|0|3|node-a:1")
	if err != nil {
		t.Fatal(err)
	}
	want := waitroom.Entry{UID: "u1", Tier: 2, State: waitroom.EntryWaiting, Join: time.Unix(1700000000, 0),
		First: time.Unix(1699999990, 0), Bias: -120, Score: 2209999880, Back: time.Unix(1700000005, 0), Node: "node-a:1"}
	if e != want {
		t.Fatalf("got %+v\nwant %+v", e, want)
	}
	e, err = decodeEntry("u2", "0|a|1700000000|1700000000|0.000|2210000000.000|1700000100|0|0|0|")
	if err != nil || e.State != waitroom.EntryAway || !e.AwaySince.Equal(time.Unix(1700000100, 0)) || e.Node != "" || !e.Admitted.IsZero() {
		t.Fatalf("away entry: %+v %v", e, err)
	}
	for _, bad := range []string{"", "0|w|1|1|0|0|0|0|0|0", "0|q|1|1|0|0|0|0|0|0|n", "-1|w|1|1|0|0|0|0|0|0|n",
		"0|w|1|1|x|0|0|0|0|0|n", "0|w||1|0|0|0|0|0|0|n", "0|ww|1|1|0|0|0|0|0|0|n"} {
		if _, err := decodeEntry("u", bad); err == nil {
			t.Errorf("decodeEntry(%q) accepted", bad)
		}
	}
}

func BenchmarkDecodeEntry(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeEntry("u1", "2|w|1700000000|1699999990|-120.000|2209999880.000|1700000005|0|0|3|node-a:1"); err != nil {
			b.Fatal(err)
		}
	}
}
