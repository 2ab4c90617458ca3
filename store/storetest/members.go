package storetest

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

func testPing(t *testing.T, su *suite) {
	s := su.open(t)
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func testCreateGroup(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	before := now().Add(-time.Minute)
	g1, err := s.CreateGroup(ctx, store.Group{Name: "first", Owner: "alice"})
	if err != nil {
		t.Fatalf("CreateGroup: %v", err)
	}
	if g1.GID <= 0 || g1.Name != "first" || g1.Owner != "alice" || g1.State != store.StateActive ||
		g1.LastSeq != 0 || g1.MemberCount != 0 || g1.CreatedAt.Before(before) {
		t.Errorf("got %+v, want assigned gid > 0, state active, last_seq 0, member_count 0, created_at now", g1)
	}
	g2, err := s.CreateGroup(ctx, store.Group{Name: "second", LastSeq: 99, MemberCount: 5})
	if err != nil {
		t.Fatalf("CreateGroup: %v", err)
	}
	if g2.GID <= 0 || g2.GID == g1.GID {
		t.Errorf("got gids %d and %d, want two distinct positive gids", g1.GID, g2.GID)
	}
	if g2.LastSeq != 0 || g2.MemberCount != 0 {
		t.Errorf("got last_seq %d member_count %d, want input ignored (0, 0)", g2.LastSeq, g2.MemberCount)
	}
	// Explicit gid, then the same gid again; then an assigned gid skips it.
	explicit := max(g1.GID, g2.GID) + 1
	g3, err := s.CreateGroup(ctx, store.Group{GID: explicit, Name: "explicit", State: store.StateMutedAll})
	if err != nil {
		t.Fatalf("CreateGroup(gid %d): %v", explicit, err)
	}
	if g3.GID != explicit || g3.State != store.StateMutedAll {
		t.Errorf("got %+v, want gid %d state muted_all", g3, explicit)
	}
	_, err = s.CreateGroup(ctx, store.Group{GID: explicit})
	wantIs(t, "CreateGroup(existing gid)", err, store.ErrGroupExists)
	g4, err := s.CreateGroup(ctx, store.Group{})
	if err != nil {
		t.Fatalf("CreateGroup: %v", err)
	}
	if g4.GID == explicit || g4.GID == g1.GID || g4.GID == g2.GID {
		t.Errorf("got assigned gid %d, want one not in use", g4.GID)
	}
	got, err := s.Group(ctx, g1.GID)
	if err != nil {
		t.Fatalf("Group: %v", err)
	}
	if got.GID != g1.GID || got.Name != g1.Name || got.Owner != g1.Owner || got.State != g1.State ||
		!sameTime(got.CreatedAt, g1.CreatedAt) {
		t.Errorf("Group: got %+v, want %+v", got, g1)
	}
	_, err = s.Group(ctx, explicit+1000)
	wantIs(t, "Group(unknown)", err, store.ErrGroupNotFound)
}

// testCreateGroupGIDBound: an explicit gid is at most Limits.MaxGID, and
// one at the very end does not move the allocator there (on an embedded
// store whose allocator was "largest gid + 1", a gid of 2^63-1 made every
// later assigned create fail as unavailable).
func testCreateGroupGIDBound(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	for _, gid := range []int64{store.DefaultMaxGID + 1, math.MaxInt64} {
		_, err := s.CreateGroup(ctx, store.Group{GID: gid})
		wantIs(t, fmt.Sprintf("CreateGroup(gid %d)", gid), err, store.ErrBadRequest)
	}
	if g, err := s.CreateGroup(ctx, store.Group{GID: store.DefaultMaxGID}); err != nil || g.GID != store.DefaultMaxGID {
		t.Fatalf("CreateGroup(gid MaxGID): %+v, %v", g, err)
	}
	for range 3 {
		g, err := s.CreateGroup(ctx, store.Group{Name: "after"})
		if err != nil {
			t.Fatalf("CreateGroup after an explicit gid at the end: %v", err)
		}
		if g.GID <= 0 || g.GID >= store.DefaultMaxGID {
			t.Errorf("assigned gid %d, want one well below %d", g.GID, int64(store.DefaultMaxGID))
		}
	}
}

// testCreateGroupGIDExhausted: assigned gids skip the explicit ones and
// end at Limits.MaxGID with ErrGIDExhausted, a permanent error, not
// ErrUnavailable (which tells clients to retry); explicit free gids work.
func testCreateGroupGIDExhausted(t *testing.T, su *suite) {
	s := su.withLimits(t, store.Limits{MaxGID: 4})
	ctx := t.Context()
	if _, err := s.CreateGroup(ctx, store.Group{GID: 2}); err != nil {
		t.Fatalf("CreateGroup(gid 2): %v", err)
	}
	got := map[int64]bool{}
	for range 3 {
		g, err := s.CreateGroup(ctx, store.Group{})
		if err != nil {
			t.Fatalf("CreateGroup: %v (assigned so far: %v)", err, got)
		}
		got[g.GID] = true
	}
	if !got[1] || !got[3] || !got[4] {
		t.Errorf("assigned %v, want 1, 3 and 4 (2 taken)", got)
	}
	_, err := s.CreateGroup(ctx, store.Group{})
	wantIs(t, "CreateGroup with every gid assigned", err, store.ErrGIDExhausted)
	if errors.Is(err, store.ErrUnavailable) {
		t.Errorf("exhausted gids reported as unavailable (retryable): %v", err)
	}
	_, err = s.CreateGroup(ctx, store.Group{GID: 5})
	wantIs(t, "CreateGroup(gid above MaxGID)", err, store.ErrBadRequest)
}

func testCreateGroupBadInput(t *testing.T, su *suite) {
	s := su.open(t)
	for _, tc := range []struct {
		name string
		g    store.Group
	}{
		{"negative gid", store.Group{GID: -1}},
		{"unknown state", store.Group{State: "frozen"}},
		{"name too long", store.Group{Name: strings.Repeat("n", store.MaxGroupNameBytes+1)}},
		{"name with NUL", store.Group{Name: "a\x00b"}},
		{"owner not UTF-8", store.Group{Owner: "\xff"}},
	} {
		_, err := s.CreateGroup(t.Context(), tc.g)
		wantIs(t, tc.name, err, store.ErrBadRequest)
	}
}

func testSetGroupState(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o")
	for _, st := range []store.GroupState{store.StateMutedAll, store.StateDissolved, store.StateActive} {
		got, err := s.SetGroupState(ctx, g.GID, st)
		if err != nil {
			t.Fatalf("SetGroupState(%s): %v", st, err)
		}
		if got.State != st || got.GID != g.GID {
			t.Errorf("SetGroupState(%s): got %+v", st, got)
		}
		if re, _ := s.Group(ctx, g.GID); re.State != st {
			t.Errorf("Group after SetGroupState(%s): got state %s", st, re.State)
		}
	}
	_, err := s.SetGroupState(ctx, g.GID, "frozen")
	wantIs(t, "SetGroupState(bad state)", err, store.ErrBadRequest)
	_, err = s.SetGroupState(ctx, g.GID+1000, store.StateActive)
	wantIs(t, "SetGroupState(unknown)", err, store.ErrGroupNotFound)
}

func testAddMembersIdempotent(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "owner")
	before := now().Add(-time.Minute)
	ms, err := s.AddMembers(ctx, g.GID, []string{"owner", "a", "b", "a"})
	if err != nil {
		t.Fatalf("AddMembers: %v", err)
	}
	if len(ms) != 3 {
		t.Fatalf("got %d members, want 3 (one per distinct uid)", len(ms))
	}
	for i, want := range []struct {
		uid  string
		role string
	}{{"owner", store.RoleOwner}, {"a", store.RoleMember}, {"b", store.RoleMember}} {
		m := ms[i]
		if m.UID != want.uid || m.GID != g.GID || m.Role != want.role || m.Ordinal != uint32(i) ||
			m.JoinSeq != 1 || m.LastReadSeq != 0 || m.Muted || m.JoinedAt.Before(before) {
			t.Errorf("member %d: got %+v, want uid %s role %s ordinal %d join_seq 1", i, m, want.uid, want.role, i)
		}
		got, err := s.Member(ctx, g.GID, want.uid)
		if err != nil || !sameMember(got, m) {
			t.Errorf("Member(%s): got %+v, %v; want %+v", want.uid, got, err, m)
		}
	}
	sendN(t, s, g.GID, "a", 3)
	again, err := s.AddMembers(ctx, g.GID, []string{"b", "c", "a"})
	if err != nil {
		t.Fatalf("AddMembers again: %v", err)
	}
	if len(again) != 3 || !sameMember(again[0], ms[2]) || !sameMember(again[2], ms[1]) {
		t.Errorf("AddMembers of existing members: got %+v, want them unchanged: %+v, %+v", again, ms[2], ms[1])
	}
	if c := again[1]; c.UID != "c" || c.Ordinal != 3 || c.JoinSeq != 4 {
		t.Errorf("new member c: got %+v, want ordinal 3, join_seq 4", c)
	}
	if gg, _ := s.Group(ctx, g.GID); gg.MemberCount != 4 {
		t.Errorf("member_count: got %d, want 4", gg.MemberCount)
	}
	if ms, err := s.AddMembers(ctx, g.GID, nil); err != nil || len(ms) != 0 {
		t.Errorf("AddMembers(none): got %v, %v; want nothing", ms, err)
	}
}

