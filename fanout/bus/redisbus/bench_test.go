package redisbus

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/internal/redistest"
	"github.com/fanfare-im/fanfare/store"
)

// BenchmarkPublishReceive: node a publishes 100-message batches (64-byte
// bodies) over 64 groups, node b (subscribed) receives them, both through
// the test Redis. One op = one batch published and handed to b's handler;
// allocs/op counts both nodes and go-redis. inflight bounds the batches
// published but not yet received (1 = one round trip per batch).
func BenchmarkPublishReceive(b *testing.B) {
	for _, inflight := range []int{1, 64} {
		b.Run("msgs=100/inflight="+strconv.Itoa(inflight), func(b *testing.B) {
			benchPublishReceive(b, inflight)
		})
	}
}

func benchPublishReceive(b *testing.B, inflight int) {
	addr := redistest.Addr()
	client(b, addr)
	prefix := randomPrefix()
	var gotMsgs atomic.Int64
	wake := make(chan struct{}, 1)
	newNode := func(id string, h bus.Handler) *bus.Node {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		b.Cleanup(func() { _ = rdb.Close() })
		n, err := New(Config{Client: rdb, Prefix: prefix, Bus: bus.Config{NodeID: id, Handler: h}})
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	recv := newNode("b", func(bt *bus.Batch) {
		gotMsgs.Add(int64(len(bt.Msgs)))
		bt.Release()
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	pub := newNode("a", func(bt *bus.Batch) { bt.Release() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	for _, n := range []*bus.Node{recv, pub} {
		go func() { _ = n.Run(ctx); done <- struct{}{} }()
	}
	b.Cleanup(func() { cancel(); <-done; <-done })
	const groups = 64
	batches := make([][]store.Message, groups)
	for g := range groups {
		if err := recv.Subscribe(int64(g)); err != nil {
			b.Fatal(err)
		}
		ms := make([]store.Message, 100)
		for i := range ms {
			ms[i] = store.Message{GID: int64(g), Seq: int64(i + 1), Sender: "user-" + strconv.Itoa(i%50),
				ClientMsgID: "cmid-" + strconv.Itoa(i), Kind: store.KindText,
				Body: []byte(`"0123456789012345678901234567890123456789012345678901234567890"`), CreatedAt: time.UnixMilli(1_700_000_000_000)}
		}
		batches[g] = ms
	}
	if err := recv.SyncSubscriptions(ctx); err != nil {
		b.Fatal(err)
	}
	wait := func(target int64) {
		for gotMsgs.Load() < target {
			select {
			case <-wake:
			case <-time.After(5 * time.Second):
				b.Fatalf("received %d of %d messages (stats %+v)", gotMsgs.Load(), target, pub.Stats())
			}
		}
	}
	var sent int64
	b.ReportAllocs()
	for b.Loop() {
		g := int(sent/100) % groups
		if err := pub.Publish(int64(g), 0, batches[g]); err != nil {
			b.Fatal(err)
		}
		sent += 100
		wait(sent - int64(100*(inflight-1)))
	}
	wait(sent)
	s := pub.Stats()
	b.ReportMetric(float64(sent)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(s.Published)/float64(b.N), "payloads/batch")
}
