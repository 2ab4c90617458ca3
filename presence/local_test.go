package presence

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clock is an injected clock for expiry tests.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
func newLocal(t testing.TB, c *clock) *Local[int] {
	t.Helper()
	return newLocalShards(t, c, 4)
}

func newLocalShards(t testing.TB, c *clock, shards int) *Local[int] {
	t.Helper()
	l, err := New[int](Config{TTL: time.Minute, Now: c.Now, MaxConnsPerUser: 3, MaxOrdinal: 1 << 20, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// op is one step of a table test.
type op struct {
	do      string // connect, disconnect, join, leave, touch, advance, expire, removegroup
	uid     string
	conn    int
	ms      []Membership
	gid     int64
	ord     uint32
	d       time.Duration
	wantErr error
	wantOK  bool  // disconnect, touch
	want    []int // expire: expired conns (sorted)
}

func ms(pairs ...int64) []Membership {
	var out []Membership
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Membership{GID: pairs[i], Ordinal: uint32(pairs[i+1])})
	}
	return out
}

func TestLocalTable(t *testing.T) {
	tests := []struct {
		name      string
		ops       []op
		wantConns map[int64][]int // gid -> AppendConns (sorted)
		wantUsers int64
		wantConn  int64
	}{
		{
			name:      "connect one user in two groups",
			ops:       []op{{do: "connect", uid: "a", conn: 1, ms: ms(10, 0, 20, 7)}},
			wantConns: map[int64][]int{10: {1}, 20: {1}, 30: nil},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "multi-device user gets one entry per connection",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3)},
				{do: "connect", uid: "a", conn: 2, ms: ms(10, 3)},
				{do: "connect", uid: "b", conn: 3, ms: ms(10, 4)},
			},
			wantConns: map[int64][]int{10: {1, 2, 3}},
			wantUsers: 2, wantConn: 3,
		},
		{
			name: "disconnect one device keeps the user online",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3)},
				{do: "connect", uid: "a", conn: 2, ms: ms(10, 3)},
				{do: "disconnect", uid: "a", conn: 1, wantOK: true},
			},
			wantConns: map[int64][]int{10: {2}},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "last disconnect takes the user offline everywhere",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3, 11, 0)},
				{do: "connect", uid: "a", conn: 2},
				{do: "disconnect", uid: "a", conn: 2, wantOK: true},
				{do: "disconnect", uid: "a", conn: 1, wantOK: true},
				{do: "disconnect", uid: "a", conn: 1, wantOK: false},
			},
			wantConns: map[int64][]int{10: nil, 11: nil},
		},
		{
			name: "disconnect with the wrong uid does nothing",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3)},
				{do: "connect", uid: "b", conn: 2, ms: ms(10, 4)},
				{do: "disconnect", uid: "b", conn: 1, wantOK: false},
			},
			wantConns: map[int64][]int{10: {1, 2}},
			wantUsers: 2, wantConn: 2,
		},
		{
			name: "second device brings new memberships, keeps old",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3)},
				{do: "connect", uid: "a", conn: 2, ms: ms(20, 5)},
			},
			wantConns: map[int64][]int{10: {1, 2}, 20: {1, 2}},
			wantUsers: 1, wantConn: 2,
		},
		{
			name: "join of an online user sets its bit at once",
			ops: []op{
				{do: "connect", uid: "a", conn: 1},
				{do: "join", uid: "a", gid: 10, ord: 9},
			},
			wantConns: map[int64][]int{10: {1}},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "join of an offline user is a no-op",
			ops: []op{
				{do: "join", uid: "a", gid: 10, ord: 9},
				{do: "connect", uid: "b", conn: 2, ms: ms(10, 1)},
			},
			wantConns: map[int64][]int{10: {2}},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "leave clears the bit, other groups stay",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3, 20, 4)},
				{do: "connect", uid: "b", conn: 2, ms: ms(10, 5)},
				{do: "leave", uid: "a", gid: 10},
			},
			wantConns: map[int64][]int{10: {2}, 20: {1}},
			wantUsers: 2, wantConn: 2,
		},
		{
			name: "leave of the last online member removes the group",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3)},
				{do: "leave", uid: "a", gid: 10},
				{do: "leave", uid: "a", gid: 10},
				{do: "leave", uid: "zz", gid: 10},
			},
			wantConns: map[int64][]int{10: nil},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "rejoin with a new ordinal moves the bit",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 3)},
				{do: "join", uid: "a", gid: 10, ord: 8},
				{do: "connect", uid: "b", conn: 2, ms: ms(10, 3)},
			},
			wantConns: map[int64][]int{10: {1, 2}},
			wantUsers: 2, wantConn: 2,
		},
		{
			name: "reused ordinal: latest join evicts the stale holder",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 5)},
				{do: "connect", uid: "b", conn: 2},
				{do: "join", uid: "b", gid: 10, ord: 5},
				// a's later disconnect must not clear b's bit
				{do: "disconnect", uid: "a", conn: 1, wantOK: true},
			},
			wantConns: map[int64][]int{10: {2}},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "stale membership on a second connect does not evict",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 5)},
				{do: "connect", uid: "b", conn: 2},
				{do: "join", uid: "b", gid: 10, ord: 5},
				{do: "connect", uid: "a", conn: 3, ms: ms(10, 5)},
			},
			wantConns: map[int64][]int{10: {2}},
			wantUsers: 2, wantConn: 3,
		},
		{
			name: "duplicate connection is refused",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 1)},
				{do: "connect", uid: "a", conn: 1, wantErr: ErrConnExists},
				{do: "connect", uid: "b", conn: 1, ms: ms(10, 2), wantErr: ErrConnExists},
			},
			wantConns: map[int64][]int{10: {1}},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "too many connections is refused",
			ops: []op{
				{do: "connect", uid: "a", conn: 1},
				{do: "connect", uid: "a", conn: 2},
				{do: "connect", uid: "a", conn: 3},
				{do: "connect", uid: "a", conn: 4, ms: ms(10, 1), wantErr: ErrTooManyConns},
			},
			wantConns: map[int64][]int{10: nil},
			wantUsers: 1, wantConn: 3,
		},
		{
			name: "bad ordinal is refused before any change",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 1, 20, 1<<21), wantErr: ErrOrdinalRange},
				{do: "connect", uid: "b", conn: 2},
				{do: "join", uid: "b", gid: 10, ord: 1 << 21, wantErr: ErrOrdinalRange},
			},
			wantConns: map[int64][]int{10: nil, 20: nil},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "expiry after TTL without heartbeat",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 1)},
				{do: "connect", uid: "b", conn: 2, ms: ms(10, 2)},
				{do: "advance", d: 59 * time.Second},
				{do: "expire", want: nil},
				{do: "touch", conn: 2, wantOK: true},
				{do: "advance", d: time.Second},
				{do: "expire", want: []int{1}},
				{do: "touch", conn: 1, wantOK: false},
				{do: "advance", d: 58 * time.Second},
				{do: "expire", want: nil},
				{do: "advance", d: time.Second},
				{do: "expire", want: []int{2}},
			},
			wantConns: map[int64][]int{10: nil},
		},
		{
			name: "expiry of one device keeps the other",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 1)},
				{do: "advance", d: 30 * time.Second},
				{do: "connect", uid: "a", conn: 2},
				{do: "advance", d: 30 * time.Second},
				{do: "expire", want: []int{1}},
				{do: "disconnect", uid: "a", conn: 1, wantOK: false},
			},
			wantConns: map[int64][]int{10: {2}},
			wantUsers: 1, wantConn: 1,
		},
		{
			name: "heartbeat order survives a clock step back",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 1)},
				{do: "advance", d: 10 * time.Second},
				{do: "connect", uid: "b", conn: 2, ms: ms(10, 2)},
				{do: "advance", d: -20 * time.Second},
				{do: "touch", conn: 1, wantOK: true}, // at -10 s: never moves a heartbeat back
				{do: "advance", d: 69 * time.Second},
				{do: "expire", want: nil},
				{do: "advance", d: 11 * time.Second},
				{do: "expire", want: []int{1, 2}},
			},
			wantConns: map[int64][]int{10: nil},
		},
		{
			name: "remove group drops every online member of it",
			ops: []op{
				{do: "connect", uid: "a", conn: 1, ms: ms(10, 1, 20, 1)},
				{do: "connect", uid: "b", conn: 2, ms: ms(10, 2)},
				{do: "removegroup", gid: 10},
				{do: "removegroup", gid: 10},
			},
			wantConns: map[int64][]int{10: nil, 20: {1}},
			wantUsers: 2, wantConn: 2,
		},
	}
	for _, tt := range tests {
		for _, shards := range []int{1, 8} {
			t.Run(fmt.Sprintf("%s/shards=%d", tt.name, shards), func(t *testing.T) {
				c := newClock()
				l := newLocalShards(t, c, shards)
				for i, o := range tt.ops {
					where := fmt.Sprintf("op %d (%s)", i, o.do)
					switch o.do {
					case "connect":
						if err := l.Connect(o.uid, o.conn, o.ms); !errors.Is(err, o.wantErr) {
							t.Fatalf("%s: got err %v, want %v", where, err, o.wantErr)
						}
					case "disconnect":
						if got := l.Disconnect(o.uid, o.conn); got != o.wantOK {
							t.Fatalf("%s: got %v, want %v", where, got, o.wantOK)
						}
					case "join":
						if err := l.Join(o.gid, o.uid, o.ord); !errors.Is(err, o.wantErr) {
							t.Fatalf("%s: got err %v, want %v", where, err, o.wantErr)
						}
					case "leave":
						l.Leave(o.gid, o.uid)
					case "touch":
						if got := l.Touch(o.conn); got != o.wantOK {
							t.Fatalf("%s: got %v, want %v", where, got, o.wantOK)
						}
					case "advance":
						c.Advance(o.d)
					case "expire":
						got := l.Expire(c.Now())
						slices.Sort(got)
						if !slices.Equal(got, o.want) {
							t.Fatalf("%s: got expired %v, want %v", where, got, o.want)
						}
					case "removegroup":
						l.RemoveGroup(o.gid)
					default:
						t.Fatalf("unknown op %q", o.do)
					}
					checkInvariants(t, l)
				}
				for gid, want := range tt.wantConns {
					got := l.AppendConns(nil, gid)
					slices.Sort(got)
					if !slices.Equal(got, want) {
						t.Errorf("gid %d: got conns %v, want %v", gid, got, want)
					}
				}
				st := l.Stats()
				if st.Users != tt.wantUsers || st.Conns != tt.wantConn {
					t.Errorf("got stats %+v, want users %d conns %d", st, tt.wantUsers, tt.wantConn)
				}
			})
		}
	}
}

