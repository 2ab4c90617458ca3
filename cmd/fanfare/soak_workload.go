package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// The soak's drivers: each runs at its rate until the deadline and
// records what it did in the ledger.

// userState is where a user is.
type userState uint8

const (
	userNew    userState = iota // created, not connected yet
	userOnline                  // a client.Conn is open
	userAway                    // closed for a while by churn; comes back
	userGone                    // left for good: offline at the end, not checked for completeness
)

// soakUser is one user: a client.Conn at a time, its cursors carried
// across reconnects like an app that persists Conn.Cursors.
type soakUser struct {
	uid  string
	lvl  int
	view *userView

	mu       sync.Mutex
	conn     *client.Conn
	cursors  map[int64]int64
	groups   map[int64]bool // current memberships
	state    userState
	busy     bool // a driver owns the user (churn, membership change)
	inflight int  // requests on conn in flight (churn waits for none)
}

func (s *soak) newUser(uid string, lvl int) *soakUser {
	u := &soakUser{uid: uid, lvl: lvl, view: s.led.user(uid), groups: map[int64]bool{}, cursors: map[int64]int64{}}
	s.mu.Lock()
	s.users[uid] = u
	s.all = append(s.all, u)
	s.mu.Unlock()
	return u
}

// dialPatience is how long dial keeps retrying a refused connection.
const dialPatience = 3 * time.Minute

// dial connects u to nd with its cursors, retrying a refused dial.
func (s *soak) dial(ctx context.Context, u *soakUser, nd *soakNode) error {
	tok, err := s.signer.Sign(u.uid, u.lvl, 48*time.Hour)
	if err != nil {
		return err
	}
	u.mu.Lock()
	cursors := maps.Clone(u.cursors)
	u.mu.Unlock()
	view := u.view
	url := nd.ws + "/ws"
	if u != s.auditor && mrand.N(4) == 0 {
		url = "ws://" + nd.proxy.addr() + "/ws"
	}
	cfg := client.Config{
		URL: url, HTTPURL: nd.http, Token: tok, Cursors: cursors,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 2 * time.Second,
		PollInterval: 3 * time.Second, ReadBufferSize: 2048, MaxRetries: 20, SendTimeout: 15 * time.Second,
		OnMessage: func(m client.Message) {
			// One delivery in 50 has its body checked against the store.
			sample := mrand.N(50) == 0
			id := ""
			if sample {
				id = bodyID(m.Body)
			}
			view.deliver(m.GID, m.Seq, id, sample)
		},
		OnEvent: func(ev client.Event) {
			switch ev.Kind {
			case client.EventSkipped:
				s.led.count("client: skipped ranges", 1)
			case client.EventGroupLost:
				s.led.count("client: groups lost (removed)", 1)
				s.led.note(u.uid, ev.GID, time.Since(s.start).Seconds(), fmt.Sprintf("group_lost (%v)", ev.Err))
			case client.EventResync:
				s.led.count("client: resyncs", 1)
				s.led.note(u.uid, ev.GID, time.Since(s.start).Seconds(), fmt.Sprintf("resync to %d", ev.LastSeq))
			case client.EventDegraded:
				s.led.count("client: degraded notices", 1)
			case client.EventDisconnected:
				s.led.count("client: disconnects", 1)
			}
		},
	}
	// A node whose level is 3 or 4 (forced, or automatic: a slow store)
	// refuses new connections with 429 or 503 by design; an app keeps
	// retrying with backoff, and so does the soak, for up to 3 minutes.
	var c *client.Conn
	deadline := time.Now().Add(dialPatience)
	for attempt := 0; ; attempt++ {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err = client.Dial(dctx, cfg)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		var he *client.HandshakeError
		if errors.As(err, &he) && (he.Status == http.StatusTooManyRequests || he.Status == http.StatusServiceUnavailable) {
			s.led.count("dials refused by a node at L3/L4 (retried)", 1)
		} else {
			s.led.count("dial retries (other errors)", 1)
		}
		time.Sleep(min(300*time.Millisecond<<min(attempt, 5), 5*time.Second))
	}
	u.mu.Lock()
	u.conn, u.state = c, userOnline
	u.mu.Unlock()
	return nil
}

