package redislimit

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/limiter"
)

// A group's rate and its @all quota: the engine enforces both from its
// tuning, but the benchmark keeps a send's four dimensions so that its
// figures stay comparable.
const (
	benchGroupRule = "bench_group"
	benchAtAllRule = "bench_at_all"
)

// benchLimits are the send-path dimensions with the default algorithms; @all
// gets a per-second window so every request walks all four checks.
func benchLimits() limiter.Limits {
	sec := limiter.Duration(time.Second)
	return limiter.Limits{Rules: map[string]limiter.Rule{
		limiter.UserGroup: {Algorithm: limiter.GCRA, Limit: 5, Window: sec, Burst: 10},
		limiter.UserAll:   {Algorithm: limiter.SlidingWindow, Limit: 20, Window: sec},
		benchGroupRule:    {Algorithm: limiter.SlidingWindow, Limit: 20, Window: sec},
		benchAtAllRule:    {Algorithm: limiter.SlidingWindow, Limit: 20, Window: sec},
	}}
}

const (
	benchUsers  = 100_000
	benchGroups = 50_000
)

var benchUIDs = func() []string {
	s := make([]string, benchUsers)
	for i := range s {
		s[i] = "u" + strconv.Itoa(i)
	}
	return s
}()

// fill sets the checks of decision i: users take turns, each talking in
// three groups of its own (at tens of thousands of decisions per second
// every user sends well under its limits).
func fill(checks []limiter.Check, i int) {
	u := i % benchUsers
	uid := benchUIDs[u]
	gid := int64((u*7919 + (i/benchUsers)%3*13) % benchGroups)
	checks[0] = limiter.Check{Rule: limiter.UserGroup, Key: uid, ID: gid}
	checks[1] = limiter.Check{Rule: limiter.UserAll, Key: uid}
	checks[2] = limiter.Check{Rule: benchGroupRule, ID: gid}
	checks[3] = limiter.Check{Rule: benchAtAllRule, ID: gid}
}

// redisCPU returns the server's used_cpu_sys + used_cpu_user in seconds.
func redisCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += f
		}
	}
	return sum
}

// goCPU returns this process's user + system CPU seconds: the Go side of a
// decision (client, encoding, syscalls); Redis runs in its own process.
func goCPU(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// commandStats returns INFO commandstats as command -> calls, usec.
func commandStats(b *testing.B, c *redis.Client) map[string][2]float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var v [2]float64
		for _, f := range strings.Split(rest, ",") {
			k, x, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				v[0], _ = strconv.ParseFloat(x, 64)
			case "usec":
				v[1], _ = strconv.ParseFloat(x, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return out
}

// BenchmarkAllow measures a send's 4-dimension decision against a local
// Redis (a throwaway server, so that INFO cpu counts only this load):
// decisions per second, allocations, Redis CPU seconds per 100k decisions
// (INFO cpu) and this process's CPU µs per decision. With -test.v it logs
// Redis's commandstats per decision. Modes: one EVALSHA per request
// (batch=off), concurrent requests decided by shared batch.lua calls
// (batch=256), batched with leases of hot counters (batch=256/lease: here
// every key is cold, so no lease is taken and it shows the cost of
// looking), and the Redis Cluster layout (cluster: two scripts per
// request, pipelined; cluster+batch: one batch.lua per hash slot).
func BenchmarkAllow(b *testing.B) {
	p := redistest.Start(b, portSingle)
	benchAllow(b, p, "dims=4/", benchLimits(), 4, fill, []int{1, 16, 64, 256, 1024})
}

// BenchmarkAllowHot is a decision whose every key is hot: every sender of
// one very large group, checked against the group's two windows alone
// (the group's rate and its @all quota, 100,000 units per 100 ms each so
// that all are admitted). This is where leases pay: once the counters are
// leased a decision needs Redis only for a renewal per lease (up to
// DefaultLeaseMax units).
func BenchmarkAllowHot(b *testing.B) {
	p := redistest.Start(b, portSingle)
	high := limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 100_000, Window: limiter.Duration(100 * time.Millisecond)}
	lim := limiter.Limits{Rules: map[string]limiter.Rule{benchGroupRule: high, benchAtAllRule: high}}
	hot := func(checks []limiter.Check, i int) {
		checks[0] = limiter.Check{Rule: benchGroupRule, ID: 1}
		checks[1] = limiter.Check{Rule: benchAtAllRule, ID: 1}
	}
	benchAllow(b, p, "dims=2/groups=1/", lim, 2, hot, []int{1024})
}

// BenchmarkAllowOneGroup is BenchmarkAllow's send with every sender in one
// group whose own limits are high: the user's keys are cold, the group's
// two windows hot (each decision touches them), as when a very large group
// all sends at once. Batching trims, counts and expires the hot keys once
// per batch.
func BenchmarkAllowOneGroup(b *testing.B) {
	p := redistest.Start(b, portSingle)
	lim := benchLimits()
	high := limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 100_000, Window: limiter.Duration(time.Second)}
	lim.Rules[benchGroupRule], lim.Rules[benchAtAllRule] = high, high
	oneGroup := func(checks []limiter.Check, i int) {
		fill(checks, i)
		checks[0].ID, checks[2].ID, checks[3].ID = 1, 1, 1
	}
	benchAllow(b, p, "dims=4/groups=1/", lim, 4, oneGroup, []int{1024})
}

