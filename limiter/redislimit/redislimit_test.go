package redislimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/limitertest"
)

// redisAddr is the shared test Redis. Unreachable means FAIL, not skip.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  time.Second,
		ReadTimeout:  2 * time.Second,
		WriteTimeout: 2 * time.Second,
		PoolSize:     64,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns a fresh key prefix and deletes its keys after the test.
func testPrefix(t testing.TB, c *redis.Client) string {
	t.Helper()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s unreachable (set FANFARE_TEST_REDIS_ADDR): %v", redistest.Addr(), err)
	}
	var b [6]byte
	rand.Read(b[:])
	p := "fanfare-test:lim:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { deleteKeys(c, p) })
	return p
}

func deleteKeys(c *redis.Client, prefix string) {
	ctx := context.Background()
	it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for it.Next(ctx) {
		keys = append(keys, it.Val())
		if len(keys) == 500 {
			c.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		c.Unlink(ctx, keys...)
	}
}

// connectFunc returns a client and a fresh key prefix for one test.
type connectFunc func(t *testing.T) (redis.UniversalClient, string)

// shared connects to the shared test Redis; keys are deleted afterwards.
func shared(t *testing.T) (redis.UniversalClient, string) {
	c := newClient(t, redistest.Addr())
	return c, testPrefix(t, c)
}

// backend runs the suite on Redis with the manual clock: the scripts get
// Redis TIME at New plus clock.Elapsed() instead of reading TIME (the
// production path, TIME, is covered by the suite's RealClock test and
// TestScoresAreRedisTime).
func backend(connect connectFunc, tune func(*Config)) limitertest.Backend {
	newLimiters := func(t *testing.T, limits limiter.Limits, nodes int) []*Limiter {
		_, prefix := connect(t)
		out := make([]*Limiter, nodes)
		for i := range out {
			c, _ := connect(t) // one client per node, like separate processes
			cfg := Config{Client: c, Prefix: prefix, Limits: limits}
			if tune != nil {
				tune(&cfg)
			}
			l, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = l
		}
		return out
	}
	return limitertest.Backend{
		Tolerance: time.Microsecond, // the scripts count microseconds
		New: func(t *testing.T, limits limiter.Limits, clock *limitertest.Clock, nodes int) []limiter.Limiter {
			ls := newLimiters(t, limits, nodes)
			base := redisNow(t, ls[0].client)
			out := make([]limiter.Limiter, nodes)
			for i, l := range ls {
				l.clock = func() int64 { return base + clock.Elapsed().Microseconds() }
				if l.leases != nil {
					l.leases.mono = clock.Elapsed
				}
				out[i] = l
			}
			return out
		},
		NewRealClock: func(t *testing.T, limits limiter.Limits, nodes int) []limiter.Limiter {
			ls := newLimiters(t, limits, nodes)
			out := make([]limiter.Limiter, nodes)
			for i, l := range ls {
				out[i] = l
			}
			return out
		},
	}
}

// redisNow reads Redis TIME in the scripts' unit.
func redisNow(t testing.TB, c redis.UniversalClient) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.Unix()*1_000_000 + int64(now.Nanosecond()/1000) - scriptEpoch*1_000_000
}

func TestSuite(t *testing.T) {
	limitertest.Run(t, backend(shared, nil))
}

// TestSuiteCluster groups checks by hash tag as on Redis Cluster: several
// pipelined scripts per request, refunds when one group denies.
func TestSuiteCluster(t *testing.T) {
	limitertest.Run(t, backend(shared, func(c *Config) { c.Cluster = true }))
}

// TestSuiteBatch coalesces concurrent calls into shared batch.lua calls
// (small batches, so that the concurrent tests fill them).
func TestSuiteBatch(t *testing.T) {
	limitertest.Run(t, backend(shared, func(c *Config) { c.Batch = true; c.MaxInflight = 1; c.MaxBatch = 8 }))
}

// TestSuiteBatchCluster batches with the cluster layout: one batch.lua call
// per hash slot, refunds of split decisions.
func TestSuiteBatchCluster(t *testing.T) {
	limitertest.Run(t, backend(shared, func(c *Config) { c.Cluster = true; c.Batch = true; c.MaxInflight = 2; c.MaxBatch = 16 }))
}

// TestSuiteLease batches and leases (doc.go, "Leases") with the production
// settings: the suite's rules admit too little per lease TTL to be leased
// (or are weighted or GCRA), so every decision stays exact; lease_test.go
// tests leased counters.
func TestSuiteLease(t *testing.T) {
	limitertest.Run(t, backend(shared, func(c *Config) { c.Batch = true; c.MaxBatch = 16; c.LeaseTTL = DefaultLeaseTTL }))
}

// TestSuiteRedisCluster runs the suite on a real three-master Redis Cluster
// (throwaway servers): no script may touch keys of two slots.
func TestSuiteRedisCluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 16411, 16412, 16413)
	var n int
	limitertest.Run(t, backend(func(t *testing.T) (redis.UniversalClient, string) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
		t.Cleanup(func() { c.Close() })
		n++
		return c, fmt.Sprintf("t%d:", n)
	}, nil))
	// Batched: each call's keys must share one slot although they belong
	// to different hash tags (and requests).
	limitertest.Run(t, backend(func(t *testing.T) (redis.UniversalClient, string) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
		t.Cleanup(func() { c.Close() })
		n++
		return c, fmt.Sprintf("t%d:", n)
	}, func(c *Config) { c.Batch = true; c.MaxBatch = 16 }))
	// Batched with leases.
	limitertest.Run(t, backend(func(t *testing.T) (redis.UniversalClient, string) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
		t.Cleanup(func() { c.Close() })
		n++
		return c, fmt.Sprintf("t%d:", n)
	}, func(c *Config) { c.Batch = true; c.MaxBatch = 16; c.LeaseTTL = DefaultLeaseTTL }))
	// Leased counters: a lease script touches one key.
	t.Run("Lease", func(t *testing.T) {
		leaseTests(t, func(t *testing.T) (redis.UniversalClient, string) {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
			t.Cleanup(func() { c.Close() })
			n++
			return c, fmt.Sprintf("t%d:", n)
		})
	})
}
