package gateway

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
)

// feedConn is a connection handle of the feed's tests: presence only
// compares and hashes it.
type feedConn struct{ uid string }

func (c *feedConn) UID() string { return c.uid }

// sink records what the feed sends: the frames decoded, and the
// recipients of each.
type sink struct {
	frames []wire.Presence
	to     [][]fanout.Conn
}

func (s *sink) send(f *socket.Frame, conns []fanout.Conn) {
	// f.Bytes() is a whole WebSocket frame: a short header, then the JSON.
	b := f.Bytes()
	i := slices.Index(b, '{')
	fr, err := wire.DecodeServer(b[i:])
	if err != nil {
		panic(err)
	}
	s.frames = append(s.frames, *fr.(*wire.Presence))
	s.to = append(s.to, slices.Clone(conns))
}

func (s *sink) take() []wire.Presence {
	out := s.frames
	s.frames, s.to = nil, nil
	return out
}

type feedFixture struct {
	t      testing.TB
	st     store.Store
	local  *presence.Local[fanout.Conn]
	levels *fanout.Levels
	feed   *PresenceFeed
	out    *sink
	conns  map[string]*feedConn
	ms     map[string][]presence.Membership
}

func newFeedFixture(t testing.TB, cfg PresenceFeedConfig) *feedFixture {
	t.Helper()
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	local, err := presence.New[fanout.Conn](presence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fx := &feedFixture{t: t, st: st, local: local, levels: fanout.NewLevels(time.Now, nil), out: &sink{},
		conns: map[string]*feedConn{}, ms: map[string][]presence.Membership{}}
	cfg.Index, cfg.Store, cfg.Levels, cfg.Send = local, st, fx.levels, fx.out.send
	cfg.Now = func() time.Time { return time.UnixMilli(1795986630112) }
	if fx.feed, err = NewPresenceFeed(cfg); err != nil {
		t.Fatal(err)
	}
	return fx
}

// group creates a group of n members u0..u(n-1).
func (fx *feedFixture) group(n int) int64 {
	fx.t.Helper()
	ctx := context.Background()
	g, err := fx.st.CreateGroup(ctx, store.Group{Name: "g", Owner: "u0"})
	if err != nil {
		fx.t.Fatal(err)
	}
	uids := make([]string, n)
	for i := range uids {
		uids[i] = "u" + strconv.Itoa(i)
	}
	ms, err := fx.st.AddMembers(ctx, g.GID, uids)
	if err != nil {
		fx.t.Fatal(err)
	}
	for _, m := range ms {
		fx.ms[m.UID] = append(fx.ms[m.UID], presence.Membership{GID: g.GID, Ordinal: m.Ordinal})
	}
	return g.GID
}

func (fx *feedFixture) online(uids ...string) {
	fx.t.Helper()
	for _, u := range uids {
		c := &feedConn{uid: u}
		fx.conns[u] = c
		if err := fx.local.Connect(u, c, fx.ms[u]); err != nil {
			fx.t.Fatal(err)
		}
	}
}

func (fx *feedFixture) offline(uids ...string) {
	for _, u := range uids {
		fx.local.Disconnect(u, fx.conns[u])
		delete(fx.conns, u)
	}
}

func (fx *feedFixture) round() []wire.Presence {
	fx.feed.Round(context.Background())
	return fx.out.take()
}

func TestPresenceFeedCounts(t *testing.T) {
	fx := newFeedFixture(t, PresenceFeedConfig{ListMax: 4, EventsMax: 4, MaxEvents: 2})
	small := fx.group(4)
	fx.online("u0")
	got := fx.round()
	if want := []wire.Presence{{GID: small, Online: 1, TS: 1795986630112}}; !slices.EqualFunc(got, want, eqPresence) {
		t.Fatalf("first round: got %+v, want %+v", got, want)
	}
	if got := fx.round(); len(got) != 0 {
		t.Fatalf("nothing changed: got %+v, want no frame", got)
	}
	// A storm within one interval is one frame.
	fx.online("u1", "u2", "u3")
	fx.offline("u1")
	got = fx.round()
	if len(got) != 1 || got[0].Online != 3 || !slices.Equal(got[0].Joined, []string{"u2", "u3"}) || len(got[0].Left) != 0 || got[0].More {
		t.Fatalf("storm: got %+v, want one frame, 3 online, joined u2 u3", got)
	}
	if n := len(fx.out.to); n != 0 {
		t.Fatalf("take left %d", n)
	}
	// Cut at MaxEvents: more.
	fx.offline("u0", "u2", "u3")
	fx.online("u1")
	got = fx.round()
	if len(got) != 1 || got[0].Online != 1 || len(got[0].Left) != 2 || !got[0].More || !slices.Equal(got[0].Joined, []string{"u1"}) {
		t.Fatalf("past MaxEvents: got %+v, want left cut at 2, more", got)
	}
	// A leave and a join in one interval: same count, still a frame.
	fx.offline("u1")
	fx.online("u0")
	got = fx.round()
	if len(got) != 1 || got[0].Online != 1 || !slices.Equal(got[0].Joined, []string{"u0"}) || !slices.Equal(got[0].Left, []string{"u1"}) {
		t.Fatalf("swap: got %+v", got)
	}
	// The group empties: nobody here to tell, the feed forgets it.
	fx.offline("u0")
	if got := fx.round(); len(got) != 0 {
		t.Fatalf("empty: got %+v", got)
	}
	if len(fx.feed.groups) != 0 {
		t.Fatalf("feed keeps %d groups after the last member left", len(fx.feed.groups))
	}
}

func eqPresence(a, b wire.Presence) bool {
	return a.GID == b.GID && a.Online == b.Online && a.TS == b.TS && slices.Equal(a.Joined, b.Joined) &&
		slices.Equal(a.Left, b.Left) && a.More == b.More
}

// TestPresenceFeedLargeGroup: a group above EventsMax gets counts only, a
// group above ListMax is not rostered at all; one frame per group per
// round goes to every online member's connection.
func TestPresenceFeedLargeGroup(t *testing.T) {
	fx := newFeedFixture(t, PresenceFeedConfig{ListMax: 6, EventsMax: 3})
	mid := fx.group(5)
	large := fx.group(8)
	fx.online("u0", "u1")
	fx.round()
	fx.online("u2", "u5")
	got := fx.round()
	slices.SortFunc(got, func(a, b wire.Presence) int { return int(a.GID - b.GID) })
	if len(got) != 2 || got[0].GID != mid || got[0].Online != 3 || len(got[0].Joined)+len(got[0].Left) != 0 {
		t.Fatalf("above EventsMax: got %+v, want a count only", got)
	}
	if got[1].GID != large || got[1].Online != 4 || len(got[1].Joined)+len(got[1].Left) != 0 {
		t.Fatalf("above ListMax: got %+v, want a count only", got[1])
	}
	fx.offline("u5")
	fx.feed.Round(context.Background())
	if len(fx.out.frames) != 1 || fx.out.frames[0].GID != large || len(fx.out.to[0]) != 3 {
		t.Fatalf("one change in the large group: %+v to %v, want one frame to its 3 online members", fx.out.frames, fx.out.to)
	}
	if _, uids, listed, err := fx.feed.Occupancy(context.Background(), large, 8); err != nil || listed || uids != nil {
		t.Fatalf("Occupancy of a large group: %v %v %v", uids, listed, err)
	}
}

// TestPresenceFeedLevels: L2 drops events (the next frame says more), L3
// and L4 push nothing; below L3 again the current count is pushed.
func TestPresenceFeedLevels(t *testing.T) {
	fx := newFeedFixture(t, PresenceFeedConfig{})
	gid := fx.group(5)
	fx.online("u0")
	fx.round()
	force := func(l fanout.Level) { fx.levels.Force(gid, &l, 0) }
	force(fanout.L2Summary)
	fx.online("u1")
	got := fx.round()
	if len(got) != 1 || got[0].Online != 2 || len(got[0].Joined) != 0 || !got[0].More {
		t.Fatalf("L2: got %+v, want the count only, with more", got)
	}
	for _, l := range []fanout.Level{fanout.L3WriteOnly, fanout.L4Reject} {
		force(l)
		fx.online("u" + strconv.Itoa(int(l)))
		if got := fx.round(); len(got) != 0 {
			t.Fatalf("L%d: got %+v, want nothing", l, got)
		}
	}
	if fx.feed.Stats().Shed != 2 {
		t.Fatalf("shed %d, want 2", fx.feed.Stats().Shed)
	}
	force(fanout.L1Merge)
	got = fx.round()
	if len(got) != 1 || got[0].Online != 4 || !got[0].More || len(got[0].Joined) != 0 {
		t.Fatalf("back at L1: got %+v, want the current count with more", got)
	}
	fx.offline("u1")
	got = fx.round()
	if len(got) != 1 || !slices.Equal(got[0].Left, []string{"u1"}) || got[0].More {
		t.Fatalf("L1 events: got %+v", got)
	}
}

func TestPresenceFeedConfig(t *testing.T) {
	ok := PresenceFeedConfig{Index: &presence.Local[fanout.Conn]{}, Store: nil}
	if err := ok.Validate(); err == nil {
		t.Fatal("no store: no error")
	}
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	local, _ := presence.New[fanout.Conn](presence.Config{})
	for _, c := range []struct {
		name string
		cfg  PresenceFeedConfig
		ok   bool
	}{
		{"defaults", PresenceFeedConfig{}, true},
		{"interval at the floor", PresenceFeedConfig{Interval: MinPresenceInterval}, true},
		{"interval below", PresenceFeedConfig{Interval: MinPresenceInterval - 1}, false},
		{"list max at the cap", PresenceFeedConfig{ListMax: MaxPresenceListMax}, true},
		{"list max above", PresenceFeedConfig{ListMax: MaxPresenceListMax + 1}, false},
		{"max events at the cap", PresenceFeedConfig{MaxEvents: wire.MaxPresenceEvents}, true},
		{"max events above", PresenceFeedConfig{MaxEvents: wire.MaxPresenceEvents + 1}, false},
	} {
		c.cfg.Index, c.cfg.Store = local, st
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", c.name, err, c.ok)
		}
	}
}

