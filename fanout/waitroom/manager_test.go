package waitroom_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/fanout/waitroom/roomtoken"
)

var testSecret = []byte(strings.Repeat("k", 32))

// recorder collects the updates delivered to one ticket.
type recorder struct {
	mu  sync.Mutex
	ups []waitroom.Update
	at  []time.Time
}

func (r *recorder) deliver(u waitroom.Update) {
	r.mu.Lock()
	r.ups = append(r.ups, u)
	r.at = append(r.at, time.Now())
	r.mu.Unlock()
}

func (r *recorder) last() waitroom.Update {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ups) == 0 {
		return waitroom.Update{}
	}
	return r.ups[len(r.ups)-1]
}

func (r *recorder) all() ([]waitroom.Update, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]waitroom.Update(nil), r.ups...), append([]time.Time(nil), r.at...)
}

type endLog struct {
	mu   sync.Mutex
	ends []waitroom.SessionEnd
}

func (l *endLog) SessionEnded(e waitroom.SessionEnd) {
	l.mu.Lock()
	l.ends = append(l.ends, e)
	l.mu.Unlock()
}

func (l *endLog) list() []waitroom.SessionEnd {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]waitroom.SessionEnd(nil), l.ends...)
}

// startManager runs a Manager on an in-process backend inside a synctest
// bubble and stops it at cleanup.
func startManager(t *testing.T, rc waitroom.RoomConfig, obs ...waitroom.Observer) *waitroom.Manager {
	t.Helper()
	signer, err := roomtoken.NewHS256(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	m, err := waitroom.New(waitroom.Config{Signer: signer, Observers: obs, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Upsert(t.Context(), rc); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		m.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return m
}

func join(t *testing.T, m *waitroom.Manager, room, uid string, level int) (*waitroom.Ticket, *recorder) {
	t.Helper()
	rec := &recorder{}
	tk, err := m.Join(t.Context(), room, uid, level, rec.deliver)
	if err != nil {
		t.Fatalf("Join(%s): %v", uid, err)
	}
	if rec.last().Kind == 0 {
		t.Fatalf("Join(%s): no first update delivered before return", uid)
	}
	return tk, rec
}

func TestJoinGrantLeaveFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ends := &endLog{}
		m := startManager(t, waitroom.RoomConfig{Name: "launch", MaxActive: 1, AdmitRate: 10, AccessTokenTTL: time.Minute}, ends)
		t1, r1 := join(t, m, "launch", "u1", 0)
		if ups, _ := r1.all(); ups[0].Kind != waitroom.UpdateQueue || ups[0].Position != 1 {
			u := ups[0]
			t.Fatalf("first frame: got %+v, want queue position 1", u)
		}
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		g := r1.last()
		if g.Kind != waitroom.UpdateGranted {
			t.Fatalf("u1: got %+v, want granted", g)
		}
		cl, err := roomtoken.Verify(g.AccessToken, testSecret, "launch", 0)
		if err != nil || cl.UID() != "u1" || !cl.ExpiresAt.Time.Equal(g.ExpiresAt) {
			t.Fatalf("access token: got %+v, %v", cl, err)
		}
		_, r2 := join(t, m, "launch", "u2", 0)
		time.Sleep(time.Second)
		synctest.Wait()
		if u := r2.last(); u.Kind != waitroom.UpdateQueue || u.Position != 1 {
			t.Fatalf("u2 while u1 active: got %+v, want queue position 1", u)
		}
		t1.Close()
		t1.Close() // idempotent
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if u := r2.last(); u.Kind != waitroom.UpdateGranted {
			t.Fatalf("u2 after u1 disconnects: got %+v, want granted", u)
		}
		if e := ends.list(); len(e) != 1 || e[0].UID != "u1" || e[0].Reason != waitroom.EndDisconnect {
			t.Fatalf("session ends: got %+v, want u1 by disconnect", e)
		}
		// u2 a second socket: granted again, no second entry.
		_, r2b := join(t, m, "launch", "u2", 0)
		if u := r2b.last(); u.Kind != waitroom.UpdateGranted {
			t.Fatalf("second socket of an admitted user: got %+v, want granted", u)
		}
		// expiry ends u2's session.
		time.Sleep(61 * time.Second)
		synctest.Wait()
		if u := r2.last(); u.Kind != waitroom.UpdateEnded || u.Reason != waitroom.EndExpired {
			t.Fatalf("after expiry: got %+v, want ended (expired)", u)
		}
		if e := ends.list(); len(e) != 2 || e[1].Reason != waitroom.EndExpired {
			t.Fatalf("session ends: got %+v, want u2 by expiry", e)
		}
	})
}

func TestLeaveEndsSessionAndAdmitsNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ends := &endLog{}
		m := startManager(t, waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 10}, ends)
		t1, _ := join(t, m, "r", "a", 0)
		time.Sleep(200 * time.Millisecond)
		_, rb := join(t, m, "r", "b", 0)
		if err := t1.Leave(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if u := rb.last(); u.Kind != waitroom.UpdateGranted {
			t.Fatalf("b after a leaves: got %+v, want granted", u)
		}
		if e := ends.list(); len(e) != 1 || e[0].Reason != waitroom.EndLeave {
			t.Fatalf("ends: got %+v, want a by leave", e)
		}
	})
}

// holder occupies the room's single slot so others wait.
func holdSlot(t *testing.T, m *waitroom.Manager, room string) {
	t.Helper()
	_, r := join(t, m, room, "holder", 0)
	time.Sleep(200 * time.Millisecond)
	synctest.Wait()
	if r.last().Kind != waitroom.UpdateGranted {
		t.Fatalf("holder: got %+v, want granted", r.last())
	}
}

func TestPushesCoalescedAndPausedWhenRateZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startManager(t, waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 10, AccessTokenTTL: time.Hour})
		holdSlot(t, m, "r")
		_, rec := join(t, m, "r", "w", 0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if u := rec.last(); u.Status != waitroom.StatusWaiting || u.ETA != 0 || u.Position != 1 {
			t.Fatalf("within the window: got %+v, want waiting, ETA 0 s, position 1", u)
		}
		for range 20 { // new users behind w change its total every snapshot
			join(t, m, "r", "x"+time.Now().Format("150405.000"), 0)
			time.Sleep(500 * time.Millisecond)
		}
		ups, at := rec.all()
		for i := 1; i < len(ups); i++ {
			if ups[i].Status == ups[i-1].Status && at[i].Sub(at[i-1]) < 3*time.Second {
				t.Fatalf("pushes %d and %d only %v apart, want >= PushEvery (3 s)", i-1, i, at[i].Sub(at[i-1]))
			}
		}
		if len(ups) < 3 {
			t.Fatalf("pushes: got %d, want several as the total grows", len(ups))
		}
		time.Sleep(6 * time.Minute) // no admission for longer than the 5-minute window
		synctest.Wait()
		if u := rec.last(); u.Kind != waitroom.UpdateQueue || u.Status != waitroom.StatusPaused || u.ETA != 0 {
			t.Fatalf("after 6 min without admissions: got %+v, want paused without ETA", u)
		}
		if p, ok := m.Position("r", "w"); !ok || p.Status != waitroom.StatusPaused {
			t.Fatalf("Position from the snapshot: got %+v %v, want paused", p, ok)
		}
	})
}

// A user entering right after the room's first admission, before the next
// snapshot, is told waiting with an ETA, not paused.
func TestFirstFrameAfterFirstAdmissionIsWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startManager(t, waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 10, AccessTokenTTL: time.Hour})
		time.Sleep(time.Millisecond) // the driver's first snapshot: no admission yet
		_, rh := join(t, m, "r", "holder", 0)
		for rh.last().Kind != waitroom.UpdateGranted {
			time.Sleep(time.Millisecond)
		}
		_, rec := join(t, m, "r", "w", 0)
		if ups, _ := rec.all(); ups[0].Status != waitroom.StatusWaiting || ups[0].Position != 1 {
			t.Fatalf("first frame after the first admission: got %+v, want waiting at position 1", ups[0])
		}
	})
}

func TestVIPAheadNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startManager(t, waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 10, AccessTokenTTL: time.Hour, Smoothing: -1})
		holdSlot(t, m, "r")
		_, n1 := join(t, m, "r", "n1", 0)
		_, n2 := join(t, m, "r", "n2", 0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		_, v := join(t, m, "r", "v", 2)
		if u := v.last(); u.Position != 1 {
			t.Fatalf("VIP2 first frame: got position %d, want 1", u.Position)
		}
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		for name, rec := range map[string]*recorder{"n1": n1, "n2": n2} {
			u := rec.last()
			if !u.VIPAheadNotice || u.Ahead < 1 {
				t.Fatalf("%s after a VIP entered ahead: got %+v, want vip_ahead_notice", name, u)
			}
		}
		if u := n2.last(); u.Position != 3 {
			t.Fatalf("n2 position: got %d, want 3", u.Position)
		}
		if v.last().VIPAheadNotice {
			t.Fatalf("the VIP itself got a notice")
		}
		_, n3 := join(t, m, "r", "n3", 0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		for _, u := range func() []waitroom.Update { u, _ := n3.all(); return u }() {
			if u.VIPAheadNotice {
				t.Fatalf("n3 joined after the VIP: got a notice %+v", u)
			}
		}
	})
}

func TestGraceReconnectKeepsPosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startManager(t, waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 10, AccessTokenTTL: time.Hour})
		holdSlot(t, m, "r")
		join(t, m, "r", "a", 0)
		time.Sleep(time.Second)
		tb, rb := join(t, m, "r", "b", 0)
		time.Sleep(time.Second)
		join(t, m, "r", "c", 0)
		if p := rb.last().Position; p != 2 {
			t.Fatalf("b: got position %d, want 2", p)
		}
		tb.Close()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		_, rb2 := join(t, m, "r", "b", 0)
		if u := rb2.last(); u.Position != 2 {
			t.Fatalf("b back within grace: got position %d, want 2", u.Position)
		}
	})
}

func TestOverloadRefusesNewEntrants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startManager(t, waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 10, AccessTokenTTL: time.Hour})
		holdSlot(t, m, "r")
		_, ra := join(t, m, "r", "a", 0)
		time.Sleep(2500 * time.Millisecond) // a snapshot sees holder and a
		synctest.Wait()
		if err := m.ForceDegradation(waitroom.DegradeOverload, 0); err != nil {
			t.Fatal(err)
		}
		if m.Degradation() != waitroom.DegradeOverload {
			t.Fatalf("level: got %v, want L2", m.Degradation())
		}
		_, rn := join(t, m, "r", "new", 0)
		if u := rn.last(); u.Kind != waitroom.UpdateRejected || u.Reject != waitroom.RejectRoomFull || u.RetryAfter <= 0 {
			t.Fatalf("new entrant at L2: got %+v, want rejected room_full with retry", u)
		}
		_, ra2 := join(t, m, "r", "a", 0)
		if u := ra2.last(); u.Kind != waitroom.UpdateQueue || u.Position != ra.last().Position {
			t.Fatalf("known user at L2: got %+v, want its queue position", u)
		}
		st, err := m.Status(t.Context(), "r")
		if err != nil || st.Degradation != waitroom.DegradeOverload || st.Active != 1 || st.Waiting != 1 {
			t.Fatalf("status at L2: got %+v, %v", st, err)
		}
		m.ClearDegradation()
		_, rn = join(t, m, "r", "new", 0)
		if u := rn.last(); u.Kind != waitroom.UpdateQueue {
			t.Fatalf("new entrant after L2: got %+v, want queued", u)
		}
	})
}

func TestCapacityRejectsBeyondLMax(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startManager(t, waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 1, TargetWait: 10 * time.Second,
			SafetyFactor: 0.5, AccessTokenTTL: time.Hour})
		holdSlot(t, m, "r")
		for i := range 5 {
			join(t, m, "r", string(rune('a'+i)), 0)
		}
		_, r := join(t, m, "r", "z", 0)
		if u := r.last(); u.Kind != waitroom.UpdateRejected || u.Reject != waitroom.RejectRoomFull {
			t.Fatalf("entrant beyond L_max: got %+v, want rejected room_full", u)
		}
		st, err := m.Status(t.Context(), "r")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		st, _ = m.Status(t.Context(), "r")
		if st.Alert != 2 {
			t.Fatalf("alert at %d/%d: got %d, want 2 (>= 80%%)", st.Waiting, st.LMax, st.Alert)
		}
	})
}

