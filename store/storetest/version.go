package storetest

import (
	"slices"
	"testing"

	"github.com/fanfare-im/fanfare/store"
)

// testMemberVersion: every change of membership raises the group's
// version by one, the version comes back with the change, with every
// stored message (on both Append paths: a batch holding a retry takes the
// other one) and with MembersOf, and a call that changes nothing leaves it.
func testMemberVersion(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "owner")
	version := func(want int64, uids ...string) []store.Member {
		t.Helper()
		ms, v, err := s.MembersOf(ctx, g.GID, uids)
		if err != nil {
			t.Fatalf("MembersOf: %v", err)
		}
		if v != want {
			t.Fatalf("MembersOf: version %d, want %d", v, want)
		}
		return ms
	}
	version(0)

	ms, err := s.AddMembers(ctx, g.GID, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.MemberVersion != 1 {
			t.Errorf("AddMembers: %s has version %d, want 1", m.UID, m.MemberVersion)
		}
	}
	got := version(1, "b", "a", "nobody", "a", "\x00")
	uids := []string{}
	for _, m := range got {
		if m.GID != g.GID {
			t.Errorf("MembersOf: member of gid %d, want %d", m.GID, g.GID)
		}
		uids = append(uids, m.UID)
	}
	slices.Sort(uids)
	if !slices.Equal(uids, []string{"a", "b"}) {
		t.Errorf("MembersOf: got %v, want [a b]", uids)
	}
	for _, m := range got {
		if m.UID == "b" && m.Ordinal != ms[1].Ordinal {
			t.Errorf("MembersOf: b has ordinal %d, want %d", m.Ordinal, ms[1].Ordinal)
		}
	}

	again, err := s.AddMembers(ctx, g.GID, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if again[0].MemberVersion != 0 {
		t.Errorf("AddMembers of a member: version %d, want 0 (nothing changed)", again[0].MemberVersion)
	}
	version(1)
	res := appendAll(t, s, req(g.GID, "a", "1"), req(g.GID, "nobody", "2"))
	if res[0].Err != nil || res[0].MemberVersion != 1 {
		t.Errorf("Append: got %+v, want stored with version 1", res[0])
	}
	if res[1].Err == nil || res[1].MemberVersion != 0 {
		t.Errorf("Append by a non-member: got %+v, want rejected with version 0", res[1])
	}

	m, err := s.RemoveMember(ctx, g.GID, "b")
	if err != nil {
		t.Fatal(err)
	}
	if m.MemberVersion != 2 {
		t.Errorf("RemoveMember: version %d, want 2", m.MemberVersion)
	}
	if got := version(2, "a", "b"); len(got) != 1 || got[0].UID != "a" {
		t.Errorf("MembersOf after removal: got %+v, want only a", got)
	}
	// A retry of a stored message in the batch: the other Append path.
	res = appendAll(t, s, req(g.GID, "a", "1"), req(g.GID, "a", "3"))
	if !res[0].Duplicate || res[1].Err != nil || res[1].MemberVersion != 2 {
		t.Errorf("Append with a retry: got %+v, want a duplicate then a message with version 2", res)
	}

	_, _, err = s.MembersOf(ctx, g.GID+1000, []string{"a"})
	wantIs(t, "MembersOf(unknown group)", err, store.ErrGroupNotFound)
	_, _, err = s.MembersOf(ctx, g.GID, make([]string, store.DefaultMaxAddMembers+1))
	wantIs(t, "MembersOf(too many)", err, store.ErrTooLarge)
}