// checkInvariants walks every structure of l (quiescent) and verifies the
// package invariants of doc.go.
func checkInvariants(t testing.TB, l *Local[int]) {
	t.Helper()
	var users, conns, groups int64
	for i := range l.users {
		for uid, u := range l.users[i].m {
			if u.dead.Load() {
				t.Fatalf("dead user %q still in its shard", uid)
			}
			cl := u.conns.Load()
			if cl == nil || len(cl.s) == 0 {
				t.Fatalf("user %q online without connections", uid)
			}
			users++
			conns += int64(len(cl.s))
			for _, c := range cl.s {
				cs := l.conns[0].m[c]
				for j := range l.conns {
					if x, ok := l.conns[j].m[c]; ok {
						cs = x
					}
				}
				if cs == nil || cs.u != u {
					t.Fatalf("user %q conn %d not registered to it", uid, c)
				}
			}
		}
	}
	var listed int64
	for i := range l.conns {
		s := &l.conns[i]
		n := 0
		var prev *connState[int]
		for cs := s.head; cs != nil; cs = cs.next {
			if cs.prev != prev {
				t.Fatalf("conn list broken at %d", cs.conn)
			}
			if prev != nil && cs.lastSeen < prev.lastSeen {
				t.Fatalf("conn list out of order at %d", cs.conn)
			}
			if s.m[cs.conn] != cs {
				t.Fatalf("listed conn %d not in map", cs.conn)
			}
			prev = cs
			n++
		}
		if s.tail != prev || n != len(s.m) {
			t.Fatalf("conn shard %d: list %d entries, map %d", i, n, len(s.m))
		}
		listed += int64(n)
	}
	for i := range l.groups {
		for gid, g := range l.groups[i].m {
			if g.dead.Load() {
				t.Fatalf("dead group %d still in its shard", gid)
			}
			groups++
			if len(g.idx) == 0 {
				t.Fatalf("group %d has no online member", gid)
			}
			if int(g.bm.GetCardinality()) != len(g.idx) {
				t.Fatalf("group %d: bitmap has %d, index %d", gid, g.bm.GetCardinality(), len(g.idx))
			}
			live := 0
			for j, s := range g.slots {
				if s.u == nil {
					if !slices.Contains(g.free, int32(j)) {
						t.Fatalf("group %d: free slot %d not in free list", gid, j)
					}
					continue
				}
				live++
				if g.idx[s.ord] != int32(j) {
					t.Fatalf("group %d: slot %d ordinal %d indexed at %d", gid, j, s.ord, g.idx[s.ord])
				}
				if !g.bm.Contains(s.ord) {
					t.Fatalf("group %d: ordinal %d in a slot but bit clear", gid, s.ord)
				}
				if s.u.dead.Load() {
					t.Fatalf("group %d: ordinal %d held by offline user %q", gid, s.ord, s.u.uid)
				}
				if got, ok := s.u.ms.get(gid); !ok || got != s.ord {
					t.Fatalf("group %d: ordinal %d held by %q whose membership is %d,%v", gid, s.ord, s.u.uid, got, ok)
				}
				cl := s.u.conns.Load()
				if s.multi != (len(cl.s) > 1) || (!s.multi && s.c != cl.s[0]) {
					t.Fatalf("group %d: slot of %q says multi=%v c=%v, user has %v", gid, s.u.uid, s.multi, s.c, cl.s)
				}
			}
			if live != len(g.idx) || live+len(g.free) != len(g.slots) {
				t.Fatalf("group %d: %d live + %d free slots of %d, index %d", gid, live, len(g.free), len(g.slots), len(g.idx))
			}
		}
	}
	st := l.Stats()
	if st.Users != users || st.Conns != conns || st.Conns != listed || st.Groups != groups {
		t.Fatalf("stats %+v, walked users %d conns %d (listed %d) groups %d", st, users, conns, listed, groups)
	}
}

