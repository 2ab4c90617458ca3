package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/enginetest"
	"github.com/fanfare-im/fanfare/store"
)

// answered waits up to 2 s for the sends ids and returns the missing ones.
func (o *outcome) answered(ids []string) (missing []string) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		missing = missing[:0]
		for _, id := range ids {
			if _, ok := o.get(id); !ok {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// flood sends n messages of uid to gid through o and checks that every one
// is refused at once with want.
func flood(t *testing.T, e *fanout.Engine, o *outcome, gid int64, uid string, n int, want error) {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d-%d", uid, time.Now().UnixNano(), i)
		ids = append(ids, id)
		o.send(e, gid, uid, id, "")
	}
	if missing := o.answered(ids); len(missing) > 0 {
		t.Errorf("%s: %d of %d sends not answered (held in the group's buffer)", uid, len(missing), n)
	}
	for _, id := range ids {
		if r, ok := o.get(id); ok && !errors.Is(r.Err, want) {
			t.Errorf("%s: send %s got %v, want %v", uid, id, r.Err, want)
			return
		}
	}
}

// sendNow sends n messages of uid and checks they are all acked at once
// (the group's burst was left to them).
func sendNow(t *testing.T, e *fanout.Engine, o *outcome, gid int64, uid string, n int) {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-ok-%d-%d", uid, time.Now().UnixNano(), i)
		ids = append(ids, id)
		o.send(e, gid, uid, id, "")
	}
	if missing := o.answered(ids); len(missing) > 0 {
		t.Errorf("%s: %d of %d sends not acked at once: the group's budget was spent", uid, len(missing), n)
		return
	}
	for _, id := range ids {
		if r, _ := o.get(id); r.Err != nil {
			t.Errorf("%s: send %s: %v", uid, id, r.Err)
			return
		}
	}
}

// TestOutsidersDoNotSpendGroupLimit: a non-member or a muted member
// flooding a large group is refused (forbidden) before the group's limit
// and triggers count it: the members keep the whole burst, and the group
// stays at L0 and not hot.
func TestOutsidersDoNotSpendGroupLimit(t *testing.T) {
	for _, tc := range []struct {
		name, uid string
		want      error
	}{
		{"non-member", "mallory", store.ErrNotMember},
		{"muted", "mute", store.ErrMuted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			st := openStore(t)
			e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: 4, GroupBuffer: 3, HotMinRate: 4, DownlinkRate: -1}, Store: st, Now: clk.Now})
			gid := newGroup(t, st, "alice", "mute")
			if err := st.SetMemberMuted(context.Background(), gid, "mute", true); err != nil {
				t.Fatal(err)
			}
			o := newOutcome()
			flood(t, e, o, gid, tc.uid, 40, tc.want) // 40/s: 10 x the group limit, hot at 10 x the 1/s baseline
			clk.Advance(150 * time.Millisecond)      // an evaluation is due (bucket width 100 ms)
			sendNow(t, e, o, gid, "alice", 4)        // the burst (1 s of the limit) is whole
			time.Sleep(50 * time.Millisecond)        // a move to the hot pool would have been asked
			if lv := e.Levels().Auto(gid); lv != fanout.L0Normal {
				t.Errorf("group level after the flood: got L%d, want L0", lv)
			}
			if e.IsHot(gid) {
				t.Error("the flood made the group hot")
			}
		})
	}
}

// TestSenderChecksFollowMembership: a member removed is refused before the
// limit counts it, and a non-member added may send at once, although both
// were checked (and remembered) just before the change.
func TestSenderChecksFollowMembership(t *testing.T) {
	clk := newClock()
	st := openStore(t)
	e := enginetest.Start(t, fanout.Config{Tuning: fanout.Tuning{LargeGroup: 1, GroupRate: 4, GroupBuffer: 3, HotFactor: -1, DownlinkRate: -1}, Store: st, Now: clk.Now})
	ctx := context.Background()
	gid := newGroup(t, st, "carol", "alice")
	o := newOutcome()
	sendNow(t, e, o, gid, "alice", 1)                     // alice is remembered as a member; 3 tokens left
	flood(t, e, o, gid, "mallory", 5, store.ErrNotMember) // mallory as a non-member
	if err := e.RemoveMember(ctx, gid, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.AddMembers(ctx, gid, []string{"mallory"}); err != nil {
		t.Fatal(err)
	}
	flood(t, e, o, gid, "alice", 10, store.ErrNotMember)
	sendNow(t, e, o, gid, "mallory", 1)
	sendNow(t, e, o, gid, "carol", 2) // the rest of the burst
}
