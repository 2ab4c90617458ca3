package bus

import (
	"context"
	"testing"
	"time"
)

// BenchmarkEncode: one 100-message payload (64-byte bodies) per op.
func BenchmarkEncode(b *testing.B) {
	msgs := testMsgs(9, 100, 64)
	var p []byte
	b.ReportAllocs()
	for b.Loop() {
		p = AppendBatch(p[:0], "node-a", 9, 0, msgs)
	}
	b.SetBytes(int64(len(p)))
	b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkDecode: one 100-message payload per op into a reused batch.
func BenchmarkDecode(b *testing.B) {
	msgs := testMsgs(9, 100, 64)
	p := AppendBatch(nil, "node-a", 9, 0, msgs)
	dst := &Batch{}
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeBatch(dst, p, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkLocal: publish on one node, receive on another, in process;
// one 100-message batch per op, measured until the last is handled.
func BenchmarkLocal(b *testing.B) {
	l := NewLocal()
	got := make(chan struct{}, 1024)
	recv, err := l.NewNode(Config{NodeID: "b", Handler: func(bt *Batch) { bt.Release(); got <- struct{}{} }})
	if err != nil {
		b.Fatal(err)
	}
	pub, err := l.NewNode(Config{NodeID: "a", Handler: func(bt *Batch) { bt.Release() }})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = recv.Run(ctx) }()
	go func() { _ = pub.Run(ctx) }()
	_ = recv.Subscribe(9)
	if err := recv.SyncSubscriptions(ctx); err != nil {
		b.Fatal(err)
	}
	msgs := testMsgs(9, 100, 64)
	b.ReportAllocs()
	for b.Loop() {
		// One in flight at a time: no coalescing, every batch a payload.
		if err := pub.Publish(9, 0, msgs); err != nil {
			b.Fatal(err)
		}
		<-got
	}
	b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkPublish is Publish alone (a transport that takes everything),
// one message at a time over 1,000 groups, with tail hints on (the map
// write per call) and off: the cost of keeping each group's hint.
func BenchmarkPublish(b *testing.B) {
	for _, tc := range []struct {
		name string
		tail time.Duration
	}{{"tails", 0}, {"no-tails", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			n, err := New(Config{NodeID: "a", Handler: func(bt *Batch) { bt.Release() }, TailDelay: tc.tail}, nopTransport{})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = n.Run(ctx) }()
			msgs := testMsgs(1, 1, 64)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				gid := int64(i%1000) + 1
				msgs[0].GID, msgs[0].Seq = gid, int64(i)+1
				if err := n.Publish(gid, 0, msgs); err != nil && err != ErrFull {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkQueueDueTails is one tailLoop tick with MaxTails hints waiting
// and none due (the steady state of a node publishing to 65,536 groups in
// every TailDelay): what the tick costs the outbox lock that Publish takes.
func BenchmarkQueueDueTails(b *testing.B) {
	n, err := New(Config{NodeID: "a", Handler: func(bt *Batch) { bt.Release() }}, nopTransport{})
	if err != nil {
		b.Fatal(err)
	}
	due := time.Now().Add(time.Hour)
	for gid := int64(1); gid <= int64(n.cfg.MaxTails); gid++ {
		n.noteTail(gid, 1, 1, due)
	}
	now := time.Now()
	for b.Loop() {
		n.queueDueTails(now, tailsPerTick)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/tick")
}
