package presence

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// conn stands in for the gateway's connection pointer.
type conn struct{ id int }

// fillGroup connects online users of a group with members ordinals, chosen
// at random among [0, members).
func fillGroup(b *testing.B, l *Local[*conn], gid int64, members, online int) []*conn {
	b.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	perm := r.Perm(members)[:online]
	conns := make([]*conn, online)
	for i, ord := range perm {
		conns[i] = &conn{id: ord}
		if err := l.Connect("u"+strconv.Itoa(ord), conns[i], []Membership{{GID: gid, Ordinal: uint32(ord)}}); err != nil {
			b.Fatal(err)
		}
	}
	return conns
}

var benchShapes = []struct{ members, pct int }{
	{1000, 100},
	{100000, 1},
	{100000, 10},
	{100000, 100},
	{1000000, 10},
}

// BenchmarkAppendConns is the push path: collect the connections of a
// group's online members into a reused slice.
func BenchmarkAppendConns(b *testing.B) {
	for _, s := range benchShapes {
		online := s.members * s.pct / 100
		b.Run(fmt.Sprintf("members=%d/online=%dpct", s.members, s.pct), func(b *testing.B) {
			l, _ := New[*conn](Config{})
			fillGroup(b, l, 1, s.members, online)
			dst := make([]*conn, 0, online)
			b.ReportAllocs()
			for b.Loop() {
				dst = l.AppendConns(dst[:0], 1)
			}
			if len(dst) != online {
				b.Fatalf("got %d conns, want %d", len(dst), online)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(online), "ns/recipient")
		})
	}
}

// BenchmarkForEachOnline is the push path with per-recipient filtering
// (ordinal for join_seq, uid to skip the sender).
func BenchmarkForEachOnline(b *testing.B) {
	for _, s := range benchShapes {
		online := s.members * s.pct / 100
		b.Run(fmt.Sprintf("members=%d/online=%dpct", s.members, s.pct), func(b *testing.B) {
			l, _ := New[*conn](Config{})
			fillGroup(b, l, 1, s.members, online)
			dst := make([]*conn, 0, online)
			b.ReportAllocs()
			for b.Loop() {
				dst = dst[:0]
				l.ForEachOnline(1, func(ord uint32, c *conn) bool {
					if ord != 1<<31 { // e.g. skip the sender
						dst = append(dst, c)
					}
					return true
				})
			}
			if len(dst) != online {
				b.Fatalf("got %d conns, want %d", len(dst), online)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(online), "ns/recipient")
		})
	}
}

// BenchmarkConnectDisconnect: one user in groups=k groups connects and
// disconnects.
func BenchmarkConnectDisconnect(b *testing.B) {
	for _, k := range []int{1, 20, 200} {
		b.Run(fmt.Sprintf("groups=%d", k), func(b *testing.B) {
			l, _ := New[*conn](Config{})
			// Keep the groups alive with another member each.
			ms := make([]Membership, k)
			for g := range k {
				ms[g] = Membership{GID: int64(g), Ordinal: 1}
				if err := l.Connect("keeper"+strconv.Itoa(g), &conn{}, []Membership{{GID: int64(g), Ordinal: 0}}); err != nil {
					b.Fatal(err)
				}
			}
			c := &conn{}
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Connect("u", c, ms); err != nil {
					b.Fatal(err)
				}
				l.Disconnect("u", c)
			}
		})
	}
}

// BenchmarkTouch is the heartbeat path, from all cores.
func BenchmarkTouch(b *testing.B) {
	l, _ := New[*conn](Config{})
	conns := fillGroup(b, l, 1, 100000, 100000)
	b.ResetTimer()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(conns))
		for pb.Next() {
			l.Touch(conns[i%len(conns)])
			i++
		}
	})
}

// BenchmarkPushDuringConnects measures the push path while other goroutines
// connect and disconnect members of the same group.
func BenchmarkPushDuringConnects(b *testing.B) {
	l, _ := New[*conn](Config{})
	fillGroup(b, l, 1, 100000, 10000)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &conn{}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = l.Connect("churn", c, []Membership{{GID: 1, Ordinal: uint32(200000 + i%1000)}})
			l.Disconnect("churn", c)
		}
	}()
	dst := make([]*conn, 0, 20000)
	b.ReportAllocs()
	for b.Loop() {
		dst = l.AppendConns(dst[:0], 1)
	}
	close(stop)
	<-done
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10000, "ns/recipient")
}

// BenchmarkMemory reports heap bytes per online member with 100k members
// online (one connection each) in a group of 1M (groups/user=1), and with
// each of them in 10 such groups (groups/user=10); the caller's connection
// objects and uid strings are not counted.
func BenchmarkMemory(b *testing.B) {
	for _, groupsPerUser := range []int{1, 10} {
		b.Run(fmt.Sprintf("online=100000/groups/user=%d", groupsPerUser), func(b *testing.B) {
			const online = 100000
			conns := make([]*conn, online)
			uids := make([]string, online)
			for i := range conns {
				conns[i] = &conn{id: i}
				uids[i] = "u" + strconv.Itoa(i)
			}
			perm := rand.New(rand.NewPCG(3, 4)).Perm(1000000)
			ms := make([]Membership, groupsPerUser)
			var per float64
			for b.Loop() {
				before := heapInUse()
				l, _ := New[*conn](Config{})
				for i := range online {
					for g := range ms {
						ms[g] = Membership{GID: int64(g), Ordinal: uint32(perm[(i*7+g*13)%len(perm)])}
					}
					if err := l.Connect(uids[i], conns[i], ms); err != nil {
						b.Fatal(err)
					}
				}
				per = float64(heapInUse()-before) / online
				if got := l.OnlineCount(0); got != online {
					b.Fatalf("got %d online, want %d", got, online)
				}
				runtime.KeepAlive(l)
			}
			b.ReportMetric(per, "B/online")
			b.ReportMetric(per/float64(groupsPerUser), "B/membership")
		})
	}
}

func heapInUse() uint64 {
	var m runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	time.Sleep(10 * time.Millisecond)
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
