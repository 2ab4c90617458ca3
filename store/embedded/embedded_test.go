package embedded

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/fanfare-im/fanfare/store"
)

// openTest opens a Store in a fresh temporary directory, closed when t ends.
func openTest(t testing.TB, cfg Config) *Store {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		bad  int // number of problems reported
	}{
		{"zero", Config{}, 0},
		{"negative limits", Config{Limits: store.Limits{MaxBatch: -1, MaxRange: -2}}, 2},
		{"negative sizes", Config{CacheBytes: -1, MemTableBytes: -1, MaxOpenFiles: -1, MaxRoundBytes: -1}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			got := 0
			if err != nil {
				if j, ok := err.(interface{ Unwrap() []error }); ok {
					got = len(j.Unwrap())
				} else {
					got = 1
				}
			}
			if got != tc.bad {
				t.Errorf("Validate() = %v: got %d problems, want %d", err, got, tc.bad)
			}
		})
	}
}

func TestOpenTwiceIsLocked(t *testing.T) {
	dir := t.TempDir()
	openTest(t, Config{Dir: dir})
	s2, err := Open(Config{Dir: dir})
	if err == nil {
		s2.Close()
		t.Fatal("second Open of one directory: got nil error, want ErrLocked")
	}
	if !errors.Is(err, ErrLocked) {
		t.Errorf("second Open: got %v, want ErrLocked", err)
	}
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
	ctx := context.Background()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Ping after Close: got %v, want ErrUnavailable", err)
	}
	res := make([]store.AppendResult, 1)
	err = s.Append(ctx, []store.AppendRequest{{GID: 1, Sender: "a", ClientMsgID: "c", Body: []byte(`1`)}}, res)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Append after Close: got %v, want ErrUnavailable", err)
	}
}

