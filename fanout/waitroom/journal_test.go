package waitroom_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/waitroomtest"
	"github.com/fanfare-im/fanfare/store/embedded"
)

func openStore(t *testing.T, dir string) *embedded.Store {
	t.Helper()
	st, err := embedded.Open(embedded.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestDurableMemoryConformance runs the suite on the durable backend (in
// a real embedded store) and, after every call, checks that what the
// journal holds, loaded afresh, equals the live state: a change that
// skipped the journal would be lost at the next restart.
func TestDurableMemoryConformance(t *testing.T) {
	waitroomtest.Run(t, func(t *testing.T) waitroomtest.Harness {
		clk := &virtualClock{now: time.Unix(1_750_000_000, 250_000_000)}
		st := openStore(t, t.TempDir())
		t.Cleanup(func() { st.Close() })
		m, err := waitroom.OpenMemory(t.Context(), st, waitroom.MemoryConfig{Clock: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		return waitroomtest.Harness{Backend: &checked{t: t, m: m, cfgs: map[string]waitroom.RoomConfig{}}, Sleep: clk.Advance}
	})
}

// checked is a durable Memory whose journal is compared with its state
// after every call.
type checked struct {
	t  *testing.T
	m  *waitroom.Memory
	mu sync.Mutex
	// cfgs are the last configuration seen per room.
	cfgs map[string]waitroom.RoomConfig
}

func (c *checked) check(cfg *waitroom.RoomConfig) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cfg != nil {
		c.cfgs[cfg.Name] = *cfg
	}
	d, err := waitroom.JournalDiff(context.Background(), c.m, c.cfgs)
	if err != nil {
		c.t.Errorf("load journal: %v", err)
	} else if d != "" {
		c.t.Errorf("journal differs from the live state: %s", d)
	}
}

func (c *checked) Enter(ctx context.Context, cfg *waitroom.RoomConfig, req waitroom.EnterRequest) (waitroom.EnterResult, error) {
	defer c.check(cfg)
	return c.m.Enter(ctx, cfg, req)
}

func (c *checked) Disconnect(ctx context.Context, cfg *waitroom.RoomConfig, uid, node string) (waitroom.Departure, error) {
	defer c.check(cfg)
	return c.m.Disconnect(ctx, cfg, uid, node)
}

func (c *checked) Leave(ctx context.Context, cfg *waitroom.RoomConfig, uid string) (waitroom.Departure, error) {
	defer c.check(cfg)
	return c.m.Leave(ctx, cfg, uid)
}

func (c *checked) Admit(ctx context.Context, cfg *waitroom.RoomConfig, req waitroom.AdmitRequest) (waitroom.AdmitResult, error) {
	defer c.check(cfg)
	return c.m.Admit(ctx, cfg, req)
}

func (c *checked) Holds(ctx context.Context, cfg *waitroom.RoomConfig, node string) ([]string, error) {
	return c.m.Holds(ctx, cfg, node)
}

func (c *checked) Maintain(ctx context.Context, cfg *waitroom.RoomConfig, req waitroom.MaintainRequest) (waitroom.MaintainResult, error) {
	defer c.check(cfg)
	return c.m.Maintain(ctx, cfg, req)
}

func (c *checked) Snapshot(ctx context.Context, cfg *waitroom.RoomConfig, uids []string, since int64) (waitroom.Snapshot, error) {
	defer c.check(cfg)
	return c.m.Snapshot(ctx, cfg, uids, since)
}

func (c *checked) Trim(ctx context.Context, cfg *waitroom.RoomConfig) (int, error) {
	defer c.check(cfg)
	return c.m.Trim(ctx, cfg)
}

func (c *checked) SaveConfig(ctx context.Context, cfg waitroom.RoomConfig) error {
	defer c.check(nil)
	return c.m.SaveConfig(ctx, cfg)
}

func (c *checked) LoadConfigs(ctx context.Context) ([]waitroom.RoomConfig, error) {
	return c.m.LoadConfigs(ctx)
}

func (c *checked) DeleteRoom(ctx context.Context, name string) error {
	defer c.check(nil)
	return c.m.DeleteRoom(ctx, name)
}

func (c *checked) Health(ctx context.Context) (waitroom.Health, error) { return c.m.Health(ctx) }

// TestDurableMemoryRestart: a room, its queue and its admitted sessions
// survive closing and reopening the store. Waiting users come back away
// (their sockets are gone) and get their positions back when they enter
// again within grace; an admitted user who comes back keeps its session,
// one who does not is ended after the node timeout.
func TestDurableMemoryRestart(t *testing.T) {
	dir := t.TempDir()
	clk := &virtualClock{now: time.Unix(1_750_000_000, 0)}
	cfg := waitroom.RoomConfig{Name: "sale", MaxActive: 2, AdmitRate: 1, AdmitBurst: 2, Smoothing: -1, Grace: time.Minute}.WithDefaults()
	ctx := t.Context()

	st := openStore(t, dir)
	m, err := waitroom.OpenMemory(ctx, st, waitroom.MemoryConfig{Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SaveConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	enter := func(u string, lvl int) {
		t.Helper()
		if _, err := m.Enter(ctx, &cfg, waitroom.EnterRequest{UID: u, Tier: lvl, Node: "n1"}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
	}
	enter("a1", 0)
	enter("a2", 0)
	ad, err := m.Admit(ctx, &cfg, waitroom.AdmitRequest{})
	if err != nil || len(ad.Admitted) != 2 {
		t.Fatalf("Admit: %+v, %v", ad, err)
	}
	enter("w1", 0)
	enter("w2", 0)
	enter("vip", 2)
	enter("w3", 0)
	if _, err := m.Maintain(ctx, &cfg, waitroom.MaintainRequest{Node: "n1", NodeTimeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	waiting := []string{"vip", "w1", "w2", "w3"} // admission order: the VIP's bias puts it first
	before, err := m.Snapshot(ctx, &cfg, waiting, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range before.Positions {
		if p.State != waitroom.EntryWaiting || p.Ahead != int64(i) {
			t.Fatalf("before the restart: %s is %v with %d ahead, want waiting with %d", p.UID, p.State, p.Ahead, i)
		}
	}
	if err := st.Close(); err != nil { // the process stops (without draining: a crash)
		t.Fatal(err)
	}

	clk.Advance(10 * time.Second)
	st = openStore(t, dir)
	defer st.Close()
	m, err = waitroom.OpenMemory(ctx, st, waitroom.MemoryConfig{Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	cfgs, err := m.LoadConfigs(ctx)
	if err != nil || len(cfgs) != 1 || cfgs[0].Name != "sale" || cfgs[0].MaxActive != 2 || cfgs[0].Grace != time.Minute {
		t.Fatalf("configs after the restart: %+v, %v", cfgs, err)
	}
	s, err := m.Snapshot(ctx, &cfg, append([]string{"a1", "a2"}, waiting...), 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Active != 2 || s.Away != 4 || s.Waiting != 0 || s.WaitingByTier != [waitroom.MaxTier + 1]int64{} {
		t.Fatalf("after the restart: %d active, %d away, %d waiting (by tier %v); want 2, 4, 0 (none)",
			s.Active, s.Away, s.Waiting, s.WaitingByTier)
	}
	if before.WaitingByTier != [waitroom.MaxTier + 1]int64{3, 0, 1, 0} {
		t.Fatalf("before the restart: waiting by tier %v, want [3 0 1 0]", before.WaitingByTier)
	}
	for i, u := range waiting { // back, in reverse order: positions are kept, not taken anew
		u = waiting[len(waiting)-1-i]
		res, err := m.Enter(ctx, &cfg, waitroom.EnterRequest{UID: u, Tier: 0, Node: "n2"})
		if err != nil || res.Status != waitroom.EnterRestored {
			t.Fatalf("%s back: %v, %v; want restored", u, res.Status, err)
		}
		if res.Entry.Join != before.Positions[len(waiting)-1-i].Join {
			t.Errorf("%s back: join %v, want %v", u, res.Entry.Join, before.Positions[len(waiting)-1-i].Join)
		}
	}
	after, err := m.Snapshot(ctx, &cfg, waiting, 0)
	if err != nil {
		t.Fatal(err)
	}
	if after.WaitingByTier != before.WaitingByTier {
		t.Errorf("after the restart, all back: waiting by tier %v, want %v", after.WaitingByTier, before.WaitingByTier)
	}
	for i, p := range after.Positions {
		if p.State != waitroom.EntryWaiting || p.Ahead != before.Positions[i].Ahead {
			t.Errorf("after the restart: %s is %v with %d ahead, want waiting with %d", p.UID, p.State, p.Ahead, before.Positions[i].Ahead)
		}
	}
	if res, err := m.Enter(ctx, &cfg, waitroom.EnterRequest{UID: "a1", Node: "n2"}); err != nil || res.Status != waitroom.EnterActive {
		t.Fatalf("a1 back: %v, %v; want active", res.Status, err)
	}
	// n1 is gone: a2's session ends once n1's last heartbeat is older than
	// the node timeout, even if the new process is also called n1.
	clk.Advance(25 * time.Second)
	mr, err := m.Maintain(ctx, &cfg, waitroom.MaintainRequest{Node: "n1", NodeTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(mr.Ended) != 1 || mr.Ended[0].UID != "a2" || mr.Ended[0].Reason != waitroom.EndDisconnect {
		t.Fatalf("ended after the node timeout: %+v, want a2 (disconnect)", mr.Ended)
	}
	if s, _ := m.Snapshot(ctx, &cfg, []string{"a1"}, 0); s.Positions[0].State != waitroom.EntryActive {
		t.Errorf("a1 (back in time) is %v, want active", s.Positions[0].State)
	}
}
