package redisroom_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
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
// at once, with every Enter its own script call (batch=1) and with the
// node's concurrent Enters batched into one call (batch=64, the default);
// Redis's own CPU per enter is what bounds it (one thread).
func BenchmarkRedisEnter(b *testing.B) {
	fixture(b)
	for _, batch := range []int{1, redisroom.DefaultEnterBatch} {
		be, err := redisroom.New(redisroom.Config{Client: fix.c, Prefix: fix.prefix, NoPublish: true, EnterBatch: batch})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s/conc=64/batch=%d", queuedName(), batch), func(b *testing.B) {
			b.ReportMetric(fix.fillRate, "fill_enters/s")
			var next atomic.Int64
			b.SetParallelism(benchConc / max(1, runtimeProcs()))
			start := time.Now()
			r0 := readRedisCPU(b, fix.c)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := next.Add(1)
					if _, err := be.Enter(b.Context(), &fix.rc, waitroom.EnterRequest{UID: fmt.Sprintf("e%d-%d", start.UnixNano(), i), Tier: int(i % 4)}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "enters/s")
			r0.report(b, fix.c, b.N)
		})
	}
}

// BenchmarkRedisJoin: the whole path of a user entering on one node,
// Manager.Join (the node's driver running: admission steps, maintenance,
// rank snapshots of its joined users) into the 1M room, 64 at once, with
// the enter script batched (the default) and without. The room holds at
// most 1000 sessions, so the queue stays full.
func BenchmarkRedisJoin(b *testing.B) {
	fixture(b)
	for _, batch := range []int{1, redisroom.DefaultEnterBatch} {
		be, err := redisroom.New(redisroom.Config{Client: fix.c, Prefix: fix.prefix, NoPublish: true, EnterBatch: batch})
		if err != nil {
			b.Fatal(err)
		}
		m, err := waitroom.New(waitroom.Config{Backend: be, NoFallback: true, Node: "bench" + strconv.Itoa(batch)})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(b.Context())
		ran := make(chan struct{})
		go func() { m.Run(ctx); close(ran) }()
		rc := fix.rc
		rc.MaxActive = 1000 // admissions stop at 1000 sessions; the guarantee's capacity stays the fixture's
		// One admission in the window first: a room whose oldest user has
		// waited a minute with none has L_max 0 (paused) and refuses all.
		if _, err := fix.b.Admit(ctx, &rc, waitroom.AdmitRequest{Max: 1}); err != nil {
			b.Fatal(err)
		}
		if _, err := m.Upsert(ctx, rc); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s/conc=64/batch=%d", queuedName(), batch), func(b *testing.B) {
			var next, refused atomic.Int64
			b.SetParallelism(benchConc / max(1, runtimeProcs()))
			start := time.Now()
			r0 := readRedisCPU(b, fix.c)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := next.Add(1)
					t, err := m.Join(ctx, rc.Name, fmt.Sprintf("j%d-%d", start.UnixNano(), i), int(i%4), func(waitroom.Update) {})
					if err != nil {
						b.Error(err)
						return
					}
					if t == nil {
						refused.Add(1)
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "joins/s")
			b.ReportMetric(float64(refused.Load()), "refused")
			r0.report(b, fix.c, b.N)
		})
		// Stop the driver without Shutdown, whose disconnects of every
		// joined user would run into the next measurement.
		cancel()
		<-ran
	}
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

// redisCPU is the server's own CPU time (INFO cpu, user + sys) and its
// script calls (INFO commandstats, evalsha calls and usec), read before and
// after a measured phase: the per-enter figures the single Redis thread
// bounds the room by.
type redisCPU struct {
	cpu          float64 // seconds
	calls, usecs int64
}

func readRedisCPU(b *testing.B, c *redis.Client) redisCPU {
	var r redisCPU
	info, err := c.Info(b.Context(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_cpu_user", "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			r.cpu += f
		case "cmdstat_evalsha":
			for _, kv := range strings.Split(v, ",") {
				name, val, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(val, 10, 64)
				switch name {
				case "calls":
					r.calls = n
				case "usec":
					r.usecs = n
				}
			}
		}
	}
	return r
}

// report adds the Redis CPU per op (all commands, the server's whole
// thread) and the script time per op and per call since r0.
func (r0 redisCPU) report(b *testing.B, c *redis.Client, ops int) {
	r1 := readRedisCPU(b, c)
	if ops == 0 {
		return
	}
	b.ReportMetric((r1.cpu-r0.cpu)*1e6/float64(ops), "redis_cpu_us/op")
	b.ReportMetric(float64(r1.usecs-r0.usecs)/float64(ops), "script_us/op")
	if n := r1.calls - r0.calls; n > 0 {
		b.ReportMetric(float64(r1.usecs-r0.usecs)/float64(n), "script_us/call")
	}
}