func testAddMembersBadInput(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o")
	_, err := s.AddMembers(ctx, g.GID+1000, []string{"a"})
	wantIs(t, "AddMembers(unknown group)", err, store.ErrGroupNotFound)
	for _, bad := range [][]string{{""}, {"ok", "a\x00"}, {"\xff"}, {strings.Repeat("u", store.DefaultMaxUID+1)}} {
		_, err := s.AddMembers(ctx, g.GID, bad)
		wantIs(t, "AddMembers(bad uid)", err, store.ErrBadRequest)
	}
	_, err = s.AddMembers(ctx, g.GID, uids("u", store.DefaultMaxAddMembers+1))
	wantIs(t, "AddMembers(too many)", err, store.ErrTooLarge)
	if gg, _ := s.Group(ctx, g.GID); gg.MemberCount != 0 {
		t.Errorf("member_count after rejected adds: got %d, want 0", gg.MemberCount)
	}
	if _, err := s.SetGroupState(ctx, g.GID, store.StateDissolved); err != nil {
		t.Fatal(err)
	}
	_, err = s.AddMembers(ctx, g.GID, []string{"a"})
	wantIs(t, "AddMembers(dissolved)", err, store.ErrGroupClosed)
	if _, err := s.SetGroupState(ctx, g.GID, store.StateMutedAll); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddMembers(ctx, g.GID, []string{"a"}); err != nil {
		t.Errorf("AddMembers(muted_all): got %v, want nil", err)
	}
}

