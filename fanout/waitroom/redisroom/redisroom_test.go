package redisroom_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/waitroom/redisroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/waitroomtest"
	"github.com/fanfare-im/fanfare/internal/redistest"
)

// testClient connects to the test Redis; an unreachable Redis fails the
// test, never skips it.
func testClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(), PoolSize: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s (FANFARE_TEST_REDIS_ADDR) unreachable: %v", redistest.Addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns a random key prefix and deletes its keys at cleanup.
func testPrefix(t testing.TB, c *redis.Client) string {
	var b [6]byte
	rand.Read(b[:])
	p := "fanfaretest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { deletePrefix(c, p) })
	return p
}

func deletePrefix(c *redis.Client, p string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}

func newBackend(t testing.TB, c *redis.Client) *redisroom.Backend {
	b, err := redisroom.New(redisroom.Config{Client: c, Prefix: testPrefix(t, c)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRedisConformance(t *testing.T) {
	c := testClient(t)
	waitroomtest.Run(t, func(t *testing.T) waitroomtest.Harness {
		return waitroomtest.Harness{Backend: newBackend(t, c), Sleep: time.Sleep}
	})
}