// benchAllow runs the modes at each number of callers.
func benchAllow(b *testing.B, p *redistest.Server, prefix string, lim limiter.Limits, dims int, fill func([]limiter.Check, int), pars []int) {
	modes := []struct {
		name string
		tune func(*Config)
	}{
		{"batch=off", nil},
		{"batch=256", func(c *Config) { c.Batch = true }},
		{"batch=256/lease", func(c *Config) { c.Batch = true; c.LeaseTTL = DefaultLeaseTTL }},
		{"cluster/batch=off", func(c *Config) { c.Cluster = true }},
		{"cluster/batch=256", func(c *Config) { c.Cluster = true; c.Batch = true }},
	}
	for _, par := range pars {
		for _, m := range modes {
			if par == 1 && strings.Contains(m.name, "256") {
				continue // nothing to coalesce
			}
			b.Run(prefix+"goroutines="+strconv.Itoa(par)+"/"+m.name, func(b *testing.B) {
				c := redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: 64})
				defer c.Close()
				cfg := Config{Client: c, Limits: lim}
				if m.tune != nil {
					m.tune(&cfg)
				}
				l, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Ping(context.Background()); err != nil {
					b.Fatal(err)
				}
				var next, allowed atomic.Int64
				if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
					b.Fatal(err)
				}
				cpu0, go0 := redisCPU(b, c), goCPU(b)
				b.SetParallelism((par + 1) / 2) // GOMAXPROCS is 2 here
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					checks := make([]limiter.Check, dims)
					n := 0
					for pb.Next() {
						fill(checks, int(next.Add(1)))
						d, err := l.Allow(ctx, checks...)
						if err != nil {
							b.Error(err)
							return
						}
						if d.Allowed {
							n++
						}
					}
					allowed.Add(int64(n))
				})
				elapsed := time.Since(start)
				b.StopTimer()
				cpu, gocpu := redisCPU(b, c)-cpu0, goCPU(b)-go0
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
				b.ReportMetric(cpu/float64(b.N)*1e5, "redis-cpu-s/100k")
				b.ReportMetric(gocpu/float64(b.N)*1e6, "go-cpu-µs/op")
				b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
				if cov, miss := l.LeaseStats(); cov+miss > 0 {
					// of the checks of hot counters, the share no lease covered
					b.ReportMetric(float64(miss)/float64(cov+miss), "lease-missed/hot")
				}
				if testing.Verbose() && elapsed > time.Second { // the final run only
					st := commandStats(b, c)
					names := make([]string, 0, len(st))
					for k := range st {
						names = append(names, k)
					}
					sort.Strings(names)
					for _, k := range names {
						v := st[k]
						b.Logf("N=%d %s: %.2f calls/decision, %.2f µs/decision, %.2f µs/call", b.N, k, v[0]/float64(b.N), v[1]/float64(b.N), v[1]/v[0])
					}
				}
			})
		}
	}
}

// floorScripts do, for each request of a batch laid out as batch.lua's
// (4 keys per request: a GCRA key, then three sliding windows), only the
// Redis calls of an admitted cold request, with no decision logic: what
// the calls cost by themselves, and what fewer calls would cost.
var floorScripts = []struct{ name, src string }{
	{"args-only", `return #KEYS`},
	{"exists-x14", `for q = 0, #KEYS / 4 - 1 do
  for j = 1, 14 do redis.call('EXISTS', KEYS[q * 4 + 1 + j % 4]) end
end
return 0`},
	{"batch-calls-x14", `local now = ARGV[1]
for q = 0, #KEYS / 4 - 1 do
  local b = q * 4
  redis.call('GET', KEYS[b + 1])
  redis.call('SET', KEYS[b + 1], '1', 'PX', 2000)
  for j = 2, 4 do
    redis.call('ZREMRANGEBYSCORE', KEYS[b + j], '-inf', '1')
    redis.call('ZCARD', KEYS[b + j])
    redis.call('ZADD', KEYS[b + j], now, 'm' .. q)
    redis.call('PEXPIRE', KEYS[b + j], 2000)
  end
end
return 0`},
	{"string-log-x8", `local now = ARGV[1]
for q = 0, #KEYS / 4 - 1 do
  local b = q * 4
  for j = 1, 4 do
    local v = redis.call('GET', KEYS[b + j]) or ''
    redis.call('SET', KEYS[b + j], v .. now, 'PX', 2000)
  end
end
return 0`},
}