// closeConn closes u's Conn and keeps its cursors.
func (s *soak) closeConn(u *soakUser, state userState) {
	u.mu.Lock()
	c := u.conn
	u.conn, u.state = nil, state
	u.mu.Unlock()
	if c == nil {
		return
	}
	c.Close()
	st := c.Stats()
	s.led.count("client: delivered", int64(st.Delivered))
	s.led.count("client: delivered by pull", int64(st.Pulled))
	s.led.count("client: gaps", int64(st.Gaps))
	s.led.count("client: reconnects", int64(st.Reconnects))
	cur := c.Cursors()
	u.mu.Lock()
	for gid, seq := range cur {
		u.cursors[gid] = max(u.cursors[gid], seq)
	}
	u.mu.Unlock()
}

// pick returns a random online user that no driver owns and that ok
// accepts (called with u.mu held), with f applied under u.mu; nil when
// none is found quickly.
func (s *soak) pick(ok func(u *soakUser) bool, f func(u *soakUser)) *soakUser {
	s.mu.Lock()
	all := s.all
	s.mu.Unlock()
	for range 50 {
		u := all[mrand.N(len(all))]
		if u == s.auditor {
			continue
		}
		u.mu.Lock()
		if u.state == userOnline && !u.busy && u.conn != nil && ok(u) {
			f(u)
			u.mu.Unlock()
			return u
		}
		u.mu.Unlock()
	}
	return nil
}

// groupOf returns a random current group of u (u.mu held), large or small
// as asked; when u has none of that kind, 0 if strict, else another.
func (s *soak) groupOf(u *soakUser, large, strict bool) int64 {
	var want, other []int64
	for gid := range u.groups {
		if s.isLarge(gid) == large {
			want = append(want, gid)
		} else {
			other = append(other, gid)
		}
	}
	if len(want) == 0 && !strict {
		want = other
	}
	if len(want) == 0 {
		return 0
	}
	slices.Sort(want)
	return want[mrand.N(len(want))]
}

func (s *soak) isLarge(gid int64) bool { return slices.Contains(s.large, gid) }

// release ends a request on u's conn.
func (u *soakUser) release() {
	u.mu.Lock()
	u.inflight--
	u.mu.Unlock()
}

// padding makes bodies ~200 bytes.
var padding = strings.Repeat("x", 160)

// sendOne sends one message from a random member, over the socket or HTTP.
func (s *soak) sendOne(ctx context.Context) {
	large := len(s.large) > 0 && mrand.Float64() < s.f.largeShare
	var gid int64
	var c *client.Conn
	u := s.pick(func(u *soakUser) bool {
		gid = s.groupOf(u, large, true)
		return gid != 0
	}, func(u *soakUser) { u.inflight++; c = u.conn })
	if u == nil {
		s.led.count("sends skipped (no sender)", 1)
		return
	}
	defer u.release()
	id := s.newSendID(u.uid)
	body, _ := json.Marshal(soakBody{ID: id, P: padding})
	viaHTTP := mrand.Float64() < s.f.httpPc
	s.led.sending(gid, id, u.uid, viaHTTP)
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var seq int64
	var err error
	if viaHTTP {
		seq, err = s.httpSend(sctx, u, gid, id, body)
		s.led.count("sends over HTTP", 1)
	} else {
		var ack client.Ack
		ack, err = c.Send(sctx, gid, json.RawMessage(body), client.WithID(id))
		seq = ack.Seq
		s.led.count("sends over the socket", 1)
	}
	if err != nil {
		if m := s.led.member(gid, u.uid); m != nil && m.removing {
			err = fmt.Errorf("removed meanwhile: %w", err)
			s.led.count("sends refused (sender removed meanwhile)", 1)
		} else {
			s.fail("send %s to group %d: %v", id, gid, err)
		}
	}
	s.led.sent(gid, id, seq, err)
}

