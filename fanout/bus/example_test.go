package bus_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/store"
)

// Example shows the engine's side: publish after commit, route remote
// batches to the group's worker, subscribe the groups online here.
func Example() {
	hub := bus.NewLocal()               // cmd would use redisbus.New in cluster mode
	worker := make(chan *bus.Batch, 16) // stands for the group's shard worker queue

	nodeA, _ := hub.NewNode(bus.Config{NodeID: "a", Handler: func(b *bus.Batch) { b.Release() }})
	nodeB, _ := hub.NewNode(bus.Config{NodeID: "b", Handler: func(b *bus.Batch) {
		select {
		case worker <- b: // the worker pushes it like a local commit, then b.Release()
		default:
			b.Release() // worker queue full: drop; clients pull the gap
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go nodeA.Run(ctx)
	go nodeB.Run(ctx)

	_ = nodeB.Subscribe(42) // a member of group 42 came online on node b
	_ = nodeB.SyncSubscriptions(ctx)

	// On node a's shard worker, right after the commit returned seqs:
	committed := []store.Message{
		{GID: 42, Seq: 7, Sender: "alice", ClientMsgID: "m1", Kind: store.KindText, Body: []byte(`"hi"`), CreatedAt: time.Now()},
		{GID: 42, Seq: 8, Sender: "bob", ClientMsgID: "m2", Kind: store.KindText, Body: []byte(`"yo"`), CreatedAt: time.Now()},
	}
	_ = nodeA.Publish(42, 0, committed) // never blocks; an error is a counted drop

	b := <-worker
	for _, m := range b.Msgs {
		fmt.Println(b.Origin, m.GID, m.Seq, m.Sender, string(m.Body))
	}
	b.Release()
	// Output:
	// a 42 7 alice "hi"
	// a 42 8 bob "yo"
}
