package retention_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
	"github.com/fanfare-im/fanfare/store/retention"
)

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func send(t *testing.T, st store.Store, gid int64, n int) {
	t.Helper()
	reqs := make([]store.AppendRequest, n)
	res := make([]store.AppendResult, n)
	for i := range reqs {
		reqs[i] = store.AppendRequest{GID: gid, Sender: "a", ClientMsgID: fmt.Sprint(time.Now().UnixNano(), "-", i), Body: []byte(`1`)}
	}
	if err := st.Append(context.Background(), reqs, res); err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}

// TestRound: messages older than Keep go from every group, in batches
// (more messages than a batch); newer ones and last_seq stay.
func TestRound(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	var gids []int64
	for range 3 {
		g, err := st.CreateGroup(ctx, store.Group{Name: "g", Owner: "a"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.AddMembers(ctx, g.GID, []string{"a"}); err != nil {
			t.Fatal(err)
		}
		gids = append(gids, g.GID)
		send(t, st, g.GID, 7)
	}
	time.Sleep(20 * time.Millisecond)
	now := time.Now()
	time.Sleep(20 * time.Millisecond)
	send(t, st, gids[0], 2)
	sw, err := retention.New(retention.Config{Store: st, Keep: time.Hour, Batch: 3, Now: func() time.Time { return now.Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	groups, deleted, err := sw.Round(ctx)
	if err != nil || groups != 3 || deleted != 21 {
		t.Fatalf("round: %d groups, %d deleted, %v; want 3, 21", groups, deleted, err)
	}
	for i, gid := range gids {
		msgs, last, err := st.Messages(ctx, gid, "a", 0, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if i == 0 {
			want = 2
		}
		if len(msgs) != want || last != int64(7+want) {
			t.Errorf("group %d: %d messages left, last_seq %d; want %d, %d", gid, len(msgs), last, want, 7+want)
		}
	}
}

// TestLock: a round another node holds deletes nothing; a lock error
// skips the round too.
func TestLock(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	g, _ := st.CreateGroup(ctx, store.Group{Name: "g", Owner: "a"})
	if _, err := st.AddMembers(ctx, g.GID, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	send(t, st, g.GID, 3)
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	for _, lock := range []func(context.Context, int64, time.Duration) (bool, error){
		func(context.Context, int64, time.Duration) (bool, error) { return false, nil },
		func(context.Context, int64, time.Duration) (bool, error) { return false, errors.New("redis down") },
	} {
		sw, err := retention.New(retention.Config{Store: st, Keep: time.Hour, Now: later, Lock: lock, Interval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- sw.Run(rctx) }()
		time.Sleep(50 * time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if msgs, _, _ := st.Messages(ctx, g.GID, "a", 0, 0, 0, 0); len(msgs) != 3 {
			t.Fatalf("round held elsewhere: %d messages left, want 3", len(msgs))
		}
	}
}

// TestConfig: a sweeper needs a store and a positive Keep.
func TestConfig(t *testing.T) {
	st := openStore(t)
	for _, cfg := range []retention.Config{{Keep: time.Hour}, {Store: st}, {Store: st, Keep: -time.Hour}, {Store: st, Keep: time.Hour, Batch: -1}} {
		if _, err := retention.New(cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
}

// failingStore fails ExpireMessages for one group.
type failingStore struct {
	store.Store
	bad int64
}

func (s failingStore) ExpireMessages(ctx context.Context, gid int64, before time.Time, limit int) (int, error) {
	if gid == s.bad {
		return 0, errors.New("corrupt record")
	}
	return s.Store.ExpireMessages(ctx, gid, before, limit)
}

// TestFailingGroupLeftForNextRound: a group that fails does not stop the
// walk: the groups after it are swept, and the round reports the failure.
func TestFailingGroupLeftForNextRound(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	var gids []int64
	for range 3 {
		g, _ := st.CreateGroup(ctx, store.Group{Name: "g", Owner: "a"})
		if _, err := st.AddMembers(ctx, g.GID, []string{"a"}); err != nil {
			t.Fatal(err)
		}
		send(t, st, g.GID, 2)
		gids = append(gids, g.GID)
	}
	sw, err := retention.New(retention.Config{Store: failingStore{st, gids[0]}, Keep: time.Hour,
		Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	groups, deleted, err := sw.Round(ctx)
	if err == nil || groups != 3 || deleted != 4 {
		t.Fatalf("round: %d groups, %d deleted, %v; want 3, 4 and an error naming group %d", groups, deleted, err, gids[0])
	}
}