func TestForEachOnlineAndLookups(t *testing.T) {
	l := newLocal(t, newClock())
	// Ordinals spread over several roaring containers and more than one
	// push chunk, with a multi-device user among them.
	var want []uint32
	for i := range 3000 {
		ord := uint32(i * 97)
		uid := fmt.Sprintf("u%d", i)
		if err := l.Connect(uid, i, []Membership{{GID: 1, Ordinal: ord}}); err != nil {
			t.Fatal(err)
		}
		want = append(want, ord)
	}
	if err := l.Connect("u7", 100000, nil); err != nil {
		t.Fatal(err)
	}
	var got []uint32
	nconns := 0
	l.ForEachOnline(1, func(ord uint32, c int) bool {
		if len(got) == 0 || got[len(got)-1] != ord {
			got = append(got, ord)
		}
		nconns++
		if want := int(ord / 97); c != want && !(ord == 7*97 && c == 100000) {
			t.Fatalf("ordinal %d: got conn %d, want %d", ord, c, want)
		}
		return true
	})
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("got %d ordinals (first %v), want %d", len(got), got[:min(5, len(got))], len(want))
	}
	if nconns != 3001 {
		t.Fatalf("got %d conns, want 3001", nconns)
	}
	if n := len(l.AppendConns(nil, 1)); n != 3001 {
		t.Fatalf("AppendConns: got %d, want 3001", n)
	}
	rs := l.AppendRecipients(nil, 1)
	if len(rs) != 3001 {
		t.Fatalf("AppendRecipients: got %d, want 3001", len(rs))
	}
	for _, r := range rs {
		if uid, _ := l.UIDOf(1, r.Ordinal); uid != fmt.Sprintf("u%d", r.Ordinal/97) {
			t.Fatalf("recipient %+v: uid %q", r, uid)
		}
	}
	if n := l.OnlineCount(1); n != 3000 {
		t.Fatalf("OnlineCount: got %d, want 3000", n)
	}
	stop := 0
	l.ForEachOnline(1, func(uint32, int) bool { stop++; return stop < 10 })
	if stop != 10 {
		t.Fatalf("early stop: got %d calls, want 10", stop)
	}
	if uid, ok := l.UIDOf(1, 97*5); !ok || uid != "u5" {
		t.Fatalf("UIDOf: got %q %v, want u5 true", uid, ok)
	}
	if _, ok := l.UIDOf(1, 98); ok {
		t.Fatal("UIDOf(98): got online, want not")
	}
	if !l.ContainsOrdinal(1, 0) || l.ContainsOrdinal(2, 0) {
		t.Fatal("ContainsOrdinal: wrong answer")
	}
	if bm := l.CloneBitmap(1); bm == nil || bm.GetCardinality() != 3000 || !bm.Contains(97*2999) {
		t.Fatalf("CloneBitmap: got %v", bm)
	}
	if bm := l.CloneBitmap(2); bm != nil {
		t.Fatalf("CloneBitmap of empty group: got %v, want nil", bm)
	}
	if got := l.AppendUserConns(nil, "u7"); !slices.Equal(got, []int{7, 100000}) {
		t.Fatalf("AppendUserConns: got %v", got)
	}
	if got := l.Memberships(nil, "u7"); !slices.Equal(got, []Membership{{GID: 1, Ordinal: 7 * 97}}) {
		t.Fatalf("Memberships: got %v", got)
	}
	if !l.UserOnline("u1") || l.UserOnline("nobody") {
		t.Fatal("UserOnline: wrong answer")
	}
	checkInvariants(t, l)
}