// BenchmarkScriptFloor measures Redis CPU per decision of batch.lua and of
// the bare calls it makes (floorScripts), on batches of 256 cold requests
// of BenchmarkAllow's workload, one call at a time: what bounds a batched
// decision inside Redis.
func BenchmarkScriptFloor(b *testing.B) {
	p := redistest.Start(b, portSingle)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	defer c.Close()
	const size = 256
	var (
		next int
		l    *Limiter
	)
	batch := func() *call {
		reqs := make([]*request, size)
		checks := make([]limiter.Check, 4*size)
		for i := range reqs {
			ch := checks[4*i : 4*i+4]
			fill(ch, next)
			next++
			r, err := l.build(l.table.Load(), ch)
			if err != nil {
				b.Fatal(err)
			}
			reqs[i] = r
		}
		return l.calls(reqs)[0]
	}
	run := func(b *testing.B, s *redis.Script, now bool) {
		ctx := context.Background()
		var err error // each script its own keys: they differ in type
		l, err = New(Config{Client: c, Batch: true, Limits: benchLimits(), Prefix: "floor:" + b.Name() + ":"})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		cpu0 := redisCPU(b, c)
		var work time.Duration
		n := 0
		for b.Loop() {
			b.StopTimer()
			k := batch()
			args := k.args
			if now {
				args = []any{time.Now().UnixMicro()}
			}
			b.StartTimer()
			t0 := time.Now()
			if err := s.Run(ctx, c, k.keys, args...).Err(); err != nil && err != redis.Nil {
				b.Fatal(err)
			}
			work += time.Since(t0)
			n += size
		}
		b.ReportMetric(float64(n)/work.Seconds(), "decisions/s")
		b.ReportMetric((redisCPU(b, c)-cpu0)/float64(n)*1e6, "redis-cpu-µs/decision")
	}
	b.Run("script=batch.lua", func(b *testing.B) { run(b, batchScript, false) })
	for _, f := range floorScripts {
		b.Run("script="+f.name, func(b *testing.B) { run(b, redis.NewScript(f.src), true) })
	}
}

// BenchmarkAllowCluster is BenchmarkAllow's cold send (1024 callers) on a
// Redis Cluster of three masters: a user's keys share one slot, a group's
// another, so one decision is two batch.lua calls on (usually) two masters.
// What it shows is the spread: redis-cpu-max-µs/op, the busiest master's
// CPU per decision, bounds the cluster's rate when each master has a core
// (1 / it); redis-cpu-sum-µs/op is what all of them spend. On two cores the
// three masters and the callers share the machine, so decisions/s is not
// the cluster's rate.
func BenchmarkAllowCluster(b *testing.B) {
	addrs := redistest.StartCluster(b, 16471, 16472, 16473)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	defer c.Close()
	masters := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		masters[i] = redis.NewClient(&redis.Options{Addr: a})
		defer masters[i].Close()
	}
	cpus := func() []float64 {
		out := make([]float64, len(masters))
		for i, m := range masters {
			out[i] = redisCPU(b, m)
		}
		return out
	}
	const callers = 1024
	b.Run("dims=4/goroutines=1024/cluster/batch=256", func(b *testing.B) {
		l, err := New(Config{Client: c, Limits: benchLimits(), Cluster: true, Batch: true})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Ping(context.Background()); err != nil {
			b.Fatal(err)
		}
		var next atomic.Int64
		cpu0 := cpus()
		b.SetParallelism(callers / 2)
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			checks := make([]limiter.Check, 4)
			for pb.Next() {
				fill(checks, int(next.Add(1)))
				if _, err := l.Allow(context.Background(), checks...); err != nil {
					b.Error(err)
					return
				}
			}
		})
		elapsed := time.Since(start)
		b.StopTimer()
		var sum, hi float64
		for i, v := range cpus() {
			d := v - cpu0[i]
			sum += d
			hi = max(hi, d)
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
		b.ReportMetric(hi/float64(b.N)*1e6, "redis-cpu-max-µs/op")
		b.ReportMetric(sum/float64(b.N)*1e6, "redis-cpu-sum-µs/op")
	})
}

// BenchmarkAllowWeighted is a pull's decision (the weighted pull rule:
// class shares and reserves, demand, a per-user cap) from every user of a
// very large group at once: the rule's capacity keys (total, three
// classes, demand) are hot, shared by every decision, and the user's cap
// key cold. Weighted rules are never leased (doc.go): this is what level
// weighting costs per decision, batched or not.
func BenchmarkAllowWeighted(b *testing.B) {
	p := redistest.Start(b, portSingle)
	w := limiter.DefaultWeighted()
	w.UserCap = 5 // per 500 ms
	if os.Getenv("FANFARE_BENCH_NO_USER_CAP") != "" {
		w.UserCap = 0 // what the per-user cap's cold key costs
	}
	lim := limiter.Limits{Rules: map[string]limiter.Rule{
		// 200,000 per second: every decision is admitted
		limiter.Pull: {Algorithm: limiter.SlidingWindow, Limit: 100_000, Window: limiter.Duration(500 * time.Millisecond), Weighted: &w},
	}}
	pull := func(checks []limiter.Check, i int) {
		u := i % benchUsers
		// tiers as a large group has them: most normal, some VIPs, a few low
		tier := 0
		switch u % 20 {
		case 0:
			tier = -1
		case 1, 2:
			tier = 3
		}
		checks[0] = limiter.Check{Rule: limiter.Pull, User: benchUIDs[u], Tier: tier}
	}
	benchAllow(b, p, "dims=1/weighted/", lim, 1, pull, []int{1024})
}