// httpSend sends over POST /v1/groups/{gid}/messages with u's token on a
// random node, retrying 429 and 503 (Retry-After) and network errors with
// the same id, like an app would.
func (s *soak) httpSend(ctx context.Context, u *soakUser, gid int64, id string, body []byte) (int64, error) {
	tok, err := s.signer.Sign(u.uid, u.lvl, time.Hour)
	if err != nil {
		return 0, err
	}
	req, _ := json.Marshal(wire.SendRequest{ID: id, Body: body})
	var lastErr error
	for attempt := range 12 {
		nd := s.node()
		r, _ := http.NewRequestWithContext(ctx, http.MethodPost, nd.http+"/v1/groups/"+strconv.FormatInt(gid, 10)+"/messages", bytes.NewReader(req))
		r.Header.Set("Authorization", "Bearer "+tok)
		r.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(r)
		wait := time.Duration(attempt+1) * 200 * time.Millisecond
		if err != nil {
			if ctx.Err() != nil {
				return 0, err
			}
			lastErr = err
		} else {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				var sr wire.SendResponse
				if err := json.Unmarshal(b, &sr); err != nil || sr.Seq <= 0 {
					return 0, fmt.Errorf("POST messages: unreadable answer %q", b)
				}
				return sr.Seq, nil
			case http.StatusTooManyRequests, http.StatusServiceUnavailable:
				lastErr = fmt.Errorf("POST messages: %s: %s", resp.Status, bytes.TrimSpace(b))
				if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra > 0 {
					wait = time.Duration(ra) * time.Second
				}
				s.led.count("HTTP send retries ("+strconv.Itoa(resp.StatusCode)+")", 1)
			default:
				return 0, fmt.Errorf("POST messages: %s: %s", resp.Status, bytes.TrimSpace(b))
			}
		}
		select {
		case <-time.After(min(wait, 10*time.Second)):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return 0, lastErr
}

// churnOne closes a random user's Conn; it comes back after 0.2-3 s on a
// random node with its cursors, the way an app restarts.
func (s *soak) churnOne(ctx context.Context, ops *sync.WaitGroup) {
	if mrand.N(2) == 0 {
		if s.node().proxy.cutOne() {
			s.led.count("network cuts (socket reset)", 1)
		}
		return
	}
	u := s.pick(func(u *soakUser) bool { return u.inflight == 0 }, func(u *soakUser) { u.busy = true })
	if u == nil {
		return
	}
	ops.Go(func() {
		s.closeConn(u, userAway)
		time.Sleep(200*time.Millisecond + mrand.N(2800*time.Millisecond))
		if err := s.dial(ctx, u, s.node()); err != nil {
			s.fail("churn: %v", err)
		}
		s.led.count("churn reconnects", 1)
		u.mu.Lock()
		u.busy = false
		u.mu.Unlock()
	})
}

// membershipOne does membership change kind k: 0 a new user joins a group
// and connects, 1 an online user joins another small group, 2 a member is
// removed, 3 an online user leaves for good. 0 and 3 balance each other,
// and so do 1 and 2: the population stays level.
func (s *soak) membershipOne(ctx context.Context, k int) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	switch k {
	case 0:
		uid := fmt.Sprintf("soak-j%06d", s.nextID.Add(1))
		u := s.newUser(uid, 0)
		gid := s.small[mrand.N(len(s.small))]
		if len(s.large) > 0 && mrand.N(5) == 0 {
			gid = s.large[mrand.N(len(s.large))]
		}
		joins, err := s.addMembers(ctx, s.node(), gid, []string{uid})
		if err != nil {
			s.fail("join %s to %d: %v", uid, gid, err)
			return
		}
		s.led.joined(gid, uid, joins[uid])
		s.led.note(uid, gid, time.Since(s.start).Seconds(), fmt.Sprintf("new user added at join_seq %d", joins[uid]))
		u.mu.Lock()
		u.groups[gid] = true
		if mrand.N(2) == 0 {
			// Half start from the join (as an app told of the join would);
			// the others learn of the group from sync.
			u.cursors[gid] = joins[uid] - 1
		}
		u.mu.Unlock()
		if err := s.dial(ctx, u, s.node()); err != nil {
			s.fail("new user: %v", err)
			return
		}
		s.led.count("joins (new user)", 1)
	case 1:
		var gid int64
		var c *client.Conn
		u := s.pick(func(u *soakUser) bool {
			gid = s.small[mrand.N(len(s.small))]
			return !u.groups[gid] && s.led.member(gid, u.uid) == nil
		}, func(u *soakUser) { u.busy = true; c = u.conn })
		if u == nil {
			return
		}
		defer func() { u.mu.Lock(); u.busy = false; u.mu.Unlock() }()
		joins, err := s.addMembers(ctx, s.node(), gid, []string{u.uid})
		if err != nil {
			s.fail("join %s to %d: %v", u.uid, gid, err)
			return
		}
		s.led.joined(gid, u.uid, joins[u.uid])
		// What an app does when told it joined: deliver from join_seq.
		c.Track(gid, joins[u.uid]-1)
		s.led.note(u.uid, gid, time.Since(s.start).Seconds(), fmt.Sprintf("added online at join_seq %d, tracked", joins[u.uid]))
		u.mu.Lock()
		u.groups[gid] = true
		u.mu.Unlock()
		s.led.count("joins (online user)", 1)
	case 2:
		gid := s.small[mrand.N(len(s.small))]
		if len(s.large) > 0 && mrand.N(5) == 0 {
			gid = s.large[mrand.N(len(s.large))]
		}
		uid := s.removable(gid)
		if uid == "" {
			return
		}
		s.led.removing(gid, uid)
		path := "/v1/groups/" + strconv.FormatInt(gid, 10) + "/members/" + uid
		if err := s.admin(ctx, http.MethodDelete, path, nil, nil); err != nil {
			s.fail("remove %s from %d: %v", uid, gid, err)
			return
		}
		bound, err := s.lastSeq(ctx, gid)
		if err != nil {
			s.fail("last_seq of %d after a removal: %v", gid, err)
			bound = 1 << 62 // unknown: do not judge this removal
		}
		s.led.removed(gid, uid, bound)
		s.led.note(uid, gid, time.Since(s.start).Seconds(), fmt.Sprintf("removed (last_seq %d)", bound))
		s.mu.Lock()
		u := s.users[uid]
		s.mu.Unlock()
		u.mu.Lock()
		delete(u.groups, gid)
		u.mu.Unlock()
		s.led.count("removals", 1)
	case 3:
		u := s.pick(func(u *soakUser) bool { return u.inflight == 0 }, func(u *soakUser) { u.busy = true })
		if u == nil {
			return
		}
		s.closeConn(u, userGone)
		s.led.count("users gone for good", 1)
	}
}

