package fanout_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/store"
)

// blockingPusher holds the first Push until release is closed: the
// group's worker stays busy with that batch meanwhile.
type blockingPusher struct {
	entered, release chan struct{}
}

func (b *blockingPusher) Push(p *fanout.Push) int {
	select {
	case <-b.entered:
	default:
		close(b.entered)
		<-b.release
	}
	return 0
}

func (b *blockingPusher) Degraded(int64, fanout.Level, []fanout.Conn) {}

// TestAdminChangesOnTheWorker: the engine's group administration runs on
// the group's worker, ordered with its sends: a state change waits for
// the batch the worker is pushing, and the sends after it see the new
// state.
func TestAdminChangesOnTheWorker(t *testing.T) {
	st := openStore(t)
	bp := &blockingPusher{entered: make(chan struct{}), release: make(chan struct{})}
	e := enginetest.Start(t, fanout.Config{Store: st, Presence: newPresence(t), Pusher: bp})
	var released sync.Once
	release := func() { released.Do(func() { close(bp.release) }) }
	t.Cleanup(release) // before the engine's drain (cleanups run last first), also on a failure
	ctx := context.Background()
	g, err := e.CreateGroup(ctx, store.Group{Name: "g", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.Group(ctx, g.GID); err != nil || got.Owner != "alice" || got.State != store.StateActive {
		t.Fatalf("Group after CreateGroup: %+v %v, want alice's active group", got, err)
	}
	if _, err := e.AddMembers(ctx, g.GID, []string{"alice", "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Connect(ctx, &testConn{"bob"}); err != nil {
		t.Fatal(err)
	}
	sent := make(chan fanout.SendResult, 1)
	go func() { sent <- send(e, g.GID, "alice", "m1") }()
	select {
	case <-bp.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the send was not pushed within 10s")
	}

	changed := make(chan error, 1)
	go func() {
		_, err := e.SetGroupState(ctx, g.GID, store.StateMutedAll)
		changed <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if got, err := st.Group(ctx, g.GID); err != nil || got.State != store.StateActive {
		t.Fatalf("state while the worker pushes: %v %v, want still active (the change waits for the worker)", got.State, err)
	}
	release()
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	if r := <-sent; r.Err != nil {
		t.Fatalf("the send before the change: %v", r.Err)
	}
	if r := send(e, g.GID, "alice", "m2"); !errors.Is(r.Err, store.ErrGroupClosed) {
		t.Errorf("send after muted_all: %v, want ErrGroupClosed", r.Err)
	}
	if err := e.SetUserTier(ctx, "bob", 2); err != nil {
		t.Fatal(err)
	}
	if u, err := st.User(ctx, "bob"); err != nil || u.Tier != 2 {
		t.Errorf("bob after SetUserTier(2): %+v %v", u, err)
	}
}