func TestManagerConfig(t *testing.T) {
	m, err := waitroom.New(waitroom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Upsert(t.Context(), waitroom.RoomConfig{Name: "bad name!", SafetyFactor: 2, Shards: 100}); err == nil ||
		!strings.Contains(err.Error(), "room name") || !strings.Contains(err.Error(), "safety_factor") ||
		!strings.Contains(err.Error(), "shards") {
		t.Fatalf("invalid config: got %v, want all problems reported", err)
	}
	rc, err := m.Upsert(t.Context(), waitroom.RoomConfig{Name: "ok"})
	if err != nil || rc.MaxWait != 20*time.Minute || rc.VIPBias[3] != time.Hour || rc.VIPShareCap != 0.3 ||
		rc.Smoothing != 15*time.Second || rc.Grace != 2*time.Minute || rc.Shards != 1 {
		t.Fatalf("defaults: got %+v, %v", rc, err)
	}
	if _, err := m.Upsert(t.Context(), waitroom.RoomConfig{Name: "ok", Shards: 4}); !errors.Is(err, waitroom.ErrShardsImmutable) {
		t.Fatalf("changing shards: got %v, want ErrShardsImmutable", err)
	}
	if _, err := m.Upsert(t.Context(), waitroom.RoomConfig{Name: "ok", MaxActive: 7, State: waitroom.StateClosed}); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	if tk, err := m.Join(t.Context(), "ok", "u", 0, rec.deliver); err != nil || tk != nil ||
		rec.last().Reject != waitroom.RejectRoomClosed {
		t.Fatalf("closed room: got %v %v %+v, want rejected room_closed", tk, err, rec.last())
	}
	if _, err := m.Join(t.Context(), "nope", "u", 0, rec.deliver); !errors.Is(err, waitroom.ErrUnknownRoom) {
		t.Fatalf("unknown room: got %v", err)
	}
	if err := m.Delete(t.Context(), "ok"); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Config("ok"); ok {
		t.Fatalf("room still configured after Delete")
	}
}

// TestAdmitQuotaDefault: a room that leaves VIPAdmitShare zero follows the
// node's default quota, read at every step (a reload takes effect at once),
// and a room's own negative share turns it off.
func TestAdmitQuotaDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var share atomic.Value
		share.Store(0.5)
		m, err := waitroom.New(waitroom.Config{AdmitQuota: func() float64 { return share.Load().(float64) }})
		if err != nil {
			t.Fatal(err)
		}
		for _, rc := range []waitroom.RoomConfig{
			{Name: "q", MaxActive: 10, AdmitRate: 1, Smoothing: -1},
			{Name: "off", MaxActive: 10, AdmitRate: 1, Smoothing: -1, VIPAdmitShare: -1},
		} {
			if _, err := m.Upsert(t.Context(), rc); err != nil {
				t.Fatal(err)
			}
		}
		granted := func(u *recorder) bool { return u.last().Kind == waitroom.UpdateGranted }
		// v1 and v2 rank ahead of n; at a VIP share of 1/2, n goes second
		// (n came first: the quota only puts a normal user who was there
		// before them in a VIP's place). All wait before the first step:
		// one admitted with nobody of the other class waiting would not
		// count.
		_, n := join(t, m, "q", "n", 0)
		_, v1 := join(t, m, "q", "v1", 3)
		_, v2 := join(t, m, "q", "v2", 3)
		_, on := join(t, m, "off", "n", 0)
		_, ov1 := join(t, m, "off", "v1", 3)
		_, ov2 := join(t, m, "off", "v2", 3)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if !granted(v1) || !granted(n) || granted(v2) {
			t.Fatalf("share 1/2: granted v1 %v, n %v, v2 %v; want v1 and n", granted(v1), granted(n), granted(v2))
		}
		if !granted(ov1) || !granted(ov2) || granted(on) {
			t.Fatalf("quota off: granted v1 %v, v2 %v, n %v; want v1 and v2", granted(ov1), granted(ov2), granted(on))
		}
		// A reload to 0 (no default) ends the quota for "q" at the next step.
		share.Store(0.0)
		_, v3 := join(t, m, "q", "v3", 1)
		_, n2 := join(t, m, "q", "n2", 0)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !granted(v2) || !granted(v3) || granted(n2) {
			t.Fatalf("after reload: granted v2 %v, v3 %v, n2 %v; want v2 and v3", granted(v2), granted(v3), granted(n2))
		}
	})
}

// TestRestartReleasesStaleHolds: a node restarted under the same name
// (within NodeTimeout, so no sweep) releases the holds its previous life
// left: a visitor held by it and by another node is no longer pinned when
// the other node disconnects it (review finding 2).
func TestRestartReleasesStaleHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := waitroom.NewMemory(waitroom.MemoryConfig{})
		rc := waitroom.RoomConfig{Name: "r", MaxActive: 1, AdmitRate: 10, AccessTokenTTL: time.Minute, Grace: time.Minute}
		c := rc.WithDefaults()
		// The previous life of n1 entered "first" (admitted) and "u"; so did n2.
		for _, e := range []struct{ uid, node string }{{"first", "n1"}, {"u", "n1"}, {"u", "n2"}} {
			if _, err := mem.Enter(t.Context(), &c, waitroom.EnterRequest{UID: e.uid, Node: e.node}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := mem.Admit(t.Context(), &c, waitroom.AdmitRequest{Max: 1}); err != nil {
			t.Fatal(err)
		}
		signer, err := roomtoken.NewHS256(testSecret)
		if err != nil {
			t.Fatal(err)
		}
		ends := &endLog{}
		m, err := waitroom.New(waitroom.Config{Signer: signer, Backend: mem, Node: "n1", Observers: []waitroom.Observer{ends}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Upsert(t.Context(), rc); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			m.Run(ctx)
			close(done)
		}()
		defer func() {
			cancel()
			<-done
		}()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got, _ := mem.Holds(t.Context(), &c, "n1"); len(got) != 0 {
			t.Fatalf("holds of n1 after its restart: %v, want none", got)
		}
		if es := ends.list(); len(es) != 1 || es[0].UID != "first" || es[0].Reason != waitroom.EndDisconnect {
			t.Fatalf("session ends: %+v, want first's (disconnect)", es)
		}
		d, err := mem.Disconnect(t.Context(), &c, "u", "n2")
		if err != nil {
			t.Fatal(err)
		}
		if d.Held {
			t.Fatal("n2's disconnect of u: still held by n1's previous life")
		}
	})
}