// removable returns a random current member of gid other than the
// auditor, or "" when the group has too few left.
func (s *soak) removable(gid int64) string {
	s.led.mu.Lock()
	defer s.led.mu.Unlock()
	var cands []string
	for uid, m := range s.led.groups[gid].members {
		if !m.removing && uid != s.auditor.uid {
			cands = append(cands, uid)
		}
	}
	if len(cands) < 3 {
		return ""
	}
	slices.Sort(cands)
	return cands[mrand.N(len(cands))]
}

// lastSeq reads gid's last_seq as the auditor (a member of every group
// from seq 1).
func (s *soak) lastSeq(ctx context.Context, gid int64) (int64, error) {
	s.auditor.mu.Lock()
	c := s.auditor.conn
	s.auditor.mu.Unlock()
	p, err := c.Pull(ctx, gid, 1<<50, 0)
	return p.LastSeq, err
}

// readOne pulls, syncs or marks read for a random online user, and checks
// what the server answered.
func (s *soak) readOne(ctx context.Context) {
	var c *client.Conn
	u := s.pick(func(u *soakUser) bool { return len(u.groups) > 0 }, func(u *soakUser) { u.inflight++; c = u.conn })
	if u == nil {
		return
	}
	defer u.release()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	u.mu.Lock()
	gid := s.groupOf(u, mrand.N(4) == 0, false)
	groups := maps.Clone(u.groups)
	u.mu.Unlock()
	u.view.mu.Lock()
	last := u.view.last[gid]
	u.view.mu.Unlock()
	switch r := mrand.N(4); {
	case r < 2:
		m := s.led.member(gid, u.uid)
		if m == nil {
			return
		}
		from := max(m.joinSeq, last-100)
		page, err := c.Pull(ctx, gid, from, 0)
		s.led.count("pulls", 1)
		if err != nil {
			if m := s.led.member(gid, u.uid); m != nil && m.removing {
				return
			}
			s.fail("pull %s group %d from %d: %v", u.uid, gid, from, err)
			return
		}
		for i, msg := range page.Messages {
			want := from + int64(i)
			if msg.Seq != want {
				s.fail("pull %s group %d from %d: message %d has seq %d, want %d (a hole, or a seq below join_seq %d)", u.uid, gid, from, i, msg.Seq, want, m.joinSeq)
				break
			}
		}
		if n := len(page.Messages); n > 0 && page.Messages[n-1].Seq > page.LastSeq {
			s.fail("pull %s group %d: seq %d above last_seq %d", u.uid, gid, page.Messages[n-1].Seq, page.LastSeq)
		}
	case r == 2:
		before := map[int64]int64{}
		u.view.mu.Lock()
		for gid := range groups {
			before[gid] = u.view.last[gid]
		}
		u.view.mu.Unlock()
		sg, err := c.Sync(ctx)
		s.led.count("syncs", 1)
		if err != nil {
			s.fail("sync %s: %v", u.uid, err)
			return
		}
		got := map[int64]wire.SyncGroup{}
		for _, g := range sg {
			got[g.GID] = g
		}
		for gid := range groups {
			g, ok := got[gid]
			m := s.led.member(gid, u.uid)
			if !ok && m != nil && !m.removing {
				s.fail("sync %s: group %d missing", u.uid, gid)
			}
			if seen := before[gid]; ok && g.LastSeq < seen {
				s.fail("sync %s: group %d last_seq %d below the delivered %d", u.uid, gid, g.LastSeq, seen)
			}
		}
	default:
		if last > 0 {
			if err := c.Read(gid, last); err != nil {
				s.fail("read %s group %d: %v", u.uid, gid, err)
			}
			s.led.count("read marks", 1)
		}
	}
}