func testJoinSeq(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "o")
	for i, n := range []int{0, 5, 1} {
		sendN(t, s, g.GID, "o", n)
		gg, _ := s.Group(ctx, g.GID)
		uid := "late" + string(rune('a'+i))
		ms, err := s.AddMembers(ctx, g.GID, []string{uid})
		if err != nil {
			t.Fatal(err)
		}
		if ms[0].JoinSeq != gg.LastSeq+1 {
			t.Errorf("%s: got join_seq %d, want last_seq+1 = %d", uid, ms[0].JoinSeq, gg.LastSeq+1)
		}
	}
}

func testOrdinalsReused(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o")
	ms, err := s.AddMembers(ctx, g.GID, uids("m", 8))
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.Ordinal != uint32(i) {
			t.Errorf("%s: got ordinal %d, want %d (dense from 0)", m.UID, m.Ordinal, i)
		}
	}
	for _, uid := range []string{"m5", "m2", "m6"} {
		m, err := s.RemoveMember(ctx, g.GID, uid)
		if err != nil {
			t.Fatalf("RemoveMember(%s): %v", uid, err)
		}
		if m.UID != uid {
			t.Errorf("RemoveMember(%s): got %+v", uid, m)
		}
	}
	// Freed ordinals come back smallest first, then the high-water mark grows.
	ms, err = s.AddMembers(ctx, g.GID, []string{"n0", "n1", "n2", "n3"})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint32{2, 5, 6, 8} {
		if ms[i].Ordinal != want {
			t.Errorf("%s: got ordinal %d, want %d", ms[i].UID, ms[i].Ordinal, want)
		}
	}
	// A removed member who rejoins is a new member: new ordinal, new join_seq.
	sendN(t, s, g.GID, "m0", 2)
	if _, err := s.RemoveMember(ctx, g.GID, "m1"); err != nil {
		t.Fatal(err)
	}
	ms, err = s.AddMembers(ctx, g.GID, []string{"m1"})
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].Ordinal != 1 || ms[0].JoinSeq != 3 {
		t.Errorf("rejoined m1: got ordinal %d join_seq %d, want 1 and 3", ms[0].Ordinal, ms[0].JoinSeq)
	}
	seen := map[uint32]string{}
	for _, uid := range []string{"m0", "m1", "m3", "m4", "m7", "n0", "n1", "n2", "n3"} {
		m, err := s.Member(ctx, g.GID, uid)
		if err != nil {
			t.Fatalf("Member(%s): %v", uid, err)
		}
		if other, dup := seen[m.Ordinal]; dup {
			t.Errorf("ordinal %d held by %s and %s", m.Ordinal, other, uid)
		}
		seen[m.Ordinal] = uid
		if m.Ordinal > 8 {
			t.Errorf("%s: ordinal %d, want <= 8 (9 members, freed ordinals reused)", uid, m.Ordinal)
		}
	}
}

