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

// BenchmarkOnlineAnywhere measures one OnlineAnywhere call (the lookup an
// active tier would make per group per window) for ordinals=K members of a
// group online on nodes=N nodes, against the test Redis: the Nodes script
// plus one pipeline of BITFIELD_RO per node.
func BenchmarkOnlineAnywhere(b *testing.B) {
	for _, s := range []struct{ nodes, ordinals int }{{2, 100}, {2, 1000}, {2, 10000}, {4, 1000}} {
		b.Run(fmt.Sprintf("nodes=%d/ordinals=%d", s.nodes, s.ordinals), func(b *testing.B) {
			rdb := sharedRedisB(b)
			prefix := testPrefixB(b, rdb)
			var v *View
			for n := range s.nodes {
				l, _ := presence.New[int](presence.Config{})
				for o := range s.ordinals {
					if o%s.nodes == n && o%2 == 0 { // half the members online, spread over the nodes
						_ = l.Connect("u"+strconv.Itoa(o), o+1, []presence.Membership{{GID: 1, Ordinal: uint32(o)}})
					}
				}
				nv, err := New(rdb, l, Config{NodeID: "bench-" + strconv.Itoa(n), Prefix: prefix})
				if err != nil {
					b.Fatal(err)
				}
				if err := nv.Flush(b.Context()); err != nil {
					b.Fatal(err)
				}
				v = nv
			}
			ords := make([]uint32, s.ordinals)
			for i := range ords {
				ords[i] = uint32(i)
			}
			var dst []bool
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = v.OnlineAnywhere(b.Context(), 1, ords, dst[:0]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*s.ordinals), "ns/ordinal")
		})
	}
}

// BenchmarkOccupancy measures one round of the member presence feed's
// Redis call against the test Redis: groups=G groups of members=M, half
// online, spread over two nodes, each query a count (the BITCOUNT of the
// OR of the nodes' bitmaps) or, with roster, the union of the nodes'
// rosters with this node's rewritten (every round: the worst case).
func BenchmarkOccupancy(b *testing.B) {
	for _, s := range []struct {
		groups, members int
		roster          bool
	}{{1, 100_000, false}, {256, 100_000, false}, {1000, 1000, false}, {1000, 1000, true}} {
		b.Run(fmt.Sprintf("groups=%d/members=%d/roster=%v", s.groups, s.members, s.roster), func(b *testing.B) {
			rdb := sharedRedisB(b)
			prefix := testPrefixB(b, rdb)
			var v *View
			conn := 0
			for n := range 2 {
				l, _ := presence.New[int](presence.Config{})
				for o := range s.members {
					if o%2 == n && o%4 < 2 { // half online, spread over the nodes
						conn++
						ms := make([]presence.Membership, s.groups)
						for g := range ms {
							ms[g] = presence.Membership{GID: int64(g + 1), Ordinal: uint32(o)}
						}
						_ = l.Connect("u"+strconv.Itoa(o), conn, ms)
					}
				}
				nv, err := New(rdb, l, Config{NodeID: "bench-" + strconv.Itoa(n), Prefix: prefix})
				if err != nil {
					b.Fatal(err)
				}
				if err := nv.Flush(b.Context()); err != nil {
					b.Fatal(err)
				}
				v = nv
			}
			qs := make([]presence.OccupancyQuery, s.groups)
			var uids []string
			if s.roster {
				for o := 1; o < s.members; o += 4 {
					uids = append(uids, "u"+strconv.Itoa(o))
				}
			}
			for g := range qs {
				qs[g] = presence.OccupancyQuery{GID: int64(g + 1), Roster: s.roster, Publish: s.roster, UIDs: uids}
			}
			var dst []presence.Occupancy
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = v.Occupancy(b.Context(), qs, dst[:0]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*s.groups), "ns/group")
		})
	}
}