// TestReopenKeepsEverything checks that a clean Close and Open keep every
// kind of row, and that gid assignment and seqs continue where they were.
func TestReopenKeepsEverything(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := time.Date(2026, 1, 2, 3, 4, 5, 6789, time.UTC)
	cfg := Config{Dir: dir, Now: func() time.Time { return clock }}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.CreateGroup(ctx, store.Group{Name: "room", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"alice", "bob", "carol"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RemoveMember(ctx, g.GID, "bob"); err != nil {
		t.Fatal(err)
	}
	reqs := []store.AppendRequest{
		{GID: g.GID, Sender: "alice", ClientMsgID: "1", Body: []byte(`{"t":1}`)},
		{GID: g.GID, Sender: "carol", ClientMsgID: "1", Kind: store.KindAtAll, Body: []byte(`"x"`)},
	}
	res := make([]store.AppendResult, len(reqs))
	if err := s.Append(ctx, reqs, res); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkRead(ctx, g.GID, "carol", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUserTier(ctx, "alice", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchUser(ctx, "alice", clock); err != nil {
		t.Fatal(err)
	}
	if err := s.AdvanceConversations(ctx, g.GID, []string{"carol"}, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openTest(t, cfg)
	got, err := s.Group(ctx, g.GID)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Group{GID: g.GID, Name: "room", Owner: "alice", State: store.StateActive, LastSeq: 2,
		MemberCount: 2, CreatedAt: clock.Truncate(time.Microsecond)}
	if got != want {
		t.Errorf("Group after reopen: got %+v, want %+v", got, want)
	}
	msgs, last, err := s.Messages(ctx, g.GID, "carol", 0, 0, 0, 0)
	if err != nil || last != 2 || len(msgs) != 2 || msgs[1].Kind != store.KindAtAll || string(msgs[0].Body) != `{"t":1}` {
		t.Errorf("Messages after reopen: got %+v, last %d, err %v", msgs, last, err)
	}
	sync, err := s.Sync(ctx, "carol", 0, 10)
	if err != nil || len(sync) != 1 || sync[0] != (store.SyncEntry{GID: g.GID, LastSeq: 2, LastReadSeq: 1, Unread: 1}) {
		t.Errorf("Sync after reopen: got %+v, %v", sync, err)
	}
	u, err := s.User(ctx, "alice")
	if err != nil || u.Tier != 2 || !u.LastActiveAt.Equal(clock.Truncate(time.Microsecond)) {
		t.Errorf("User after reopen: got %+v, %v", u, err)
	}
	conv, err := s.Conversations(ctx, "carol")
	if err != nil || conv[g.GID] != 2 {
		t.Errorf("Conversations after reopen: got %v, %v", conv, err)
	}
	// The freed ordinal of bob is reused, and the next gid follows the last.
	ms, err := s.AddMembers(ctx, g.GID, []string{"dave"})
	if err != nil || ms[0].Ordinal != 1 || ms[0].JoinSeq != 3 {
		t.Errorf("AddMembers after reopen: got %+v, %v; want ordinal 1, join_seq 3", ms, err)
	}
	g2, err := s.CreateGroup(ctx, store.Group{})
	if err != nil || g2.GID != g.GID+1 {
		t.Errorf("CreateGroup after reopen: got gid %d (%v), want %d", g2.GID, err, g.GID+1)
	}
	res = make([]store.AppendResult, 1)
	if err := s.Append(ctx, reqs[:1], res); err != nil || !res[0].Duplicate || res[0].Seq != 1 {
		t.Errorf("retry after reopen: got %+v, %v; want duplicate of seq 1", res[0], err)
	}
}

// TestGroupCommitMergesConcurrentCalls checks that concurrent Append calls
// each get their own results, dense per group, when rounds merge them.
func TestGroupCommitMergesConcurrentCalls(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Config{})
	const groups, workers, calls, batch = 4, 8, 20, 10
	var gids []int64
	for range groups {
		g, err := s.CreateGroup(ctx, store.Group{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddMembers(ctx, g.GID, []string{"u"}); err != nil {
			t.Fatal(err)
		}
		gids = append(gids, g.GID)
	}
	seen := make(map[[2]int64]string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for c := range calls {
				reqs := make([]store.AppendRequest, batch)
				for i := range reqs {
					reqs[i] = store.AppendRequest{GID: gids[(w+i)%groups], Sender: "u",
						ClientMsgID: fmt.Sprintf("%d-%d-%d", w, c, i), Body: []byte(`{}`)}
				}
				res := make([]store.AppendResult, batch)
				if err := s.Append(ctx, reqs, res); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, r := range res {
					k := [2]int64{reqs[i].GID, r.Seq}
					if r.Err != nil || r.Duplicate {
						t.Errorf("result %+v, want stored", r)
					} else if prev, dup := seen[k]; dup {
						t.Errorf("gid %d seq %d given to %s and %s", k[0], k[1], prev, reqs[i].ClientMsgID)
					}
					seen[k] = reqs[i].ClientMsgID
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := int64(0)
	for _, gid := range gids {
		g, err := s.Group(ctx, gid)
		if err != nil {
			t.Fatal(err)
		}
		for seq := int64(1); seq <= g.LastSeq; seq++ {
			if _, ok := seen[[2]int64{gid, seq}]; !ok {
				t.Errorf("gid %d seq %d was never acked", gid, seq)
			}
		}
		total += g.LastSeq
	}
	if want := int64(workers * calls * batch); total != want {
		t.Errorf("got %d messages stored, want %d", total, want)
	}
}

// TestReaderSeesOnlyPublishedView checks that a read view taken before a
// commit does not change under the reader (snapshot isolation).
func TestReaderSeesOnlyPublishedView(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Config{})
	g, err := s.CreateGroup(ctx, store.Group{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"u"}); err != nil {
		t.Fatal(err)
	}
	if err := s.enter(ctx); err != nil {
		t.Fatal(err)
	}
	v := s.acquire()
	s.leave()
	res := make([]store.AppendResult, 1)
	if err := s.Append(ctx, []store.AppendRequest{{GID: g.GID, Sender: "u", ClientMsgID: "a", Body: []byte(`1`)}}, res); err != nil {
		t.Fatal(err)
	}
	old, _, err := readGroup(v.snap, g.GID)
	v.release()
	if err != nil || old.LastSeq != 0 {
		t.Errorf("old view: got last_seq %d (%v), want 0", old.LastSeq, err)
	}
	cur, err := s.Group(ctx, g.GID)
	if err != nil || cur.LastSeq != 1 {
		t.Errorf("new view: got last_seq %d (%v), want 1", cur.LastSeq, err)
	}
}

// TestAppendCacheFollowsWriters interleaves Appends (which cache group
// records and memberships) with every writer of those rows, and checks
// that Append sees each change and never writes back a stale record.
func TestAppendCacheFollowsWriters(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Config{})
	g, err := s.CreateGroup(ctx, store.Group{Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	n := 0
	send := func(sender string) store.AppendResult {
		t.Helper()
		n++
		res := make([]store.AppendResult, 1)
		err := s.Append(ctx, []store.AppendRequest{{GID: g.GID, Sender: sender, ClientMsgID: strconv.Itoa(n), Body: []byte(`{}`)}}, res)
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		return res[0]
	}
	steps := []struct {
		name    string
		change  func() error
		sender  string
		wantErr error
	}{
		{"warm", func() error { return nil }, "b", nil},
		{"mute b", func() error { return s.SetMemberMuted(ctx, g.GID, "b", true) }, "b", store.ErrMuted},
		{"unmute b", func() error { return s.SetMemberMuted(ctx, g.GID, "b", false) }, "b", nil},
		{"remove b", func() error { _, err := s.RemoveMember(ctx, g.GID, "b"); return err }, "b", store.ErrNotMember},
		{"add c, b", func() error { _, err := s.AddMembers(ctx, g.GID, []string{"c", "b"}); return err }, "b", nil},
		{"mute all", func() error { _, err := s.SetGroupState(ctx, g.GID, store.StateMutedAll); return err }, "a", store.ErrGroupClosed},
		{"reopen", func() error { _, err := s.SetGroupState(ctx, g.GID, store.StateActive); return err }, "c", nil},
	}
	for _, st := range steps {
		if err := st.change(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := send(st.sender); !errors.Is(got.Err, st.wantErr) {
			t.Errorf("%s: Append from %s: got %v, want %v", st.name, st.sender, got.Err, st.wantErr)
		}
	}
	got, err := s.Group(ctx, g.GID)
	if err != nil {
		t.Fatal(err)
	}
	if got.MemberCount != 3 || got.LastSeq != 4 || got.State != store.StateActive {
		t.Errorf("Group: got member_count %d, last_seq %d, state %s; want 3, 4, active", got.MemberCount, got.LastSeq, got.State)
	}
	ms, err := s.AddMembers(ctx, g.GID, []string{"d"})
	if err != nil || ms[0].Ordinal != 3 {
		t.Errorf("AddMembers(d): got %+v, %v; want ordinal 3 (next_ordinal kept by Append)", ms, err)
	}
}

// TestCloseUnderLoad closes the store while writers and readers run: Close
// waits for the operations in flight (no leaked snapshot or iterator),
// and every later call fails with ErrUnavailable.
func TestCloseUnderLoad(t *testing.T) {
	ctx := context.Background()
	s, err := Open(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.CreateGroup(ctx, store.Group{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"u"}); err != nil {
		t.Fatal(err)
	}
	ops := []func(i int) error{
		func(i int) error {
			res := make([]store.AppendResult, 2)
			return s.Append(ctx, []store.AppendRequest{
				{GID: g.GID, Sender: "u", ClientMsgID: "a" + strconv.Itoa(i), Body: []byte(`1`)},
				{GID: g.GID, Sender: "u", ClientMsgID: "b" + strconv.Itoa(i), Body: []byte(`2`)},
			}, res)
		},
		func(int) error { _, _, err := s.Messages(ctx, g.GID, "u", 0, 0, 0, 0); return err },
		func(i int) error { return s.MarkRead(ctx, g.GID, "u", int64(i)) },
		func(int) error { _, err := s.Sync(ctx, "u", 0, 10); return err },
	}
	var started sync.WaitGroup
	var wg sync.WaitGroup
	errs := make([]error, len(ops))
	for k, op := range ops {
		started.Add(1)
		wg.Go(func() {
			for i := 0; ; i++ {
				if i == 10 {
					started.Done()
				}
				if err := op(i); err != nil {
					errs[k] = err
					if i < 10 {
						started.Done()
					}
					return
				}
			}
		})
	}
	started.Wait()
	if err := s.Close(); err != nil {
		t.Errorf("Close under load: %v", err)
	}
	wg.Wait()
	for k, err := range errs {
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, ErrClosed) {
			t.Errorf("op %d after Close: got %v, want ErrUnavailable wrapping ErrClosed", k, err)
		}
	}
}

// TestOpenRefusesOtherFormat checks that a data directory written with
// another key layout version is refused, not misread.
func TestOpenRefusesOtherFormat(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Set(metaFormatKey, []byte{formatVersion + 1}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(Config{Dir: dir}); err == nil {
		s.Close()
		t.Fatal("Open of a newer format: got nil error")
	}
}

// TestGIDCounterFromOlderStore: a data directory written before the gid
// counter (gids were the largest in use plus one) that holds a group at
// 2^63-1 assigns gids again, after the largest one within MaxGID.
func TestGIDCounterFromOlderStore(t *testing.T) {
	s := openTest(t, Config{})
	ctx := t.Context()
	if _, err := s.CreateGroup(ctx, store.Group{GID: 7}); err != nil {
		t.Fatal(err)
	}
	rec := groupRec{Group: store.Group{GID: math.MaxInt64, State: store.StateActive}}
	if err := s.db.Set(groupKey(nil, math.MaxInt64), encGroup(nil, &rec), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Delete(gidCounterKey, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	for want := int64(8); want < 10; want++ {
		g, err := s.CreateGroup(ctx, store.Group{})
		if err != nil || g.GID != want {
			t.Fatalf("CreateGroup: gid %d, %v; want %d", g.GID, err, want)
		}
	}
}