// degradeSteps are the forced levels, in turn: node-wide and per group,
// every level but node L3/L4 (which refuse new connections: the churn
// would fail by design).
var degradeSteps = []struct {
	scope string
	large bool
	level int
}{
	{wire.ScopeGroup, true, wire.LevelMerge},
	{wire.ScopeNode, false, wire.LevelMerge},
	{wire.ScopeGroup, true, wire.LevelSummary},
	{wire.ScopeGroup, false, wire.LevelWriteOnly},
	{wire.ScopeNode, false, wire.LevelSummary},
	{wire.ScopeGroup, false, wire.LevelReject},
	{wire.ScopeGroup, true, wire.LevelWriteOnly},
	{wire.ScopeGroup, false, wire.LevelSummary},
}

// degradeLoop forces a level every degradeEvery on a random node and
// clears it degradeFor later.
func (s *soak) degradeLoop(wctx, ctx context.Context) {
	t := time.NewTicker(s.f.degradeEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-wctx.Done():
			return
		case <-t.C:
		}
		st := degradeSteps[i%len(degradeSteps)]
		nd := s.node()
		req := map[string]any{"scope": st.scope, "level": st.level, "ttl_s": int(3 * s.f.degradeFor.Seconds())}
		var gid int64
		if st.scope == wire.ScopeGroup {
			if st.large && len(s.large) > 0 {
				gid = s.large[mrand.N(len(s.large))]
			} else {
				gid = s.small[mrand.N(len(s.small))]
			}
			req["gid"] = gid
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := s.adminOn(actx, nd, http.MethodPut, "/admin/v1/degrade", req, nil); err != nil {
			s.fail("force %s level %d on node %d: %v", st.scope, st.level, nd.n, err)
			cancel()
			continue
		}
		s.mu.Lock()
		s.levels = append(s.levels, levelEvent{T: time.Since(s.start).Seconds(), Node: nd.n, Scope: st.scope, GID: gid, Level: st.level, For: s.f.degradeFor.Seconds()})
		s.mu.Unlock()
		s.logf("node %d: %s %d forced to L%d for %v", nd.n, st.scope, gid, st.level, s.f.degradeFor)
		select {
		case <-time.After(s.f.degradeFor):
		case <-wctx.Done():
		}
		delete(req, "level")
		delete(req, "ttl_s")
		if err := s.adminOn(actx, nd, http.MethodPut, "/admin/v1/degrade", req, nil); err != nil {
			s.fail("clear %s level on node %d: %v", st.scope, nd.n, err)
		}
		cancel()
	}
}

// clearLevels clears every forced level on every node.
func (s *soak) clearLevels(ctx context.Context) {
	for _, nd := range s.nodes {
		var st wire.DegradeStatus
		if err := nd.adm.do(ctx, http.MethodGet, "/admin/v1/degrade", nil, &st); err != nil {
			s.fail("GET degrade on node %d: %v", nd.n, err)
			continue
		}
		if st.Node.Forced != nil {
			_ = nd.adm.do(ctx, http.MethodPut, "/admin/v1/degrade", map[string]any{"scope": wire.ScopeNode}, nil)
		}
		for _, g := range st.Groups {
			if g.Forced != nil {
				_ = nd.adm.do(ctx, http.MethodPut, "/admin/v1/degrade", map[string]any{"scope": wire.ScopeGroup, "gid": g.GID}, nil)
			}
		}
	}
}

