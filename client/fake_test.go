package client

import (
	"bytes"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// fakeServer speaks protocol v1 over real sockets with an in-memory store:
// enough of fanfared for the SDK's tests, with hooks to misbehave.
type fakeServer struct {
	t     *testing.T
	srv   *httptest.Server
	token string

	mu        sync.Mutex
	groups    map[int64]*fakeGroup
	conns     map[*fakeConn]bool
	dials     int
	pulls     []pullRec
	httpPulls int
	syncs     int
	reads     []wire.Read
	sendIDs   []string
	hello     wire.Hello
	refuse    int           // answer upgrades with this status when non-zero
	silent    bool          // do not answer pings
	autoPush  bool          // push every stored message to every connection
	pushLoss  int           // with autoPush, drop one push in pushLoss (0 = none)
	pushDup   int           // with autoPush, duplicate one push in pushDup
	pageBytes int           // byte budget of a pull answer, as fanfared's -page-bytes (0 = none)
	syncPage  int           // groups per sync answer, as fanfared's -sync-page (0 = all)
	syncStuck bool          // with syncPage, answer next_after = after_gid past the first page (a cursor that does not move)
	syncGate  chan struct{} // when set before dialing, sync answers wait for it to be closed
	syncCut   int           // close the connection under this many sync requests, then answer
	sync503   int           // answer this many sync requests 503 with retry_after_ms 10, then answer
	rng       *rand.Rand
	onSend    func(fc *fakeConn, f wire.ClientFrame) bool
	onPull    func(fc *fakeConn, f wire.ClientFrame) // after the page is read, before it is sent
	roomFrame [][]byte                               // frames sent on a room socket after upgrade
	changed   chan struct{}
}

type fakeGroup struct {
	msgs    []wire.Msg // msgs[i].Seq == i+1
	ids     map[string]int64
	joinSeq int64
}

type pullRec struct{ from, to int64 }

type fakeConn struct {
	nc  net.Conn
	wmu sync.Mutex
}

func newFake(t *testing.T) *fakeServer {
	t.Helper()
	f := &fakeServer{
		t:       t,
		token:   "tok-alice",
		groups:  map[int64]*fakeGroup{},
		conns:   map[*fakeConn]bool{},
		hello:   wire.Hello{UID: "alice", Node: "fake", HeartbeatS: 30, MaxMessageBytes: 64 << 10},
		changed: make(chan struct{}, 1),
		rng:     rand.New(rand.NewPCG(1, 2)),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", f.serveWS)
	mux.HandleFunc("/rooms/", f.serveRoom)
	mux.HandleFunc("GET /v1/sync", f.serveSync)
	mux.HandleFunc("GET /v1/groups/{gid}/messages", f.serveMessages)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		f.dropAll()
		f.srv.Close()
	})
	return f
}

func (f *fakeServer) wsURL() string   { return "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/ws" }
func (f *fakeServer) httpURL() string { return f.srv.URL }

// config returns a Config for the fake with short timings.
func (f *fakeServer) config() Config {
	return Config{
		URL:              f.wsURL(),
		Token:            "tok-alice",
		DialTimeout:      2 * time.Second,
		HandshakeTimeout: 2 * time.Second,
		SendTimeout:      2 * time.Second,
		BackoffMin:       10 * time.Millisecond,
		BackoffMax:       50 * time.Millisecond,
		GapWait:          20 * time.Millisecond,
	}
}

func (f *fakeServer) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// waitFor polls cond (under f.mu) until true or the deadline.
func (f *fakeServer) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		ok := cond()
		f.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		select {
		case <-f.changed:
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (f *fakeServer) group(gid int64) *fakeGroup {
	g := f.groups[gid]
	if g == nil {
		g = &fakeGroup{ids: map[string]int64{}, joinSeq: 1}
		f.groups[gid] = g
	}
	return g
}

// store creates gid if needed and appends n messages without pushing them.
func (f *fakeServer) store(gid int64, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.group(gid)
	for range n {
		f.appendLocked(gid, "bob", "", json.RawMessage(`{"n":1}`))
	}
}

func (f *fakeServer) appendLocked(gid int64, from, id string, body json.RawMessage) (wire.Msg, bool) {
	g := f.group(gid)
	if id != "" {
		if seq, ok := g.ids[id]; ok {
			return g.msgs[seq-1], true
		}
	}
	seq := int64(len(g.msgs) + 1)
	m := wire.Msg{GID: gid, Seq: seq, From: from, TS: time.Now().UnixMilli(), Kind: wire.KindText, Body: bytes.Clone(body)}
	g.msgs = append(g.msgs, m)
	if id != "" {
		g.ids[id] = seq
	}
	return m, false
}

func (f *fakeServer) msg(gid, seq int64) wire.Msg {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.groups[gid].msgs[seq-1]
}

// pushSeqs pushes stored messages of gid, one msg frame each.
func (f *fakeServer) pushSeqs(gid int64, seqs ...int64) {
	for _, s := range seqs {
		m := f.msg(gid, s)
		f.broadcast(wire.AppendMsg(nil, &m))
	}
}

func (f *fakeServer) broadcast(frame []byte) {
	f.mu.Lock()
	conns := make([]*fakeConn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	for _, c := range conns {
		c.write(frame)
	}
}

func (f *fakeServer) dropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.nc.Close()
	}
}

