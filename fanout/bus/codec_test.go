package bus

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/store"
)

func testMsgs(gid int64, n, body int) []store.Message {
	out := make([]store.Message, n)
	b := bytes.Repeat([]byte("x"), body)
	for i := range out {
		out[i] = store.Message{
			GID: gid, Seq: int64(1000 + i), Sender: "user-" + strconv.Itoa(i%50), ClientMsgID: "cmid-" + strconv.Itoa(i),
			Kind: store.KindText, Body: append(append([]byte(`"`), b...), '"'), CreatedAt: time.UnixMilli(1_700_000_000_000 + int64(i)),
		}
	}
	return out
}

func TestCodecRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		origin string
		gid    int64
		msgs   []store.Message
	}{
		{"empty", "n", 1, nil},
		{"one", "node-1", 42, testMsgs(42, 1, 10)},
		{"many", "", -7, testMsgs(-7, 300, 100)},
		{"kinds", "n", 1 << 62, []store.Message{
			{Seq: 1, Kind: store.KindAtAll, Body: []byte(`{}`), CreatedAt: time.UnixMilli(0)},
			{Seq: 2, Kind: "custom", Sender: "s", CreatedAt: time.UnixMilli(-5)},
			{Seq: 3, Kind: "", CreatedAt: time.UnixMilli(1 << 50)},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			version := int64(len(tc.msgs)) << 40
			p := AppendBatch(nil, tc.origin, tc.gid, version, tc.msgs)
			var b Batch
			if err := DecodeBatch(&b, p, 0); err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if b.GID != tc.gid || b.Origin != tc.origin || len(b.Msgs) != len(tc.msgs) || b.MemberVersion != version {
				t.Fatalf("got gid %d origin %q %d msgs version %d, want %d %q %d %d",
					b.GID, b.Origin, len(b.Msgs), b.MemberVersion, tc.gid, tc.origin, len(tc.msgs), version)
			}
			for i, w := range tc.msgs {
				g := b.Msgs[i]
				wantKind := w.Kind
				if wantKind == "" {
					wantKind = store.KindText
				}
				if g.GID != tc.gid || g.Seq != w.Seq || g.Sender != w.Sender || g.ClientMsgID != w.ClientMsgID ||
					g.Kind != wantKind || !bytes.Equal(g.Body, w.Body) || g.CreatedAt.UnixMilli() != w.CreatedAt.UnixMilli() {
					t.Errorf("message %d: got %+v, want %+v", i, g, w)
				}
			}
			// recordSize agrees with the encoder.
			size := headerLen(tc.origin, tc.gid)
			for i := range tc.msgs {
				size += recordSize(&tc.msgs[i])
			}
			if size != len(p) {
				t.Errorf("size: got %d from recordSize, want %d encoded", size, len(p))
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good := AppendBatch(nil, "n", 5, 0, testMsgs(5, 3, 4))
	countAt := func(n uint32) []byte {
		p := bytes.Clone(good)
		p[1], p[2], p[3], p[4] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
		return p
	}
	tests := []struct {
		name string
		p    []byte
		max  int
	}{
		{"empty", nil, 0},
		{"version", append([]byte{9}, good[1:]...), 0},
		{"truncated", good[:len(good)-1], 0},
		{"trailing", append(bytes.Clone(good), 0), 0},
		{"count high", countAt(4), 0},
		{"count huge", countAt(1 << 31), 0},
		{"count low", countAt(2), 0},
		{"over max", good, 2},
		{"origin overflow", []byte{1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, 0},
		{"bad kind", func() []byte {
			p := AppendBatch(nil, "n", 5, 0, testMsgs(5, 1, 1))
			p[headerLen("n", 5)+varintLen(1000)+varintLen(1_700_000_000_000)] = 7
			return p
		}(), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			if err := DecodeBatch(&b, tc.p, tc.max); !errors.Is(err, ErrCorrupt) {
				t.Errorf("got %v, want ErrCorrupt", err)
			}
			if len(b.Msgs) != 0 {
				t.Errorf("got %d messages left in dst, want 0", len(b.Msgs))
			}
		})
	}
}

// TestTailCodec: a tail hint decodes into an empty batch with Tail and the
// version set; a malformed one is ErrCorrupt, and it is no membership
// change.
func TestTailCodec(t *testing.T) {
	p := AppendTail(nil, "node-a", 42, 7, 1226)
	b := Batch{Msgs: testMsgs(1, 1, 2)}
	if err := DecodeBatch(&b, p, 0); err != nil {
		t.Fatal(err)
	}
	if b.GID != 42 || b.Origin != "node-a" || b.MemberVersion != 7 || b.Tail != 1226 || len(b.Msgs) != 0 {
		t.Fatalf("got %+v, want gid 42, origin node-a, version 7, tail 1226, no messages", b)
	}
	batch := Batch{Tail: 9}
	if err := DecodeBatch(&batch, AppendBatch(nil, "n", 1, 0, testMsgs(1, 1, 1)), 0); err != nil || batch.Tail != 0 {
		t.Fatalf("a batch decoded into a reused tail batch: tail %d, err %v; want 0, nil", batch.Tail, err)
	}
	withCount := bytes.Clone(p)
	withCount[1] = 1
	for name, q := range map[string][]byte{
		"count":    withCount,
		"seq zero": AppendTail(nil, "n", 1, 0, 0),
		"trailing": append(bytes.Clone(p), 0),
		"no seq":   p[:headerLen("node-a", 42)],
	} {
		var c Batch
		if err := DecodeBatch(&c, q, 0); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
	var mc MemberChange
	if err := DecodeMembers(&mc, p, 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("DecodeMembers of a tail hint: got %v, want ErrCorrupt", err)
	}
}

// TestDecodeZeroAlloc: decoding into a batch with room allocates nothing.
func TestDecodeZeroAlloc(t *testing.T) {
	p := AppendBatch(nil, "node-a", 9, 0, testMsgs(9, 100, 64))
	b := &Batch{Msgs: make([]store.Message, 0, 100)}
	allocs := testing.AllocsPerRun(100, func() {
		if err := DecodeBatch(b, p, 0); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("allocs per decode: got %v, want 0", allocs)
	}
}

// TestPublishZeroAlloc: Publish into a warm queue allocates nothing.
func TestPublishZeroAlloc(t *testing.T) {
	n, err := New(Config{NodeID: "a", Handler: func(*Batch) {}}, nopTransport{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := testMsgs(3, 100, 64)
	var batch []*entry
	cycle := func() {
		if err := n.Publish(3, 0, msgs); err != nil {
			t.Fatal(err)
		}
		batch = n.take(batch[:0])
		n.release(batch)
	}
	cycle()
	if allocs := testing.AllocsPerRun(100, cycle); allocs != 0 {
		t.Errorf("allocs per publish: got %v, want 0", allocs)
	}
}

type nopTransport struct{}

func (nopTransport) Run(ctx context.Context, _ func(int64, []byte)) error {
	<-ctx.Done()
	return nil
}
func (nopTransport) Publish(_ context.Context, ps []Outgoing) (int, error) { return len(ps), nil }
func (nopTransport) Subscribe(context.Context, []int64) error              { return nil }
func (nopTransport) Unsubscribe(context.Context, []int64) error            { return nil }
func (nopTransport) Ping(context.Context) error                            { return nil }

func FuzzDecodeBatch(f *testing.F) {
	f.Add(AppendBatch(nil, "n", 5, 0, testMsgs(5, 3, 4)))
	f.Add(AppendBatch(nil, "", -1, 0, nil))
	f.Add([]byte{1, 1, 0, 0, 0, 0, 2})
	f.Add(AppendTail(nil, "n", 5, 3, 17))
	f.Fuzz(func(t *testing.T, p []byte) {
		var b Batch
		if err := DecodeBatch(&b, p, 0); err != nil {
			return
		}
		// What decodes re-encodes to the same bytes, except for a text
		// kind written as "other" (not produced by the encoder).
		q := AppendBatch(nil, b.Origin, b.GID, b.MemberVersion, b.Msgs)
		if b.Tail > 0 {
			q = AppendTail(nil, b.Origin, b.GID, b.MemberVersion, b.Tail)
		}
		var c Batch
		if err := DecodeBatch(&c, q, 0); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if len(c.Msgs) != len(b.Msgs) || c.GID != b.GID || c.Origin != b.Origin || c.Tail != b.Tail || c.MemberVersion != b.MemberVersion {
			t.Fatalf("re-decode: got %d msgs gid %d tail %d v%d, want %d gid %d tail %d v%d",
				len(c.Msgs), c.GID, c.Tail, c.MemberVersion, len(b.Msgs), b.GID, b.Tail, b.MemberVersion)
		}
	})
}

func TestValidate(t *testing.T) {
	h := func(*Batch) {}
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero with handler", Config{Handler: h}, true},
		{"no handler", Config{}, false},
		{"negative", Config{Handler: h, FlushInterval: -1}, false},
		{"negative int", Config{Handler: h, InboxBatches: -1}, false},
		{"tiny payload", Config{Handler: h, MaxPayloadBytes: 100}, false},
		{"pending below payload", Config{Handler: h, MaxPayloadBytes: 4096, MaxPendingBytes: 2048}, false},
		{"long id", Config{Handler: h, NodeID: string(make([]byte, 300))}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// corruptTransport delivers a payload that does not decode.
type corruptTransport struct{ nopTransport }

func (corruptTransport) Run(ctx context.Context, recv func(int64, []byte)) error {
	good := AppendBatch(nil, "other", 1, 0, testMsgs(1, 2, 2))
	recv(1, good[:len(good)-2])                              // truncated
	recv(2, good)                                            // channel and payload disagree
	recv(1, AppendBatch(nil, "me", 1, 0, testMsgs(1, 1, 1))) // own
	recv(1, good)
	<-ctx.Done()
	return nil
}

func TestRecvChecks(t *testing.T) {
	got := make(chan *Batch, 4)
	n, err := New(Config{NodeID: "me", Handler: func(b *Batch) { got <- b }}, corruptTransport{})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []int64{1, 2} {
		if err := n.Subscribe(g); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	b := <-got
	cancel()
	<-done
	if b.Origin != "other" || len(b.Msgs) != 2 {
		t.Errorf("got batch from %q with %d msgs, want other with 2", b.Origin, len(b.Msgs))
	}
	if s := n.Stats(); s.DecodeErrors != 2 || s.Self != 1 || s.Delivered != 1 {
		t.Errorf("stats: got decode errors %d, self %d, delivered %d; want 2, 1, 1", s.DecodeErrors, s.Self, s.Delivered)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := NewLocal()
	n, err := l.NewNode(Config{NodeID: "a", Handler: func(*Batch) {}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	l.SetDown(true)
	n.up.Store(false)
	_ = n.Publish(1, 0, testMsgs(1, 3, 1))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, lp := range m.GetLabel() {
				name += "/" + lp.GetValue()
			}
			got[name] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"fanfare_bus_dropped_messages_total/unavailable": 3,
		"fanfare_bus_dropped_messages_total/queue_full":  0,
		"fanfare_bus_published_total":                    0,
		"fanfare_bus_up":                                 0,
		"fanfare_bus_subscriptions":                      0,
		"fanfare_bus_ignored_total/self":                 0,
		"fanfare_bus_decode_errors_total":                0,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: got %v (present %v), want %v", k, g, ok, v)
		}
	}
	// A second node on the same registry is refused, not silently merged.
	if _, err := l.NewNode(Config{NodeID: "b", Handler: func(*Batch) {}, Registerer: reg}); err == nil {
		t.Error("second node on one registry: got nil error, want a registration error")
	}
}

func TestMembersCodecRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		origin  string
		gid     int64
		removed bool
		ms      []store.Member
	}{
		{"added", "node-a", 42, false, []store.Member{{UID: "bob", Ordinal: 0, JoinSeq: 1}, {UID: "carol", Ordinal: 1<<32 - 1, JoinSeq: 1 << 60}}},
		{"removed", "", 1 << 62, true, []store.Member{{UID: "bob"}}},
		{"empty", "n", 1, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			version := int64(len(tc.ms))<<50 + 3
			p := AppendMembers(nil, tc.origin, tc.gid, version, tc.removed, tc.ms)
			var c MemberChange
			if err := DecodeMembers(&c, p, 0); err != nil {
				t.Fatalf("DecodeMembers: %v", err)
			}
			if c.Version != version {
				t.Errorf("version: got %d, want %d", c.Version, version)
			}
			if c.GID != tc.gid || c.Origin != tc.origin || c.Removed != tc.removed || len(c.Members) != len(tc.ms) {
				t.Fatalf("got gid %d origin %q removed %v %d members, want %d %q %v %d",
					c.GID, c.Origin, c.Removed, len(c.Members), tc.gid, tc.origin, tc.removed, len(tc.ms))
			}
			for i, w := range tc.ms {
				w.GID = tc.gid
				if g := c.Members[i]; g != w {
					t.Errorf("member %d: got %+v, want %+v", i, g, w)
				}
			}
			size := headerLen(tc.origin, tc.gid) + 1
			for i := range tc.ms {
				size += memberRecordSize(&tc.ms[i], tc.removed)
			}
			if size != len(p) {
				t.Errorf("size: got %d from memberRecordSize, want %d encoded", size, len(p))
			}
			// The two frame kinds never pass for each other.
			var b Batch
			if err := DecodeBatch(&b, p, 0); !errors.Is(err, ErrCorrupt) {
				t.Errorf("DecodeBatch of a membership change: got %v, want ErrCorrupt", err)
			}
		})
	}
	var c MemberChange
	if err := DecodeMembers(&c, AppendBatch(nil, "n", 5, 0, testMsgs(5, 2, 2)), 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("DecodeMembers of a batch: got %v, want ErrCorrupt", err)
	}
}

func TestDecodeMembersRejects(t *testing.T) {
	good := AppendMembers(nil, "n", 5, 0, false, []store.Member{{UID: "bob", Ordinal: 3, JoinSeq: 9}, {UID: "al", Ordinal: 4, JoinSeq: 9}})
	opAt := headerLen("n", 5)
	// One added member whose ordinal is 1<<32.
	bigOrd := AppendMembers(nil, "n", 5, 0, false, nil)
	bigOrd = appendString(bigOrd, "bob")
	bigOrd = binary.AppendUvarint(bigOrd, 1<<32)
	bigOrd = binary.AppendVarint(bigOrd, 1)
	setCount(bigOrd, 1)
	tests := []struct {
		name string
		p    []byte
		max  int
	}{
		{"empty", nil, 0},
		{"header only", good[:opAt], 0},
		{"bad op", func() []byte { p := bytes.Clone(good); p[opAt] = 7; return p }(), 0},
		{"truncated", good[:len(good)-1], 0},
		{"trailing", append(bytes.Clone(good), 0), 0},
		{"count high", func() []byte { p := bytes.Clone(good); setCount(p, 3); return p }(), 0},
		{"count low", func() []byte { p := bytes.Clone(good); setCount(p, 1); return p }(), 0},
		{"over max", good, 1},
		{"ordinal past uint32", bigOrd, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := MemberChange{Members: make([]store.Member, 0, 4)}
			if err := DecodeMembers(&c, tc.p, tc.max); !errors.Is(err, ErrCorrupt) {
				t.Errorf("got %v, want ErrCorrupt", err)
			}
			if len(c.Members) != 0 {
				t.Errorf("got %d members left in dst, want 0", len(c.Members))
			}
		})
	}
}

func FuzzDecodeMembers(f *testing.F) {
	f.Add(AppendMembers(nil, "n", 5, 0, false, []store.Member{{UID: "bob", Ordinal: 3, JoinSeq: 9}}))
	f.Add(AppendMembers(nil, "", -1, 0, true, []store.Member{{UID: "bob"}, {UID: ""}}))
	f.Add([]byte{2, 1, 0, 0, 0, 0, 2, 1, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		var c MemberChange
		if err := DecodeMembers(&c, p, 0); err != nil {
			return
		}
		// What decodes re-encodes to a change that decodes the same
		// (the bytes may differ: a varint may be written longer than
		// needed).
		q := AppendMembers(nil, c.Origin, c.GID, 0, c.Removed, c.Members)
		var d MemberChange
		if err := DecodeMembers(&d, q, 0); err != nil {
			t.Fatalf("re-encoded change does not decode: %v", err)
		}
		if d.GID != c.GID || d.Origin != c.Origin || d.Removed != c.Removed || !slices.Equal(d.Members, c.Members) {
			t.Fatalf("re-decode: got %+v, want %+v", d, c)
		}
	})
}

// membersTransport delivers membership changes on the control channel and
// on a group's channel.
type membersTransport struct{ nopTransport }

func (membersTransport) Run(ctx context.Context, recv func(int64, []byte)) error {
	c := AppendMembers(nil, "other", 3, 0, true, []store.Member{{UID: "bob"}})
	recv(3, c)          // a change on a group's channel
	recv(ControlGID, c) // the one to deliver
	<-ctx.Done()
	return nil
}

func TestRecvMembersChecks(t *testing.T) {
	got := make(chan *MemberChange, 2)
	n, err := New(Config{NodeID: "me", Handler: func(*Batch) {}, Members: func(c *MemberChange) { got <- c }}, membersTransport{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Subscribe(3); err != nil {
		t.Fatal(err)
	}
	n.Unsubscribe(ControlGID) // kept: the node takes changes
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	c := <-got
	cancel()
	<-done
	if c.Origin != "other" || c.GID != 3 || !c.Removed || len(c.Members) != 1 || c.Members[0].UID != "bob" {
		t.Errorf("got change %+v, want other removing bob from 3", c)
	}
	if s := n.Stats(); s.DecodeErrors != 1 || s.DeliveredChanges != 1 {
		t.Errorf("stats: got decode errors %d, delivered changes %d; want 1, 1", s.DecodeErrors, s.DeliveredChanges)
	}

	// A node without a MembersHandler neither holds the control channel
	// nor takes a change on it.
	n2, err := New(Config{NodeID: "me", Handler: func(*Batch) {}}, nopTransport{})
	if err != nil {
		t.Fatal(err)
	}
	if n2.Subscribed(ControlGID) {
		t.Error("a node without a MembersHandler is subscribed to ControlGID")
	}
	n2.recv(ControlGID, AppendMembers(nil, "other", 3, 0, true, []store.Member{{UID: "bob"}}))
	if s := n2.Stats(); s.DecodeErrors != 1 || s.Received != 0 {
		t.Errorf("stats without handler: got decode errors %d, received %d; want 1, 0", s.DecodeErrors, s.Received)
	}
}

// flakyTransport records what it is given and refuses every round while
// fail is set.
type flakyTransport struct {
	mu   sync.Mutex
	fail bool
	got  [][]byte
}

func (f *flakyTransport) Run(ctx context.Context, _ func(int64, []byte)) error {
	<-ctx.Done()
	return nil
}
func (f *flakyTransport) Publish(_ context.Context, ps []Outgoing) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return 0, errors.New("refused")
	}
	for _, p := range ps {
		f.got = append(f.got, bytes.Clone(p.Payload))
	}
	return len(ps), nil
}
func (*flakyTransport) Subscribe(context.Context, []int64) error   { return nil }
func (*flakyTransport) Unsubscribe(context.Context, []int64) error { return nil }
func (f *flakyTransport) Ping(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("refused")
	}
	return nil
}

// TestRecycledTailEntry: a payload queue entry that carried a tail hint and
// is reused for a batch is a batch: when its round fails its messages are
// counted as dropped and no hint with the old group's seq is made of it.
func TestRecycledTailEntry(t *testing.T) {
	tr := &flakyTransport{}
	n, err := New(Config{NodeID: "a", Handler: func(b *Batch) { b.Release() }, TailDelay: 20 * time.Millisecond,
		ProbeInterval: 10 * time.Millisecond}, tr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	m7 := testMsgs(7, 1, 1)
	m7[0].Seq = 1099
	if err := n.Publish(7, 3, m7); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for n.Stats().TailsPublished == 0 {
		if time.Now().After(deadline) {
			t.Fatal("gid 7's hint never went out")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tr.mu.Lock()
	tr.fail = true
	tr.mu.Unlock()
	m8 := testMsgs(8, 1, 1)
	m8[0].Seq = 5
	if err := n.Publish(8, 0, m8); err != nil {
		t.Fatal(err)
	}
	for n.Stats().Dropped.Error == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("gid 8's failed batch not counted as dropped (stats %+v)", n.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	tr.mu.Lock()
	tr.fail = false
	tr.mu.Unlock()
	// gid 8's own hint (seq 5, version 0) goes out once the transport
	// takes rounds again; nothing with gid 7's seq or version.
	for {
		var seen8 bool
		tr.mu.Lock()
		for _, p := range tr.got {
			var b Batch
			if DecodeBatch(&b, p, 0) != nil || b.Tail == 0 {
				continue
			}
			if b.GID == 8 && (b.Tail != 5 || b.MemberVersion != 0) {
				t.Errorf("gid 8's hint: tail %d version %d, want 5 and 0", b.Tail, b.MemberVersion)
			}
			seen8 = seen8 || b.GID == 8
		}
		tr.mu.Unlock()
		if seen8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("gid 8's hint never went out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