// roomStats is what the waiting room's entrants saw.
type roomStats struct {
	mu                  sync.Mutex
	surges, entered     int
	granted, stuck      int
	rejected            map[string]int
	waitNormal, waitVIP []float64 // seconds from entering to granted
	vipNotices          int
}

// roomLoop sends a crowd into the waiting room every surgeEvery: the
// normal users first, the VIPs a second later.
func (s *soak) roomLoop(wctx, ctx context.Context, ops *sync.WaitGroup) {
	t := time.NewTicker(s.f.surgeEvery)
	defer t.Stop()
	for {
		select {
		case <-wctx.Done():
			return
		case <-t.C:
		}
		s.room.mu.Lock()
		s.room.surges++
		s.room.mu.Unlock()
		for range s.f.surgeNormal {
			ops.Go(func() { s.enterRoom(ctx, 0) })
		}
		select {
		case <-time.After(time.Second):
		case <-wctx.Done():
		}
		for i := range s.f.surgeVIPs {
			ops.Go(func() { s.enterRoom(ctx, 1+i%3) })
		}
	}
}

// enterRoom is one user in the waiting room: it waits for granted,
// uses its admission briefly and leaves.
func (s *soak) enterRoom(ctx context.Context, lvl int) {
	uid := fmt.Sprintf("soak-r%06d", s.nextID.Add(1))
	tok, err := s.signer.Sign(uid, lvl, time.Hour)
	if err != nil {
		s.fail("room token: %v", err)
		return
	}
	nd := s.node()
	start := time.Now()
	var r *client.Room
	for attempt := 0; ; attempt++ {
		jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		r, err = client.JoinRoom(jctx, client.Config{URL: nd.ws + "/rooms/" + soakRoom + "/ws", Token: tok,
			BackoffMin: 100 * time.Millisecond, BackoffMax: 2 * time.Second})
		cancel()
		// A handshake refused for load (408: it did not finish in time;
		// 429, 503) or a reset connection is tried again, as an app does.
		var he *client.HandshakeError
		if err == nil || ctx.Err() != nil || attempt == 20 || (errors.As(err, &he) && he.Status != http.StatusRequestTimeout &&
			he.Status != http.StatusTooManyRequests && he.Status != http.StatusServiceUnavailable) {
			break
		}
		s.led.count("waiting room: entries retried", 1)
		time.Sleep(min(200*time.Millisecond<<min(attempt, 4), 3*time.Second))
	}
	if err != nil {
		s.fail("enter the waiting room on node %d: %v", nd.n, err)
		return
	}
	defer r.Close()
	s.room.mu.Lock()
	s.room.entered++
	s.room.mu.Unlock()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	var lastQueue *wire.Queue
	for {
		select {
		case f, ok := <-r.Updates():
			if !ok {
				s.fail("waiting room: %s ended without granted or rejected: %v", uid, r.Err())
				return
			}
			switch f := f.(type) {
			case *wire.Queue:
				lastQueue = f
				if f.VIPAheadNotice {
					s.room.mu.Lock()
					s.room.vipNotices++
					s.room.mu.Unlock()
				}
			case *wire.Granted:
				wait := time.Since(start).Seconds()
				s.room.mu.Lock()
				s.room.granted++
				if lvl > 0 {
					s.room.waitVIP = append(s.room.waitVIP, wait)
				} else {
					s.room.waitNormal = append(s.room.waitNormal, wait)
				}
				s.room.mu.Unlock()
				time.Sleep(100*time.Millisecond + mrand.N(300*time.Millisecond))
				return
			case *wire.Rejected:
				s.room.mu.Lock()
				if s.room.rejected == nil {
					s.room.rejected = map[string]int{}
				}
				s.room.rejected[f.Code]++
				s.room.mu.Unlock()
				return
			}
		case <-ctx.Done():
			return
		case <-timeout.C:
			s.room.mu.Lock()
			s.room.stuck++
			s.room.mu.Unlock()
			q, _ := json.Marshal(lastQueue)
			s.fail("waiting room: %s (tier %d, node %d) not admitted after 2 minutes; last queue frame %s", uid, lvl, nd.n, q)
			return
		}
	}
}

