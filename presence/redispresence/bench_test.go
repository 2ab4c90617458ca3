package redispresence

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/fanfare-im/fanfare/presence"
)

// BenchmarkFlush measures one Flush publishing groups=N dirty groups, each
// with changes=K members connecting (deltas), against the test Redis.
func BenchmarkFlush(b *testing.B) {
	for _, s := range []struct{ groups, changes int }{{1, 1000}, {100, 10}, {1000, 1}} {
		b.Run(fmt.Sprintf("groups=%d/changes=%d", s.groups, s.changes), func(b *testing.B) {
			rdb := sharedRedisB(b)
			l, _ := presence.New[int](presence.Config{})
			v, err := New(rdb, l, Config{NodeID: "bench", Prefix: testPrefixB(b, rdb)})
			if err != nil {
				b.Fatal(err)
			}
			// Large groups: 20k members online in each, so deltas win.
			conn := 0
			for g := range s.groups {
				for o := range 20000 / s.groups * 10 {
					conn++
					_ = l.Connect("u"+strconv.Itoa(conn), conn, []presence.Membership{{GID: int64(g), Ordinal: uint32(o * 5)}})
				}
			}
			if err := v.Flush(b.Context()); err != nil {
				b.Fatal(err)
			}
			round := 0
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				round++
				for g := range s.groups {
					for k := range s.changes {
						conn++
						_ = l.Connect("c"+strconv.Itoa(conn), conn, []presence.Membership{{GID: int64(g), Ordinal: uint32(1_000_000 + round*s.changes + k)}})
					}
				}
				b.StartTimer()
				if err := v.Flush(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*s.groups), "ns/group")
		})
	}
}
