package embedded

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/storetest"
)

// Benchmarks of the embedded store, in a temporary directory on the same
// disk as ./data would be. Run:
//
//	go test -run '^$' -bench . -benchtime 3s ./store/embedded/
//
// BenchmarkAppendBatch: one caller, one Append per iteration of batch
// messages spread over 1,000 groups; batch=1 is the naive baseline (one
// message per commit and fsync). BenchmarkAppend mirrors store/postgres's
// benchmark of the same name (closed-loop senders through a batcher
// standing in for the engine's shard workers, or naive one Append per
// send), so benchstat can compare the backends column by column.

type benchFixture struct {
	s       *Store
	gids    []int64
	senders []string
	member  [][]int64 // sender index -> gids it may send to
}

var (
	fixtureMu sync.Mutex
	fixtures  = map[string]*benchFixture{}
	benchDirs []string
)

// closeFixtures is called by TestMain after all tests and benchmarks ran.
func closeFixtures() {
	for _, f := range fixtures {
		f.s.Close()
	}
	for _, d := range benchDirs {
		os.RemoveAll(d)
	}
}

// fixture returns (creating once per process) a store with groups groups
// and senders senders; sender i is a member of every group when
// groups <= 10, else of the groups g with g % 10 == i % 10.
func fixture(b *testing.B, groups, senders int) *benchFixture {
	b.Helper()
	key := fmt.Sprint(groups, "/", senders)
	fixtureMu.Lock()
	defer fixtureMu.Unlock()
	if f, ok := fixtures[key]; ok {
		return f
	}
	dir, err := os.MkdirTemp("", "fanfare-embedded-bench-")
	if err != nil {
		b.Fatal(err)
	}
	benchDirs = append(benchDirs, dir)
	s, err := Open(Config{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	f := &benchFixture{s: s, member: make([][]int64, senders)}
	for i := range senders {
		f.senders = append(f.senders, "sender"+strconv.Itoa(i))
	}
	for g := range groups {
		grp, err := s.CreateGroup(ctx, store.Group{Name: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		f.gids = append(f.gids, grp.GID)
		var ms []string
		for i := range senders {
			if groups <= 10 || g%10 == i%10 {
				ms = append(ms, f.senders[i])
				f.member[i] = append(f.member[i], grp.GID)
			}
		}
		if _, err := s.AddMembers(ctx, grp.GID, ms); err != nil {
			b.Fatal(err)
		}
	}
	fixtures[key] = f
	return f
}

// cpuTime is the CPU time (user + system) this process used so far,
// background compaction included: robust to other load on the machine,
// unlike wall time.
func cpuTime() time.Duration { return storetest.CPUTime() }

// cids returns n distinct client_msg_ids, made before the timed loop so
// that their allocations are not charged to the store.
func cids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = storetest.NextClientMsgID()
	}
	return out
}

func BenchmarkAppendBatch(b *testing.B) {
	for _, batch := range []int{1, 100, 500} {
		b.Run(fmt.Sprintf("groups=1000/batch=%d", batch), func(b *testing.B) {
			f := fixture(b, 1000, 10)
			ctx := context.Background()
			pool := cids(1 << 18)
			reqs := make([]store.AppendRequest, batch)
			res := make([]store.AppendResult, batch)
			rng := rand.New(rand.NewPCG(1, uint64(batch)))
			body := []byte(storetest.BenchBody)
			k := 0
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				for i := range reqs {
					gid := f.gids[rng.IntN(len(f.gids))]
					sender := int((gid - 1) % 10) // a member: gids are 1..1000, see fixture
					if k == len(pool) {
						b.StopTimer()
						pool, k = cids(len(pool)), 0
						b.StartTimer()
					}
					reqs[i] = store.AppendRequest{GID: gid, Sender: f.senders[sender], ClientMsgID: pool[k], Body: body}
					k++
				}
				if err := f.s.Append(ctx, reqs, res); err != nil {
					b.Fatal(err)
				}
				for i := range res {
					if res[i].Err != nil || res[i].Duplicate {
						b.Fatalf("result %+v", res[i])
					}
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N*batch), "cpu-us/msg")
		})
	}
}

func BenchmarkAppend(b *testing.B) {
	for _, groups := range []int{1000, 1} {
		for _, mode := range []string{"batched", "naive"} {
			name := fmt.Sprintf("groups=%d/senders=200/mode=%s", groups, mode)
			b.Run(name, func(b *testing.B) { benchAppend(b, groups, 200, mode) })
		}
	}
}

func benchAppend(b *testing.B, groups, senders int, mode string) {
	f := fixture(b, groups, senders)
	storetest.BenchAppend(b, f.s, storetest.Load{Senders: f.senders, Groups: f.member, Body: []byte(storetest.BenchBody),
		Batched: mode != "naive", Workers: 4, Linger: 500 * time.Microsecond})
}

// BenchmarkMessagesRange reads 200 messages at random offsets of a group
// holding 20,000; it reports p50 and p99 latency.
func BenchmarkMessagesRange(b *testing.B) {
	f := fixture(b, 1, 200)
	ctx := context.Background()
	gid, uid := f.gids[0], f.senders[0]
	g := fill(b, f.s, gid, uid, 20000)
	rng := rand.New(rand.NewPCG(1, 2))
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	for b.Loop() {
		from := 1 + rng.Int64N(g.LastSeq-200)
		t0 := time.Now()
		msgs, _, err := f.s.Messages(ctx, gid, uid, from, 0, 200, 0)
		lat = append(lat, time.Since(t0))
		if err != nil || len(msgs) != 200 {
			b.Fatalf("got %d messages, %v; want 200", len(msgs), err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}

// fill appends messages from uid to gid until it holds want of them.
func fill(b *testing.B, s *Store, gid int64, uid string, want int64) store.Group {
	b.Helper()
	ctx := context.Background()
	g, err := s.Group(ctx, gid)
	if err != nil {
		b.Fatal(err)
	}
	for g.LastSeq < want {
		n := min(1000, want-g.LastSeq)
		reqs := make([]store.AppendRequest, n)
		for i := range reqs {
			reqs[i] = store.AppendRequest{GID: gid, Sender: uid, ClientMsgID: storetest.NextClientMsgID(), Body: []byte(storetest.BenchBody)}
		}
		if err := s.Append(ctx, reqs, make([]store.AppendResult, n)); err != nil {
			b.Fatal(err)
		}
		g.LastSeq += n
	}
	return g
}

// BenchmarkMarkRead measures the small unsynced writes (read markers),
// which share the write lock with Append.
func BenchmarkMarkRead(b *testing.B) {
	f := fixture(b, 1, 200)
	ctx := context.Background()
	gid := f.gids[0]
	g := fill(b, f.s, gid, f.senders[0], 20000)
	n := int64(0)
	b.ReportAllocs()
	for b.Loop() {
		// Every call moves one member's marker forward (until last_seq).
		n++
		if err := f.s.MarkRead(ctx, gid, f.senders[n%200], min(n/200+1, g.LastSeq)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}