// readGroup reads every stored message of gid as the auditor.
func (s *soak) readGroup(ctx context.Context, gid int64) ([]storedMsg, int64, error) {
	s.auditor.mu.Lock()
	c := s.auditor.conn
	s.auditor.mu.Unlock()
	var out []storedMsg
	var last int64
	for from := int64(1); ; {
		page, err := c.Pull(ctx, gid, from, 0)
		if err != nil {
			return nil, 0, fmt.Errorf("reading group %d from %d: %w", gid, from, err)
		}
		last = page.LastSeq
		for _, m := range page.Messages {
			out = append(out, storedMsg{seq: m.Seq, from: m.From, id: bodyID(m.Body)})
		}
		n := len(page.Messages)
		if n == 0 || page.Messages[n-1].Seq >= page.LastSeq {
			break
		}
		from = page.Messages[n-1].Seq + 1
	}
	return out, last, nil
}

// check reads the store, waits for the online clients to complete and
// checks the ledger.
func (s *soak) check(ctx context.Context, res *soakResult) {
	ctx, cancel := context.WithTimeout(ctx, s.f.drain+5*time.Minute)
	defer cancel()
	s.led.mu.Lock()
	gids := slices.Collect(maps.Keys(s.led.groups))
	s.led.mu.Unlock()
	slices.Sort(gids)
	stored := map[int64][]storedMsg{}
	lastSeq := map[int64]int64{}
	for _, gid := range gids {
		msgs, last, err := s.readGroup(ctx, gid)
		if err != nil {
			res.Failures = append(res.Failures, err.Error())
			continue
		}
		stored[gid], lastSeq[gid] = msgs, last
	}
	online := map[string]bool{}
	s.mu.Lock()
	all := append([]*soakUser(nil), s.all...)
	s.mu.Unlock()
	for _, u := range all {
		u.mu.Lock()
		if u.state == userOnline && u.conn != nil {
			select {
			case <-u.conn.Done():
				res.Failures = append(res.Failures, fmt.Sprintf("user %s: the client gave up: %v", u.uid, u.conn.Err()))
			default:
				online[u.uid] = true
			}
		}
		u.mu.Unlock()
	}
	start := time.Now()
	var incomplete []string
	for {
		incomplete = s.led.checkDeliveries(&verdict{}, stored, lastSeq, online, false)
		if len(incomplete) == 0 || time.Since(start) > s.f.drain || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	res.DrainS = time.Since(start).Seconds()
	s.logf("drain: %.1fs, %d (user, group) pairs incomplete", res.DrainS, len(incomplete))
	v := &verdict{}
	s.led.checkStore(v, stored, lastSeq)
	s.led.checkDeliveries(v, stored, lastSeq, online, true)
	res.Ledger = v
	s.logf("ledger: %s", v.summary())
	if v.Failed() {
		res.Failures = append(res.Failures, "ledger: "+v.summary())
	}
}

// transient reports an error worth retrying: a refused or reset
// connection, or an answer that says "later" (429, 503). Keep-alive
// connections the server closed as a request went out show up as EOF.
func transient(err error) bool {
	var se *statusError
	if errors.As(err, &se) {
		return se.status == http.StatusTooManyRequests || se.status == http.StatusServiceUnavailable
	}
	return err != nil && !errors.Is(err, context.Canceled)
}

// admin sends an idempotent admin request to a random node, retrying
// transient failures for up to a minute (each try may go to another node).
// A retried DELETE that finds nothing (404) is taken as done.
func (s *soak) admin(ctx context.Context, method, path string, body, out any) error {
	return s.adminOn(ctx, nil, method, path, body, out)
}

// adminOn is admin on node nd (nil: a random node per try).
func (s *soak) adminOn(ctx context.Context, nd *soakNode, method, path string, body, out any) error {
	deadline := time.Now().Add(time.Minute)
	for attempt := 0; ; attempt++ {
		n := nd
		if n == nil {
			n = s.node()
		}
		err := n.adm.do(ctx, method, path, body, out)
		var se *statusError
		if attempt > 0 && method == http.MethodDelete && errors.As(err, &se) && se.status == http.StatusNotFound {
			return nil
		}
		if err == nil || !transient(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		s.led.count("admin requests retried", 1)
		time.Sleep(min(200*time.Millisecond<<min(attempt, 4), 3*time.Second))
	}
}