func (f *fakeServer) waitConns(n int) {
	f.t.Helper()
	f.waitFor(strconv.Itoa(n)+" connections", func() bool { return len(f.conns) == n })
}

func (f *fakeServer) pullLog() []pullRec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]pullRec(nil), f.pulls...)
}

func (c *fakeConn) write(frame []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = wsutil.WriteServerText(c.nc, frame)
}

func (f *fakeServer) authorized(r *http.Request) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return r.Header.Get("Authorization") == "Bearer "+f.token
}

func (f *fakeServer) serveWS(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	refuse := f.refuse
	f.mu.Unlock()
	switch {
	case refuse != 0:
		http.Error(w, "refused", refuse)
		return
	case !f.authorized(r):
		http.Error(w, "bad token", http.StatusUnauthorized)
		return
	}
	nc, _, _, err := ws.UpgradeHTTP(r, w)
	if err != nil {
		return
	}
	fc := &fakeConn{nc: nc}
	f.mu.Lock()
	f.conns[fc] = true
	f.dials++
	hello := f.hello
	f.mu.Unlock()
	f.notify()
	defer func() {
		nc.Close()
		f.mu.Lock()
		delete(f.conns, fc)
		f.mu.Unlock()
		f.notify()
	}()
	fc.write(wire.AppendHello(nil, &hello))
	for {
		data, op, err := wsutil.ReadClientData(nc)
		if err != nil {
			return
		}
		if op != ws.OpText {
			continue
		}
		cf, err := wire.DecodeClient(data)
		if err != nil {
			fc.write(wire.AppendError(nil, &wire.Error{Code: wire.CodeBadRequest, Message: err.Error()}))
			continue
		}
		f.handle(fc, cf)
	}
}

func (f *fakeServer) handle(fc *fakeConn, cf wire.ClientFrame) {
	switch cf.Type {
	case wire.TypePing:
		f.mu.Lock()
		silent := f.silent
		f.mu.Unlock()
		if !silent {
			fc.write(wire.AppendPong(nil, &wire.Pong{ID: cf.ID}))
		}
	case wire.TypeRead:
		f.mu.Lock()
		f.reads = append(f.reads, wire.Read{GID: cf.GID, Seq: cf.Seq})
		f.mu.Unlock()
		f.notify()
	case wire.TypeSend:
		f.mu.Lock()
		f.sendIDs = append(f.sendIDs, cf.ID)
		hook := f.onSend
		f.mu.Unlock()
		f.notify()
		if hook != nil && hook(fc, cf) {
			return
		}
		f.ackSend(fc, cf)
	case wire.TypePull:
		f.mu.Lock()
		f.pulls = append(f.pulls, pullRec{cf.FromSeq, cf.ToSeq})
		msgs, last, ok := f.rangeLocked(cf.GID, cf.FromSeq, cf.ToSeq)
		hook, budget := f.onPull, f.pageBytes
		f.mu.Unlock()
		f.notify()
		if hook != nil {
			hook(fc, cf)
		}
		if !ok {
			fc.write(wire.AppendError(nil, &wire.Error{ID: cf.ID, Code: wire.CodeForbidden, Message: "not a member"}))
			return
		}
		b, _ := wire.AppendMessagesWithin(nil, &wire.Messages{ID: cf.ID, GID: cf.GID, Messages: msgs, LastSeq: last}, budget)
		fc.write(b)
	}
}

// ackSend stores a send (idempotently) and acks it; with autoPush the new
// message is pushed to every connection.
func (f *fakeServer) ackSend(fc *fakeConn, cf wire.ClientFrame) {
	f.mu.Lock()
	m, dup := f.appendLocked(cf.GID, f.hello.UID, cf.ID, cf.Body)
	push := 0
	if f.autoPush && !dup {
		push = 1
		if f.pushLoss > 0 && f.rng.IntN(f.pushLoss) == 0 {
			push = 0
		} else if f.pushDup > 0 && f.rng.IntN(f.pushDup) == 0 {
			push = 2
		}
	}
	f.mu.Unlock()
	fc.write(wire.AppendAck(nil, &wire.Ack{ID: cf.ID, GID: cf.GID, Seq: m.Seq, TS: m.TS}))
	for range push {
		f.broadcast(wire.AppendMsg(nil, &m))
	}
}