func TestPresenceWire(t *testing.T) {
	for _, p := range []wire.Presence{
		{GID: 1, Online: 0, TS: 5},
		{GID: 7, Online: 3, TS: 1795986630112, Joined: []string{"a", "b\"c"}, Left: []string{"é"}, More: true},
	} {
		b := wire.AppendPresence(nil, &p)
		f, err := wire.DecodeServer(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if got := *f.(*wire.Presence); !eqPresence(got, p) {
			t.Fatalf("round trip of %s: got %+v, want %+v", b, got, p)
		}
	}
	many := `{"type":"presence","gid":1,"online":1,"ts":1,"joined":[` + strings1025() + `]}`
	if _, err := wire.DecodeServer([]byte(many)); err == nil {
		t.Fatal("1025 joined: no error")
	}
	for _, bad := range []string{
		`{"type":"presence","gid":0,"online":1,"ts":1}`,
		`{"type":"presence","gid":1,"online":-1,"ts":1}`,
		`{"type":"presence","gid":1,"online":1,"ts":1,"left":[1]}`,
	} {
		if _, err := wire.DecodeServer([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func strings1025() string {
	b := make([]byte, 0, 1025*4)
	for i := range wire.MaxPresenceEvents + 1 {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"', 'u', '"')
	}
	return string(b)
}

// BenchmarkPresenceRound is one interval of the feed for one group of
// 100,000 members with a given share online on this node, after one member
// changed: the count, one encode and the hand-off of the frame to every
// online connection (the recipients loop of the real broadcast is the
// socket layer's, measured by its own benchmarks; here Send only counts).
// It reports the round's cost per change and per recipient.
func BenchmarkPresenceRound(b *testing.B) {
	const members = 100_000
	for _, pct := range []int{10, 50, 100} {
		b.Run(fmt.Sprintf("members=%d/online=%dpct", members, pct), func(b *testing.B) {
			st, err := embedded.Open(embedded.Config{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			local, _ := presence.New[fanout.Conn](presence.Config{})
			const gid = 1
			online := members * pct / 100
			conns := make([]*feedConn, online)
			for i := range conns {
				conns[i] = &feedConn{uid: "u" + strconv.Itoa(i)}
				if err := local.Connect(conns[i].uid, conns[i], []presence.Membership{{GID: gid, Ordinal: uint32(i)}}); err != nil {
					b.Fatal(err)
				}
			}
			var recipients int
			f, err := NewPresenceFeed(PresenceFeedConfig{Index: local, Store: st, ListMax: -1,
				Send: func(_ *socket.Frame, cs []fanout.Conn) { recipients += len(cs) }})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			f.Round(ctx)
			flip := conns[0]
			b.ReportAllocs()
			recipients = 0
			for i := 0; b.Loop(); i++ {
				// One member goes offline or comes back: the count changes
				// every round, so every round pushes.
				if i%2 == 0 {
					local.Disconnect(flip.uid, flip)
				} else {
					_ = local.Connect(flip.uid, flip, []presence.Membership{{GID: gid, Ordinal: 0}})
				}
				f.Round(ctx)
			}
			if f.Stats().Frames < int64(b.N) {
				b.Fatalf("%d frames for %d rounds", f.Stats().Frames, b.N)
			}
			b.ReportMetric(float64(recipients)/float64(b.N), "recipients/round")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(recipients), "ns/recipient")
		})
	}
}

// BenchmarkPresenceRoundListed is one interval for a listed group of
// 1,000 members, half online, with events: the local roster (sorted), the
// diff against the last round and the frame with the joined and left uids.
func BenchmarkPresenceRoundListed(b *testing.B) {
	fx := newFeedFixture(b, PresenceFeedConfig{})
	fx.group(1000)
	for i := range 500 {
		fx.online("u" + strconv.Itoa(i))
	}
	fx.round()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			fx.offline("u0")
		} else {
			fx.online("u0")
		}
		fx.feed.Round(context.Background())
		fx.out.frames, fx.out.to = fx.out.frames[:0], fx.out.to[:0]
	}
	if fx.feed.Stats().Frames < int64(b.N) {
		b.Fatalf("%d frames for %d rounds", fx.feed.Stats().Frames, b.N)
	}
}
