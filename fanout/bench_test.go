package fanout_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/postgres"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// countingPusher counts deliveries and frames without writing anything.
type countingPusher struct {
	deliveries, frames atomic.Int64
}

func (p *countingPusher) Push(x *fanout.Push) int {
	n := len(x.Msgs)
	if x.Kind == fanout.PushSummary {
		n = x.Count
	}
	p.deliveries.Add(int64(n * len(x.Conns)))
	if x.Kind == fanout.PushMsgs {
		p.frames.Add(int64(len(x.Msgs) * len(x.Conns)))
	} else {
		p.frames.Add(int64(len(x.Conns)))
	}
	return 0
}

func (p *countingPusher) Degraded(int64, fanout.Level, []fanout.Conn) {}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPushPath is the engine-side cost of one group's push path at L0
// (one msg push per message to every online member) versus L1 (one batch
// per merge window): commit, presence walk and Pusher call, with a Pusher
// that only counts. It reports process CPU per delivered message; the
// gateway's encoding and writes are measured end to end by fanfare bench.
func BenchmarkPushPath(b *testing.B) {
	for _, online := range []int{10000} {
		for _, level := range []fanout.Level{fanout.L0Normal, fanout.L1Merge} {
			b.Run(fmt.Sprintf("online=%d/level=L%d", online, level), func(b *testing.B) {
				st := openStore(b)
				pres := newPresence(b)
				push := &countingPusher{}
				e := enginetest.Start(b, fanout.Config{Tuning: fanout.Tuning{GroupRate: -1, DownlinkRate: -1, HotFactor: -1, Tier2Off: true}, Store: st, Presence: pres, Pusher: push})
				uids := make([]string, online) // uids[0], the sender, is online too
				for i := range uids {
					uids[i] = fmt.Sprintf("u%05d", i)
				}
				gid := newGroup(b, st, uids...)
				ctx := context.Background()
				for _, uid := range uids {
					if _, err := e.Connect(ctx, &testConn{uid}); err != nil {
						b.Fatal(err)
					}
				}
				if level != fanout.L0Normal {
					e.Levels().Force(gid, &level, 0)
				}
				// One message per commit (the worst case for L0; at 1,000
				// msg/s commits hold a few messages each).
				cpu0, d0 := cpuTime(), push.deliveries.Load()
				n := 0
				for b.Loop() {
					n++
					r := e.SendWait(ctx, fanout.SendRequest{GID: gid, UID: uids[0], ClientMsgID: fmt.Sprint(n), Body: []byte(`{"text":"hello, this is a benchmark message"}`)})
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
				want := int64(n * online)
				deadline := time.Now().Add(5 * time.Second)
				for push.deliveries.Load()-d0 < want && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				cpu, d := cpuTime()-cpu0, push.deliveries.Load()-d0
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(d), "cpu-ns/delivery")
				b.ReportMetric(float64(push.frames.Load())/float64(n), "frames/msg")
			})
		}
	}
}

// statementStore counts the store calls the engine makes (each is one
// Postgres transaction; Append is one UPDATE ... RETURNING per group plus
// one insert).
type statementStore struct {
	store.Store
	append, advance, active, group, other atomic.Int64
	rows                                  atomic.Int64 // conversations advanced
}

func (s *statementStore) Append(ctx context.Context, reqs []store.AppendRequest, res []store.AppendResult) error {
	s.append.Add(1)
	return s.Store.Append(ctx, reqs, res)
}

func (s *statementStore) AdvanceConversations(ctx context.Context, gid int64, uids []string, lastSeq int64) error {
	s.advance.Add(1)
	s.rows.Add(int64(len(uids)))
	return s.Store.AdvanceConversations(ctx, gid, uids, lastSeq)
}

func (s *statementStore) ActiveMembersSince(ctx context.Context, gid int64, since time.Time) ([]string, error) {
	s.active.Add(1)
	return s.Store.ActiveMembersSince(ctx, gid, since)
}

func (s *statementStore) Group(ctx context.Context, gid int64) (store.Group, error) {
	s.group.Add(1)
	return s.Store.Group(ctx, gid)
}

func (s *statementStore) reset() {
	for _, c := range []*atomic.Int64{&s.append, &s.advance, &s.active, &s.group, &s.other, &s.rows} {
		c.Store(0)
	}
}

// BenchmarkTier2Statements measures the Postgres statements per second of
// one group of 10,000 members (1,000 online, 2,000 more active within 7
// days, 7,000 silent) receiving 1,000 messages per second, with tier 2 on
// and off. Each iteration is one second of load.
func BenchmarkTier2Statements(b *testing.B) {
	url := pgtest.URL(b)
	for _, tier2 := range []string{"on", "off"} {
		b.Run("members=10000/online=10pct/active=30pct/rate=1000/tier2="+tier2, func(b *testing.B) {
			ctx := context.Background()
			pg, err := postgres.Open(ctx, postgres.Config{URL: url, Schema: pgtest.Schema(b, url)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { pg.Close() })
			st := &statementStore{Store: pg}
			cfg := fanout.Config{Tuning: fanout.Tuning{GroupRate: -1, DownlinkRate: -1, HotFactor: -1, Tier2MinActiveShare: -1}, Store: st, Presence: newPresence(b), Pusher: &countingPusher{}}
			if tier2 == "off" {
				cfg.Tier2Off = true
			}
			e := enginetest.Start(b, cfg)
			uids := make([]string, 10000)
			for i := range uids {
				uids[i] = fmt.Sprintf("u%05d", i)
			}
			g, err := pg.CreateGroup(ctx, store.Group{Name: "bench", Owner: uids[0]})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := pg.AddMembers(ctx, g.GID, uids); err != nil {
				b.Fatal(err)
			}
			for _, uid := range uids[1000:3000] {
				if err := pg.TouchUser(ctx, uid, time.Now().Add(-24*time.Hour)); err != nil {
					b.Fatal(err)
				}
			}
			for _, uid := range uids[:1000] {
				if _, err := e.Connect(ctx, &testConn{uid}); err != nil {
					b.Fatal(err)
				}
			}
			st.reset()
			const rate = 1000
			var sent, failed atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for b.Loop() {
				// 1,000 sends over one second, in 10 ms steps.
				tick := time.NewTicker(10 * time.Millisecond)
				for range 100 {
					<-tick.C
					for range rate / 100 {
						n := sent.Add(1)
						wg.Add(1)
						e.Send(fanout.SendRequest{GID: g.GID, UID: uids[n%1000], ClientMsgID: fmt.Sprint(n), Body: []byte(`"bench"`), Done: func(r fanout.SendResult) {
							if r.Err != nil {
								failed.Add(1)
							}
							wg.Done()
						}})
					}
				}
				tick.Stop()
			}
			wg.Wait()
			secs := time.Since(start).Seconds()
			if failed.Load() > 0 {
				b.Errorf("%d of %d sends failed", failed.Load(), sent.Load())
			}
			total := st.append.Load() + st.advance.Load() + st.active.Load() + st.group.Load()
			b.ReportMetric(float64(total)/secs, "stmts/s")
			b.ReportMetric(float64(st.append.Load())/secs, "appends/s")
			b.ReportMetric(float64(st.advance.Load())/secs, "advances/s")
			b.ReportMetric(float64(st.rows.Load())/secs, "conv-rows/s")
			b.ReportMetric(float64(st.active.Load()+st.group.Load())/secs, "meta-reads/s")
		})
	}
}