// rangeLocked is the store's range read: from raised to join_seq, to
// lowered to last_seq, at most 200 from from.
func (f *fakeServer) rangeLocked(gid, from, to int64) ([]wire.Msg, int64, bool) {
	g := f.groups[gid]
	if g == nil {
		return nil, 0, false
	}
	last := int64(len(g.msgs))
	from = max(from, g.joinSeq)
	if to == 0 || to > last {
		to = last
	}
	var out []wire.Msg
	for s := from; s <= to && len(out) < pageSize; s++ {
		out = append(out, g.msgs[s-1])
	}
	return out, last, true
}

func (f *fakeServer) serveSync(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		http.Error(w, `{"error":{"code":"unauthorized","message":"bad token"}}`, http.StatusUnauthorized)
		return
	}
	f.mu.Lock()
	cut, busy := f.syncCut > 0, f.syncCut == 0 && f.sync503 > 0
	if cut {
		f.syncCut--
	} else if busy {
		f.sync503--
	}
	f.mu.Unlock()
	if cut { // the request was read: the client must not take this for "nothing written"
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	if busy {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"unavailable","message":"busy","retry_after_ms":10}}`))
		return
	}
	if f.syncGate != nil {
		select {
		case <-f.syncGate:
		case <-r.Context().Done():
			return
		}
	}
	after, _ := strconv.ParseInt(r.URL.Query().Get("after_gid"), 10, 64)
	f.mu.Lock()
	f.syncs++
	var resp wire.SyncResponse
	for _, gid := range slices.Sorted(maps.Keys(f.groups)) {
		if gid <= after {
			continue
		}
		if f.syncPage > 0 && len(resp.Groups) == f.syncPage {
			resp.NextAfter = resp.Groups[len(resp.Groups)-1].GID
			if f.syncStuck && after > 0 {
				resp.NextAfter = after
			}
			break
		}
		resp.Groups = append(resp.Groups, wire.SyncGroup{GID: gid, LastSeq: int64(len(f.groups[gid].msgs))})
	}
	f.mu.Unlock()
	f.notify()
	_ = json.NewEncoder(w).Encode(resp)
}

func (f *fakeServer) serveMessages(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		http.Error(w, `{"error":{"code":"unauthorized","message":"bad token"}}`, http.StatusUnauthorized)
		return
	}
	gid, _ := strconv.ParseInt(r.PathValue("gid"), 10, 64)
	from, _ := strconv.ParseInt(r.URL.Query().Get("from_seq"), 10, 64)
	to, _ := strconv.ParseInt(r.URL.Query().Get("to_seq"), 10, 64)
	f.mu.Lock()
	f.httpPulls++
	msgs, last, ok := f.rangeLocked(gid, from, to)
	budget := f.pageBytes
	f.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write(wire.AppendErrorResponse(nil, &wire.ErrorBody{Code: wire.CodeForbidden, Message: "not a member"}))
		return
	}
	b, _ := wire.AppendMessagesPageWithin(nil, &wire.MessagesPage{GID: gid, Messages: msgs, LastSeq: last}, budget)
	_, _ = w.Write(b)
}

func (f *fakeServer) serveRoom(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(r) {
		http.Error(w, "bad token", http.StatusUnauthorized)
		return
	}
	nc, _, _, err := ws.UpgradeHTTP(r, w)
	if err != nil {
		return
	}
	defer nc.Close()
	fc := &fakeConn{nc: nc}
	f.mu.Lock()
	frames := f.roomFrame
	f.mu.Unlock()
	for _, fr := range frames {
		fc.write(fr)
	}
	for {
		if _, _, err := wsutil.ReadClientData(nc); err != nil {
			return
		}
	}
}

// checkLeaks fails t if a goroutine of the SDK outlives the test. Register
// it first so it runs after every other cleanup.
func checkLeaks(t *testing.T) {
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for {
			buf := make([]byte, 1<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			var leaked []string
			for _, g := range strings.Split(stacks, "\n\n") {
				if strings.Contains(g, "client.(*Conn)") || strings.Contains(g, "client.(*Room)") ||
					strings.Contains(g, "client.(*wsConn)") {
					leaked = append(leaked, g)
				}
			}
			if len(leaked) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%d goroutines leaked:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