func TestManyMemberships(t *testing.T) {
	l := newLocal(t, newClock())
	var m []Membership
	for g := range int64(50) {
		m = append(m, Membership{GID: g, Ordinal: uint32(g)})
	}
	if err := l.Connect("a", 1, m); err != nil {
		t.Fatal(err)
	}
	for g := range int64(50) {
		if g%2 == 0 {
			l.Leave(g, "a")
		}
	}
	checkInvariants(t, l)
	if got := len(l.AppendGroups(nil)); got != 25 {
		t.Fatalf("got %d groups, want 25", got)
	}
	if got := len(l.Memberships(nil, "a")); got != 25 {
		t.Fatalf("got %d memberships, want 25", got)
	}
	l.Disconnect("a", 1)
	checkInvariants(t, l)
	if st := l.Stats(); st.Users != 0 || st.Conns != 0 || st.Groups != 0 {
		t.Fatalf("got %+v, want empty", st)
	}
}

func TestDrainDirty(t *testing.T) {
	l := newLocal(t, newClock())
	if err := l.Connect("a", 1, ms(10, 1)); err != nil {
		t.Fatal(err)
	}
	if got := l.DrainDirty(nil); len(got) != 0 {
		t.Fatalf("first drain (tracking off): got %v, want none", got)
	}
	steps := []struct {
		name string
		do   func()
		want []int64
	}{
		{"no change", func() {}, nil},
		{"join", func() { _ = l.Join(20, "a", 2) }, []int64{20}},
		{"two changes one group", func() {
			_ = l.Connect("b", 2, ms(10, 2))
			_ = l.Connect("c", 3, ms(10, 3))
		}, []int64{10}},
		{"second device changes no bit", func() { _ = l.Connect("b", 4, ms(10, 2)) }, nil},
		{"disconnect clears two groups", func() { l.Disconnect("a", 1) }, []int64{10, 20}},
		{"remove group", func() { l.RemoveGroup(10) }, []int64{10}},
		{"offline join", func() { _ = l.Join(30, "nobody", 1) }, nil},
	}
	for _, s := range steps {
		s.do()
		got := l.DrainDirty(nil)
		slices.Sort(got)
		if !slices.Equal(got, s.want) {
			t.Fatalf("%s: got dirty %v, want %v", s.name, got, s.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  Config
		want bool
	}{
		{Config{}, true},
		{Config{Shards: 16, TTL: time.Second}, true},
		{Config{Shards: 3}, false},
		{Config{TTL: -1}, false},
		{Config{MaxConnsPerUser: -1}, false},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (err == nil) != tt.want {
			t.Errorf("%+v: got %v, want ok=%v", tt.cfg, err, tt.want)
		}
		if _, nerr := New[int](tt.cfg); (nerr == nil) != tt.want {
			t.Errorf("New(%+v): got %v, want ok=%v", tt.cfg, nerr, tt.want)
		}
	}
}

// TestConcurrent hammers one Local from many goroutines (run with -race) and
// then checks that everything is consistent and, once all disconnect, empty.
func TestConcurrent(t *testing.T) {
	c := newClock()
	l, err := New[int](Config{TTL: time.Minute, Now: c.Now, Shards: 8, MaxConnsPerUser: 4})
	if err != nil {
		t.Fatal(err)
	}
	const (
		workers = 8
		rounds  = 2000
		nUsers  = 64
		nGroups = 6
	)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Pushers and readers run until the writers finish.
	for range 2 {
		wg.Go(func() {
			var buf []int
			for {
				select {
				case <-stop:
					return
				default:
				}
				for g := range int64(nGroups) {
					buf = l.AppendConns(buf[:0], g)
					l.ForEachOnline(g, func(uint32, int) bool { return true })
					_ = l.OnlineCount(g)
				}
				_ = l.DrainDirty(nil)
				for _, conn := range l.Expire(c.Now()) {
					_ = conn
				}
			}
		})
	}
	var writers sync.WaitGroup
	for w := range workers {
		writers.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range rounds {
				uid := fmt.Sprintf("u%d", r.IntN(nUsers))
				ordOf := func(g int64) uint32 { return uint32(len(uid)*7+int(g)) % 32 }
				conn := w*1_000_000 + i
				switch r.IntN(6) {
				case 0, 1:
					var m []Membership
					for g := range int64(nGroups) {
						if r.IntN(2) == 0 {
							m = append(m, Membership{GID: g, Ordinal: ordOf(g)})
						}
					}
					if l.Connect(uid, conn, m) == nil && r.IntN(3) > 0 {
						l.Touch(conn)
						l.Disconnect(uid, conn)
					}
				case 2:
					g := int64(r.IntN(nGroups))
					_ = l.Join(g, uid, ordOf(g))
				case 3:
					l.Leave(int64(r.IntN(nGroups)), uid)
				case 4:
					c.Advance(time.Second)
				case 5:
					l.RemoveGroup(int64(r.IntN(nGroups)))
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	checkInvariants(t, l)
	c.Advance(2 * time.Minute)
	l.Expire(c.Now())
	checkInvariants(t, l)
	if st := l.Stats(); st.Users != 0 || st.Conns != 0 || st.Groups != 0 {
		t.Fatalf("after expiring everything: got %+v, want empty", st)
	}
}

// TestLeaveStopsPushesAtOnce: while pushes run concurrently, once Leave
// returns no later push collection includes the member.
func TestLeaveStopsPushesAtOnce(t *testing.T) {
	l := newLocal(t, newClock())
	for i := range 2000 {
		if err := l.Connect(fmt.Sprintf("u%d", i), i, ms(1, int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		var buf []int
		for {
			select {
			case <-done:
				return
			default:
				buf = l.AppendConns(buf[:0], 1)
			}
		}
	})
	var buf []int
	for i := 0; i < 2000; i += 7 {
		l.Leave(1, fmt.Sprintf("u%d", i))
		buf = l.AppendConns(buf[:0], 1)
		if slices.Contains(buf, i) {
			t.Fatalf("conn %d still pushed after Leave returned", i)
		}
	}
	close(done)
	wg.Wait()
	checkInvariants(t, l)
}

// TestPushDuringChurn: while members churn (filling and compacting the slot
// array), every push includes each member who stays online exactly once.
func TestPushDuringChurn(t *testing.T) {
	l := newLocal(t, newClock())
	const stable, churners = 1500, 3000
	// Interleave stable members with churners, so compaction moves stable
	// members' slots (a push under a compaction would skip or repeat them).
	for i := range churners {
		if err := l.Connect(fmt.Sprintf("c%d", i), 100000+i, ms(1, int64(i*2+1))); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if err := l.Connect(fmt.Sprintf("s%d", i/2), i/2, ms(1, int64(i/2*2))); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range 2 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			online := make([]bool, churners)
			for i := range online {
				online[i] = true
			}
			for {
				select {
				case <-done:
					return
				default:
				}
				// Bring all of this worker's churners up, then most of
				// them down, so free slots pile up past the compaction
				// threshold.
				for _, up := range []bool{true, false} {
					for _, i := range r.Perm(churners / 2) {
						c := i*2 + w
						if online[c] == up || (!up && i%10 == 0) {
							continue
						}
						uid := fmt.Sprintf("c%d", c)
						if up {
							_ = l.Connect(uid, 100000+c, ms(1, int64(c*2+1)))
						} else {
							l.Disconnect(uid, 100000+c)
						}
						online[c] = up
					}
				}
			}
		})
	}
	var buf []int
	var rs []Recipient[int]
	seen := make([]int, stable)
	deadline := time.Now().Add(20 * time.Second)
	for round := 0; round < 100 || l.Stats().Compactions < 1; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("no compaction in %d rounds: %+v", round, l.Stats())
		}
		clear(seen)
		if round%2 == 0 {
			buf = l.AppendConns(buf[:0], 1)
		} else {
			rs = l.AppendRecipients(rs[:0], 1)
			buf = buf[:0]
			for _, r := range rs {
				buf = append(buf, r.Conn)
			}
		}
		for _, c := range buf {
			if c < stable {
				seen[c]++
			}
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("round %d: stable member %d pushed %d times", round, i, n)
			}
		}
		if round%8 == 0 {
			time.Sleep(time.Millisecond) // a gap between pushes lets removals compact
		}
	}
	close(done)
	wg.Wait()
	checkInvariants(t, l)
}

// TestCompactionWaitsForPush: members going offline in the middle of a push
// (here from inside the ForEachOnline callback, between chunks) must not
// make the push skip or repeat a member who stays online; the compaction
// they trigger happens only after the push.
func TestCompactionWaitsForPush(t *testing.T) {
	l := newLocal(t, newClock())
	const n = 3000 // stable members at odd positions, churners at even
	for i := range n {
		uid := fmt.Sprintf("u%d", i)
		if err := l.Connect(uid, i, ms(1, int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(map[int]int)
	calls := 0
	l.ForEachOnline(1, func(ord uint32, c int) bool {
		calls++
		if calls == 600 { // past the first chunk: drop every churner
			for i := 0; i < n; i += 2 {
				l.Disconnect(fmt.Sprintf("u%d", i), i)
			}
		}
		seen[c]++
		return true
	})
	for i := 1; i < n; i += 2 {
		if seen[i] != 1 {
			t.Fatalf("stable member %d visited %d times", i, seen[i])
		}
	}
	if st := l.Stats(); st.Compactions != 0 {
		t.Fatalf("compacted during a push: %+v", st)
	}
	// The next removal, with no push in flight, compacts.
	l.Disconnect("u1", 1)
	if st := l.Stats(); st.Compactions != 1 {
		t.Fatalf("got %d compactions after the push, want 1", st.Compactions)
	}
	checkInvariants(t, l)
	if got := len(l.AppendConns(nil, 1)); got != n/2-1 {
		t.Fatalf("after compaction: got %d conns, want %d", got, n/2-1)
	}
}
