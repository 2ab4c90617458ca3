package fanout

import (
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func lvl(l Level) *Level { return &l }

func TestLevelsEffectiveIsMaxOfNodeAndGroup(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	l := NewLevels(c.now, nil)
	type change struct {
		gid      int64
		from, to Level
	}
	var changes []change
	l.OnChange(func(gid int64, from, to Level, _ string) { changes = append(changes, change{gid, from, to}) })

	l.SetAuto(7, L1Merge, "downlink")
	l.Force(0, lvl(L2Summary), 0)
	tests := []struct {
		gid  int64
		want Level
	}{{7, L2Summary}, {8, L2Summary}, {0, L2Summary}}
	for _, tt := range tests {
		if got := l.Effective(tt.gid); got != tt.want {
			t.Errorf("gid %d: got %d, want %d", tt.gid, got, tt.want)
		}
	}
	l.Force(0, nil, 0)
	if got := l.Effective(7); got != L1Merge {
		t.Errorf("after clearing node: got %d, want L1", got)
	}
	if got := l.Effective(8); got != L0Normal {
		t.Errorf("other group after clearing node: got %d, want L0", got)
	}
	// A forced level wins over the automatic one in both directions.
	l.Force(7, lvl(L0Normal), 0)
	if got := l.Effective(7); got != L0Normal {
		t.Errorf("forced L0 over auto L1: got %d, want L0", got)
	}
	want := []change{{7, 0, 1}, {0, 0, 2}, {0, 2, 0}, {7, 1, 0}}
	if len(changes) != len(want) {
		t.Fatalf("got changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Errorf("change %d: got %v, want %v", i, changes[i], want[i])
		}
	}
}

func TestLevelsForcedTTLExpires(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	l := NewLevels(c.now, nil)
	var expired []int64
	l.OnChange(func(gid int64, from, to Level, cause string) {
		if cause == "forced level expired" {
			expired = append(expired, gid)
		}
	})
	l.Force(5, lvl(L3WriteOnly), time.Minute)
	if got := l.Effective(5); got != L3WriteOnly {
		t.Fatalf("got %d, want L3", got)
	}
	_, groups := l.Snapshot()
	if len(groups) != 1 || groups[0].Forced == nil || *groups[0].Forced != L3WriteOnly || !groups[0].ExpiresAt.Equal(c.t.Add(time.Minute)) {
		t.Fatalf("snapshot: got %+v", groups)
	}
	c.advance(59 * time.Second)
	l.ExpireForced()
	if got := l.Effective(5); got != L3WriteOnly {
		t.Errorf("before ttl: got %d, want L3", got)
	}
	c.advance(time.Second)
	if got := l.Effective(5); got != L0Normal {
		t.Errorf("at ttl: got %d, want L0", got)
	}
	l.ExpireForced()
	if len(expired) != 1 || expired[0] != 5 {
		t.Errorf("expiry notifications: got %v, want [5]", expired)
	}
	if _, groups := l.Snapshot(); len(groups) != 0 {
		t.Errorf("snapshot after expiry: got %+v, want none", groups)
	}
}
