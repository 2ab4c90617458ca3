package redisroom_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/redisroom"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

// The 1M fixture: one room with FANFARE_BENCH_ROOM_USERS (default
// 1,000,000) queued users, filled once per process by 64 concurrent
// enterers (the fill rate is the enters/s figure); its keys are deleted in
// TestMain.
var fix struct {
	once     sync.Once
	c        *redis.Client
	b        *redisroom.Backend
	rc       waitroom.RoomConfig
	n        int
	fillRate float64
	prefix   string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fix.c != nil {
		deletePrefix(fix.c, fix.prefix)
		fix.c.Close()
	}
	os.Exit(code)
}

const benchConc = 64

func fixture(b *testing.B) {
	fix.once.Do(func() {
		fix.n = 1_000_000
		if s := os.Getenv("FANFARE_BENCH_ROOM_USERS"); s != "" {
			fix.n, _ = strconv.Atoi(s)
		}
		fix.c = redis.NewClient(&redis.Options{Addr: redistest.Addr(), PoolSize: benchConc + 8})
		if fix.err = fix.c.Ping(b.Context()).Err(); fix.err != nil {
			return
		}
		fix.prefix = fmt.Sprintf("fanfarebench:%d:", time.Now().UnixNano())
		fix.b, _ = redisroom.New(redisroom.Config{Client: fix.c, Prefix: fix.prefix, NoPublish: true})
		// Immediate VIP insertion: with smoothing, VIPs wait at their
		// normal score until the driver's Maintain steps them, which the
		// benchmark never runs, and would all tie with the normal users of
		// their second.
		fix.rc = waitroom.RoomConfig{Name: "big", MaxActive: 1 << 30, AdmitRate: 1e6, AdmitBurst: 1e5,
			TargetWait: 24 * time.Hour, Shards: 1, Smoothing: -1}.WithDefaults()
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		errs := make(chan error, benchConc)
		for range benchConc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(fix.n) {
						return
					}
					lvl := 0
					if i%10 == 0 {
						lvl = int(i/10)%3 + 1
					}
					if _, err := fix.b.Enter(b.Context(), &fix.rc, waitroom.EnterRequest{UID: "u" + strconv.FormatInt(i, 10), Tier: lvl}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		fix.err = <-errs
		fix.fillRate = float64(fix.n) / time.Since(start).Seconds()
	})
	if fix.err != nil {
		b.Fatalf("fixture: %v", fix.err)
	}
}

func queuedName() string { return "queued=" + strconv.Itoa(fix.n) }

// BenchmarkRedisEnter: enters/s into a room holding 1M users, 64 enterers
// at once (each Enter is one script round trip; go-redis pipelines them
// over the pool).
func BenchmarkRedisEnter(b *testing.B) {
	fixture(b)
	b.Run(queuedName()+"/conc=64", func(b *testing.B) {
		b.ReportMetric(fix.fillRate, "fill_enters/s")
		var next atomic.Int64
		b.SetParallelism(benchConc / max(1, runtimeProcs()))
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := next.Add(1)
				if _, err := fix.b.Enter(b.Context(), &fix.rc, waitroom.EnterRequest{UID: fmt.Sprintf("e%d-%d", start.UnixNano(), i), Tier: int(i % 4)}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "enters/s")
	})
}

// BenchmarkRedisRank: one user's rank (ahead) in the 1M room straight from
// Redis, as a snapshot of one uid; and a node's periodic snapshot batch
// of 500 local users per script call.
//
// quota=two_thirds adds the level-weighted admission quota, under which ahead
// also counts the VIPs (a 10% share of the fixture) ahead of the user.
func BenchmarkRedisRank(b *testing.B) {
	fixture(b)
	for _, q := range quotas {
		rc := fix.rc
		rc.VIPAdmitShare = q.share
		for _, batch := range []int{1, 500} {
			b.Run(fmt.Sprintf("%s/quota=%s/uids=%d", queuedName(), q.name, batch), func(b *testing.B) {
				h := hdrhistogram.New(1, 10_000_000, 3)
				rng := rand.New(rand.NewPCG(1, 2))
				uids := make([]string, batch)
				for b.Loop() {
					for i := range uids {
						uids[i] = "u" + strconv.Itoa(rng.IntN(fix.n))
					}
					t0 := time.Now()
					s, err := fix.b.Snapshot(b.Context(), &rc, uids, math.MaxInt64)
					if err != nil {
						b.Fatal(err)
					}
					h.RecordValue(time.Since(t0).Microseconds())
					if s.Waiting < int64(fix.n/2) {
						b.Fatalf("queue drained to %d: run the rank benchmark before admissions", s.Waiting)
					}
				}
				b.ReportMetric(float64(h.ValueAtQuantile(50)), "p50_us")
				b.ReportMetric(float64(h.ValueAtQuantile(99)), "p99_us")
				b.ReportMetric(float64(h.ValueAtQuantile(99))/float64(batch), "p99_us/uid")
			})
		}
	}
}

// quotas are the admission-quota settings the rank and admit benchmarks
// compare.
var quotas = []struct {
	name  string
	share float64
}{{"off", -1}, {"two_thirds", 2.0 / 3}}

// BenchmarkRedisAdmit: admission throughput from the 1M room, 100 per
// atomic step (the bucket and max_active do not bind here).
// With quota=two_thirds a step also looks up the best-ranked normal user when the
// VIPs (ranked ahead) are at their share.
func BenchmarkRedisAdmit(b *testing.B) {
	fixture(b)
	for _, q := range quotas {
		rc := fix.rc
		rc.VIPAdmitShare = q.share
		b.Run(queuedName()+"/quota="+q.name+"/step=100", func(b *testing.B) {
			admitted := 0
			start := time.Now()
			for b.Loop() {
				r, err := fix.b.Admit(b.Context(), &rc, waitroom.AdmitRequest{Max: 100})
				if err != nil {
					b.Fatal(err)
				}
				admitted += len(r.Admitted)
			}
			b.ReportMetric(float64(admitted)/time.Since(start).Seconds(), "admissions/s")
		})
	}
}

func runtimeProcs() int { return max(1, int(testingProcs.Load())) }

var testingProcs atomic.Int64

func init() { testingProcs.Store(2) }