func testMemberCount(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o")
	steps := []struct {
		add    []string
		remove string
		want   int64
	}{
		{add: uids("a", 10), want: 10},
		{add: uids("a", 12), want: 12}, // 10 already there
		{remove: "a3", want: 11},
		{remove: "a4", want: 10},
		{add: []string{"a3", "b"}, want: 12},
	}
	for i, st := range steps {
		if st.add != nil {
			if _, err := s.AddMembers(ctx, g.GID, st.add); err != nil {
				t.Fatal(err)
			}
		} else if _, err := s.RemoveMember(ctx, g.GID, st.remove); err != nil {
			t.Fatal(err)
		}
		gg, err := s.Group(ctx, g.GID)
		if err != nil {
			t.Fatal(err)
		}
		if gg.MemberCount != st.want {
			t.Errorf("step %d: got member_count %d, want %d", i, gg.MemberCount, st.want)
		}
	}
}

func testRemoveMember(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a", "b")
	want, _ := s.Member(ctx, g.GID, "a")
	got, err := s.RemoveMember(ctx, g.GID, "a")
	if err != nil || !sameMember(got, want) {
		t.Errorf("RemoveMember: got %+v, %v; want %+v", got, err, want)
	}
	_, err = s.Member(ctx, g.GID, "a")
	wantIs(t, "Member(removed)", err, store.ErrNotMember)
	_, err = s.RemoveMember(ctx, g.GID, "a")
	wantIs(t, "RemoveMember(again)", err, store.ErrNotMember)
	_, err = s.RemoveMember(ctx, g.GID+1000, "a")
	wantIs(t, "RemoveMember(unknown group)", err, store.ErrNotMember)
	_, err = s.Member(ctx, g.GID+1000, "b")
	wantIs(t, "Member(unknown group)", err, store.ErrNotMember)
	// A removed member can neither send nor read.
	res := appendAll(t, s, req(g.GID, "a", "after-remove"))
	wantIs(t, "Append from removed member", res[0].Err, store.ErrNotMember)
	_, _, err = s.Messages(ctx, g.GID, "a", 0, 0, 0, 0)
	wantIs(t, "Messages of removed member", err, store.ErrNotMember)
}

