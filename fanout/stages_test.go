package fanout_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
)

// originPusher records each push's Origin and reports a write pass for it
// the way the socket layer does (Metrics.ObserveWrites).
type originPusher struct {
	*recorder
	m       *fanout.Metrics
	mu      sync.Mutex
	origins []int64
}

func (p *originPusher) Push(push *fanout.Push) int {
	p.mu.Lock()
	p.origins = append(p.origins, push.Origin)
	p.mu.Unlock()
	now := time.Now().UnixNano()
	p.m.ObserveWrites(push.Origin, now, now)
	return p.recorder.Push(push)
}

// TestMessageStages: every stored send is observed at admission and
// commit, every L0 push at push_enqueue and (by the pusher) first_write and
// last_write, all from the send's Engine.Send: Push.Origin lies between
// the first send's start and the push.
func TestMessageStages(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := fanout.NewMetrics(reg)
	st := openStore(t)
	pres := newPresence(t)
	p := &originPusher{recorder: newRecorder(), m: m}
	e := enginetest.Start(t, fanout.Config{Store: st, Presence: pres, Pusher: p, Metrics: m})
	gid := newGroup(t, st, "alice", "bob")
	if _, err := e.Connect(context.Background(), &testConn{"bob"}); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixNano()
	const sends = 5
	for i := range sends {
		if r := e.SendWait(context.Background(), fanout.SendRequest{GID: gid, UID: "alice", ClientMsgID: fmt.Sprint(i), Body: []byte(`{"t":1}`)}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	waitUntil(t, "every message pushed to bob", func() bool { return len(p.recorder.seqs("bob")) == sends })
	counts := map[string]uint64{}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "fanfare_message_stage_seconds" {
			continue
		}
		for _, mm := range f.GetMetric() {
			counts[mm.GetLabel()[0].GetValue()] = mm.GetHistogram().GetSampleCount()
		}
	}
	p.mu.Lock()
	pushes := uint64(len(p.origins))
	for _, o := range p.origins {
		if o < before || o > time.Now().UnixNano() {
			t.Errorf("Push.Origin %d outside [%d, now]", o, before)
		}
	}
	p.mu.Unlock()
	want := map[string]uint64{"admission": sends, "commit": sends, "push_enqueue": pushes, "first_write": pushes, "last_write": pushes}
	for stage, n := range want {
		if counts[stage] != n {
			t.Errorf("stage %s: %d observations, want %d (all: %v)", stage, counts[stage], n, counts)
		}
	}
}

// TestObserveWritesNoAllocs: the write-pass observation the socket layer
// makes per frame and pass allocates nothing; origin 0 records nothing.
func TestObserveWritesNoAllocs(t *testing.T) {
	m := fanout.NewMetrics(prometheus.NewRegistry())
	now := time.Now().UnixNano()
	if a := testing.AllocsPerRun(1000, func() { m.ObserveWrites(now-1e6, now-5e5, now) }); a != 0 {
		t.Fatalf("ObserveWrites: %v allocations, want 0", a)
	}
	var nilM *fanout.Metrics
	nilM.ObserveWrites(now, now, now) // a nil *Metrics records nothing
}