func testSetMemberMuted(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	if err := s.SetMemberMuted(ctx, g.GID, "a", true); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Member(ctx, g.GID, "a"); !m.Muted {
		t.Errorf("Member after mute: got muted=false")
	}
	res := appendAll(t, s, req(g.GID, "a", "1"))
	wantIs(t, "Append from muted member", res[0].Err, store.ErrMuted)
	if err := s.SetMemberMuted(ctx, g.GID, "a", false); err != nil {
		t.Fatal(err)
	}
	res = appendAll(t, s, req(g.GID, "a", "2"))
	if res[0].Err != nil || res[0].Seq != 1 {
		t.Errorf("Append after unmute: got %+v, want seq 1", res[0])
	}
	wantIs(t, "SetMemberMuted(non-member)", s.SetMemberMuted(ctx, g.GID, "zz", true), store.ErrNotMember)
	wantIs(t, "SetMemberMuted(unknown group)", s.SetMemberMuted(ctx, g.GID+1000, "a", true), store.ErrNotMember)
}

func testUserGroups(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g1 := newGroup(t, s, "o", "u", "x")
	g2 := newGroup(t, s, "o", "x")
	g3 := newGroup(t, s, "o", "u")
	ms, err := s.UserGroups(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	var gids []int64
	for _, m := range ms {
		if m.UID != "u" {
			t.Errorf("UserGroups(u): got row for %q", m.UID)
		}
		gids = append(gids, m.GID)
	}
	slices.Sort(gids)
	if want := []int64{g1.GID, g3.GID}; !slices.Equal(gids, want) {
		t.Errorf("UserGroups(u): got gids %v, want %v (not %d)", gids, want, g2.GID)
	}
	if ms, err := s.UserGroups(ctx, "nobody"); err != nil || len(ms) != 0 {
		t.Errorf("UserGroups(nobody): got %v, %v; want none", ms, err)
	}
}

func testUsers(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	_, err := s.User(ctx, "u")
	wantIs(t, "User(unknown)", err, store.ErrUserNotFound)
	for _, lvl := range []int{2, 3, 0} {
		if err := s.SetUserTier(ctx, "u", lvl); err != nil {
			t.Fatalf("SetUserTier(%d): %v", lvl, err)
		}
		u, err := s.User(ctx, "u")
		if err != nil || u.UID != "u" || u.Tier != lvl || !u.LastActiveAt.IsZero() {
			t.Errorf("User after SetUserTier(%d): got %+v, %v; want tier %d, never active", lvl, u, err, lvl)
		}
	}
	for _, bad := range []int{-1, 4} {
		wantIs(t, "SetUserTier(bad)", s.SetUserTier(ctx, "u", bad), store.ErrBadRequest)
	}
	at := now()
	if err := s.TouchUser(ctx, "v", at); err != nil {
		t.Fatal(err)
	}
	u, err := s.User(ctx, "v")
	if err != nil || u.Tier != 0 || !sameTime(u.LastActiveAt, at) {
		t.Errorf("User after TouchUser: got %+v, %v; want level 0, last_active_at %v", u, err, at)
	}
	if err := s.SetUserTier(ctx, "v", 1); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.User(ctx, "v"); u.Tier != 1 || !sameTime(u.LastActiveAt, at) {
		t.Errorf("SetUserTier kept last_active_at? got %+v", u)
	}
}

func testTouchUserNeverBackwards(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	t0 := now()
	for _, at := range []time.Time{t0, t0.Add(time.Hour), t0.Add(time.Minute)} {
		if err := s.TouchUser(ctx, "u", at); err != nil {
			t.Fatal(err)
		}
	}
	if u, _ := s.User(ctx, "u"); !sameTime(u.LastActiveAt, t0.Add(time.Hour)) {
		t.Errorf("got last_active_at %v, want the latest touch %v", u.LastActiveAt, t0.Add(time.Hour))
	}
}

// testTouchUsers: one call creates the users it names and raises each
// one's last_active_at to its latest touch of the call, never lowers a
// later stored one, leaves unstorable uids out and refuses nothing.
func testTouchUsers(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	t0 := now()
	if err := s.TouchUser(ctx, "later", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchUsers(ctx, nil); err != nil {
		t.Fatalf("TouchUsers(nil): %v", err)
	}
	err := s.TouchUsers(ctx, []store.UserTouch{
		{UID: "b", At: t0},
		{UID: "a", At: t0.Add(2 * time.Minute)},
		{UID: "\xff", At: t0},
		{UID: "b", At: t0.Add(time.Minute)}, // the latest of b's
		{UID: "later", At: t0},              // behind what is stored
		{UID: "", At: t0},
		{UID: "b", At: t0.Add(-time.Minute)},
		{UID: "a\x00", At: t0},
	})
	if err != nil {
		t.Fatalf("TouchUsers: %v", err)
	}
	for uid, want := range map[string]time.Time{"a": t0.Add(2 * time.Minute), "b": t0.Add(time.Minute), "later": t0.Add(time.Hour)} {
		if u, err := s.User(ctx, uid); err != nil || u.Tier != 0 || !sameTime(u.LastActiveAt, want) {
			t.Errorf("User(%q) after TouchUsers: got %+v, %v; want last_active_at %v", uid, u, err, want)
		}
	}
	for _, uid := range []string{"\xff", "a\x00"} {
		if _, err := s.User(ctx, uid); !errors.Is(err, store.ErrUserNotFound) {
			t.Errorf("User(%q): got %v, want ErrUserNotFound", uid, err)
		}
	}
	// A second batch moves a user forward and keeps the tier.
	if err := s.SetUserTier(ctx, "a", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchUsers(ctx, []store.UserTouch{{UID: "a", At: t0.Add(3 * time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if u, err := s.User(ctx, "a"); err != nil || u.Tier != 2 || !sameTime(u.LastActiveAt, t0.Add(3*time.Minute)) {
		t.Errorf("User(a) after a second batch: got %+v, %v; want tier 2, last_active_at %v", u, err, t0.Add(3*time.Minute))
	}
	// Only invalid uids: nothing to write, no error.
	if err := s.TouchUsers(ctx, []store.UserTouch{{UID: "", At: t0}}); err != nil {
		t.Errorf("TouchUsers of an empty uid: got %v, want nil (left out)", err)
	}
}

// testTouchUsersConcurrent: calls of several nodes touching the same
// users in different orders all succeed (no deadlock between their row
// locks) and leave each user at the latest touch.
func testTouchUsersConcurrent(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	t0 := now()
	const users, callers, rounds = 200, 4, 5
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for r := range rounds {
				ts := make([]store.UserTouch, users)
				for i := range ts {
					// Caller c writes every user, in an order of its own
					// (strides coprime with users) and direction.
					j := (i*[callers]int{1, 3, 7, 9}[c] + r) % users
					if c%2 == 1 {
						j = users - 1 - j
					}
					ts[i] = store.UserTouch{UID: fmt.Sprintf("u%03d", j), At: t0.Add(time.Duration(c*rounds+r) * time.Second)}
				}
				if err := s.TouchUsers(ctx, ts); err != nil {
					t.Errorf("caller %d round %d: %v", c, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := t0.Add(time.Duration(callers*rounds-1) * time.Second)
	for _, uid := range []string{"u000", "u123", "u199"} {
		if u, err := s.User(ctx, uid); err != nil || !sameTime(u.LastActiveAt, want) {
			t.Errorf("User(%q): got %+v, %v; want last_active_at %v", uid, u, err, want)
		}
	}
}

func testActiveMembersSince(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "old", "recent", "edge", "never", "leveled")
	other := newGroup(t, s, "o", "outsider")
	t0 := now()
	touch := map[string]time.Time{
		"old":      t0.Add(-8 * 24 * time.Hour),
		"recent":   t0.Add(-time.Hour),
		"edge":     t0.Add(-7 * 24 * time.Hour), // exactly at since: included
		"outsider": t0,
	}
	for uid, at := range touch {
		if err := s.TouchUser(ctx, uid, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetUserTier(ctx, "leveled", 2); err != nil { // a user row, never active
		t.Fatal(err)
	}
	got, err := s.ActiveMembersSince(ctx, g.GID, t0.Add(-7*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"edge", "recent"}; !slices.Equal(got, want) {
		t.Errorf("ActiveMembersSince: got %v, want %v", got, want)
	}
	got, _ = s.ActiveMembersSince(ctx, other.GID, t0.Add(-time.Minute))
	if !slices.Equal(got, []string{"outsider"}) {
		t.Errorf("ActiveMembersSince(other): got %v, want [outsider]", got)
	}
	got, err = s.ActiveMembersSince(ctx, g.GID+1000, t0.Add(-time.Hour))
	if err != nil || len(got) != 0 {
		t.Errorf("ActiveMembersSince(unknown group): got %v, %v; want none", got, err)
	}
}

// testUnstorableUIDs: a uid that no store accepts (ValidateID fails) is
// nobody: lookups answer "not found" or nothing, never another error.
func testUnstorableUIDs(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	for _, uid := range []string{"a\x00", "\xff\xfe"} {
		_, err := s.Member(ctx, g.GID, uid)
		wantIs(t, "Member", err, store.ErrNotMember)
		_, _, err = s.Messages(ctx, g.GID, uid, 0, 0, 0, 0)
		wantIs(t, "Messages", err, store.ErrNotMember)
		wantIs(t, "MarkRead", s.MarkRead(ctx, g.GID, uid, 1), store.ErrNotMember)
		wantIs(t, "SetMemberMuted", s.SetMemberMuted(ctx, g.GID, uid, true), store.ErrNotMember)
		_, err = s.RemoveMember(ctx, g.GID, uid)
		wantIs(t, "RemoveMember", err, store.ErrNotMember)
		_, err = s.User(ctx, uid)
		wantIs(t, "User", err, store.ErrUserNotFound)
		if got, err := s.Sync(ctx, uid, 0, 10); err != nil || len(got) != 0 {
			t.Errorf("Sync(%q): got %v, %v; want nothing", uid, got, err)
		}
		if got, err := s.UserGroups(ctx, uid); err != nil || len(got) != 0 {
			t.Errorf("UserGroups(%q): got %v, %v; want nothing", uid, got, err)
		}
		if got, err := s.Conversations(ctx, uid); err != nil || len(got) != 0 {
			t.Errorf("Conversations(%q): got %v, %v; want nothing", uid, got, err)
		}
		wantIs(t, "TouchUser", s.TouchUser(ctx, uid, now()), store.ErrBadRequest)
		wantIs(t, "SetUserTier", s.SetUserTier(ctx, uid, 1), store.ErrBadRequest)
	}
	if err := s.AdvanceConversations(ctx, g.GID, []string{"\xff", "a", "b\x00"}, 4); err != nil {
		t.Fatalf("AdvanceConversations with unstorable uids: %v", err)
	}
	if got, _ := s.Conversations(ctx, "a"); got[g.GID] != 4 {
		t.Errorf("Conversations(a): got %v, want %d: 4", got, g.GID)
	}
}
