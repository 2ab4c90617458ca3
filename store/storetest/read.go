package storetest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fanfare-im/fanfare/store"
)

func testMessagesRoundTrip(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a", "b")
	reqs := []store.AppendRequest{
		{GID: g.GID, Sender: "a", ClientMsgID: "m1", Body: []byte(`{"text":"héllo ✓","n":[1,2]}`)},
		{GID: g.GID, Sender: "b", ClientMsgID: "m2", Kind: store.KindAtAll, Body: []byte(` "spaces kept" `)},
		{GID: g.GID, Sender: "a", ClientMsgID: "m3", Kind: store.KindText, Body: []byte(`null`)},
	}
	res := appendAll(t, s, reqs...)
	msgs, last, err := s.Messages(ctx, g.GID, "b", 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if last != 3 || len(msgs) != 3 {
		t.Fatalf("got %d messages, last_seq %d; want 3, 3", len(msgs), last)
	}
	for i, r := range reqs {
		kind := r.Kind
		if kind == "" {
			kind = store.KindText
		}
		want := store.Message{GID: g.GID, Seq: res[i].Seq, Sender: r.Sender, ClientMsgID: r.ClientMsgID,
			Kind: kind, Body: r.Body, CreatedAt: res[i].CreatedAt}
		if !sameMessage(msgs[i], want) {
			t.Errorf("message %d: got %+v, want %+v", i, msgs[i], want)
		}
	}
}

func testMessagesJoinCutoff(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	sendN(t, s, g.GID, "a", 5)
	if _, err := s.AddMembers(ctx, g.GID, []string{"late"}); err != nil {
		t.Fatal(err)
	}
	sendN(t, s, g.GID, "a", 3)
	for _, tc := range []struct {
		from, to  int64
		wantFirst int64
		wantN     int
	}{
		{0, 0, 6, 3},
		{1, 0, 6, 3},
		{5, 0, 6, 3},
		{7, 0, 7, 2},
		{1, 5, 0, 0}, // entirely before join
		{3, 6, 6, 1},
	} {
		msgs, last, err := s.Messages(ctx, g.GID, "late", tc.from, tc.to, 0, 0)
		if err != nil {
			t.Fatalf("Messages(%d, %d): %v", tc.from, tc.to, err)
		}
		if last != 8 || len(msgs) != tc.wantN || (tc.wantN > 0 && msgs[0].Seq != tc.wantFirst) {
			t.Errorf("Messages(%d, %d): got %d messages from %v, last %d; want %d from %d, last 8",
				tc.from, tc.to, len(msgs), firstSeq(msgs), last, tc.wantN, tc.wantFirst)
		}
		for _, m := range msgs {
			if m.Seq < 6 {
				t.Errorf("Messages(%d, %d): got seq %d below join_seq 6", tc.from, tc.to, m.Seq)
			}
		}
	}
	if msgs, _, _ := s.Messages(ctx, g.GID, "a", 0, 0, 0, 0); len(msgs) != 8 {
		t.Errorf("early member: got %d messages, want 8", len(msgs))
	}
}

func firstSeq(msgs []store.Message) any {
	if len(msgs) == 0 {
		return "none"
	}
	return msgs[0].Seq
}

func testMessagesRangeBounds(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	const total = store.DefaultMaxRange + 50
	sendN(t, s, g.GID, "a", total)
	for _, tc := range []struct {
		from, to   int64
		limit      int
		first, len int64
	}{
		{0, 0, 0, 1, store.DefaultMaxRange},
		{0, 0, 1000, 1, store.DefaultMaxRange},
		{0, 0, 10, 1, 10},
		{40, 0, 0, 40, store.DefaultMaxRange},
		{100, 0, 0, 100, total - 99},
		{10, 20, 0, 10, 11},
		{10, 20, 5, 10, 5},
		{240, 1000, 0, 240, total - 239}, // to above last_seq
		{total, total, 0, total, 1},
		{total + 1, 0, 0, 0, 0},         // past the end
		{total + 1, total + 9, 0, 0, 0}, // past the end
	} {
		msgs, last, err := s.Messages(ctx, g.GID, "a", tc.from, tc.to, tc.limit, 0)
		if err != nil {
			t.Fatalf("Messages(%d, %d, %d): %v", tc.from, tc.to, tc.limit, err)
		}
		if last != total {
			t.Errorf("Messages(%d, %d, %d): got last_seq %d, want %d", tc.from, tc.to, tc.limit, last, total)
		}
		if int64(len(msgs)) != tc.len {
			t.Errorf("Messages(%d, %d, %d): got %d messages, want %d", tc.from, tc.to, tc.limit, len(msgs), tc.len)
			continue
		}
		for i, m := range msgs {
			if m.Seq != tc.first+int64(i) {
				t.Errorf("Messages(%d, %d, %d): message %d has seq %d, want %d", tc.from, tc.to, tc.limit, i, m.Seq, tc.first+int64(i))
				break
			}
		}
	}
}

func testMessagesBadInput(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	sendN(t, s, g.GID, "a", 3)
	for _, tc := range []struct {
		gid             int64
		uid             string
		from, to        int64
		limit, maxBytes int
		want            error
	}{
		{g.GID, "a", -1, 0, 0, 0, store.ErrBadRequest},
		{g.GID, "a", 0, -1, 0, 0, store.ErrBadRequest},
		{g.GID, "a", 3, 2, 0, 0, store.ErrBadRequest},
		{g.GID, "a", 1, 2, -1, 0, store.ErrBadRequest},
		{g.GID, "a", 1, 2, 0, -1, store.ErrBadRequest},
		{g.GID, "stranger", 0, 0, 0, 0, store.ErrNotMember},
		{g.GID + 1000, "a", 0, 0, 0, 0, store.ErrNotMember},
	} {
		msgs, _, err := s.Messages(ctx, tc.gid, tc.uid, tc.from, tc.to, tc.limit, tc.maxBytes)
		wantIs(t, fmt.Sprintf("Messages(%d, %q, %d, %d, %d, %d)", tc.gid, tc.uid, tc.from, tc.to, tc.limit, tc.maxBytes), err, tc.want)
		if len(msgs) != 0 {
			t.Errorf("Messages(%d, %q, ...) with error: got %d messages, want none", tc.gid, tc.uid, len(msgs))
		}
	}
}

// testMessagesByteBound: maxBytes ends a page before the message that
// would take the sum of Message.Size past it, at exactly the edge, and a
// page always holds one message even when that one alone is larger.
func testMessagesByteBound(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	// Ten messages of one size each (sender "a" + a 1000-byte body), then
	// one body of 20000 bytes.
	var reqs []store.AppendRequest
	for i := range 10 {
		r := req(g.GID, "a", fmt.Sprintf("kb-%d", i))
		r.Body = []byte(`"` + strings.Repeat("x", 998) + `"`)
		reqs = append(reqs, r)
	}
	big := req(g.GID, "a", "big")
	big.Body = []byte(`"` + strings.Repeat("y", 19998) + `"`)
	reqs = append(reqs, big)
	for i, r := range appendAll(t, s, reqs...) {
		if r.Err != nil {
			t.Fatalf("Append #%d: %v", i, r.Err)
		}
	}
	const size = 1001 // len(body) + len(sender)
	for _, tc := range []struct {
		from, to        int64
		limit, maxBytes int
		first, len      int64
	}{
		{1, 0, 0, 0, 1, 11},               // no byte bound
		{1, 0, 0, 3 * size, 1, 3},         // exactly three
		{1, 0, 0, 3*size - 1, 1, 2},       // one byte short of three
		{1, 0, 0, 3*size + 1, 1, 3},       // one byte over three
		{1, 0, 2, 3 * size, 1, 2},         // the count bound is the tighter
		{1, 0, 0, 1, 1, 1},                // smaller than one message: still one
		{5, 0, 0, 100 * size, 5, 7},       // the large one fits
		{5, 0, 0, 6 * size, 5, 6},         // the large one does not
		{11, 0, 0, 1000, 11, 1},           // the large one alone, over the bound
		{12, 0, 0, 1000, 0, 0},            // past the end
		{3, 4, 0, 1000 * size, 3, 2},      // to_seq still applies
		{1, 0, 0, 10*size + 20001, 1, 11}, // all of it, exactly
	} {
		msgs, last, err := s.Messages(ctx, g.GID, "a", tc.from, tc.to, tc.limit, tc.maxBytes)
		if err != nil {
			t.Fatalf("Messages(%d, %d, %d, %d): %v", tc.from, tc.to, tc.limit, tc.maxBytes, err)
		}
		if last != 11 {
			t.Errorf("Messages(%d, %d, %d, %d): got last_seq %d, want 11", tc.from, tc.to, tc.limit, tc.maxBytes, last)
		}
		if int64(len(msgs)) != tc.len {
			t.Errorf("Messages(%d, %d, %d, %d): got %d messages, want %d", tc.from, tc.to, tc.limit, tc.maxBytes, len(msgs), tc.len)
			continue
		}
		total := 0
		for i, m := range msgs {
			total += m.Size()
			if m.Seq != tc.first+int64(i) {
				t.Errorf("Messages(%d, %d, %d, %d): message %d has seq %d, want %d", tc.from, tc.to, tc.limit, tc.maxBytes, i, m.Seq, tc.first+int64(i))
				break
			}
			if want := reqs[m.Seq-1].Body; string(m.Body) != string(want) {
				t.Errorf("Messages(%d, %d, %d, %d): seq %d body of %d bytes, want %d", tc.from, tc.to, tc.limit, tc.maxBytes, m.Seq, len(m.Body), len(want))
			}
		}
		if tc.maxBytes > 0 && len(msgs) > 1 && total > tc.maxBytes {
			t.Errorf("Messages(%d, %d, %d, %d): %d messages of %d bytes, past the bound", tc.from, tc.to, tc.limit, tc.maxBytes, len(msgs), total)
		}
	}
}

func testSync(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g1 := newGroup(t, s, "o", "u", "w")
	sendN(t, s, g1.GID, "w", 10)
	g2 := newGroup(t, s, "o", "w")
	sendN(t, s, g2.GID, "w", 7)
	if _, err := s.AddMembers(ctx, g2.GID, []string{"u"}); err != nil { // joins at 8
		t.Fatal(err)
	}
	sendN(t, s, g2.GID, "w", 2)
	g3 := newGroup(t, s, "o", "u") // empty
	if err := s.MarkRead(ctx, g1.GID, "u", 4); err != nil {
		t.Fatal(err)
	}
	got, err := s.Sync(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]store.SyncEntry{
		g1.GID: {GID: g1.GID, LastSeq: 10, LastReadSeq: 4, Unread: 6},
		g2.GID: {GID: g2.GID, LastSeq: 9, LastReadSeq: 0, Unread: 2}, // not the 7 before joining
		g3.GID: {GID: g3.GID},
	}
	if len(got) != len(want) {
		t.Errorf("Sync: got %d entries %+v, want %d", len(got), got, len(want))
	}
	for _, e := range got {
		if w, ok := want[e.GID]; !ok || e != w {
			t.Errorf("Sync entry: got %+v, want %+v", e, w)
		}
	}
	if err := s.MarkRead(ctx, g2.GID, "u", 9); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Sync(ctx, "u")
	for _, e := range got {
		if e.GID == g2.GID && (e.Unread != 0 || e.LastReadSeq != 9) {
			t.Errorf("after MarkRead(9): got %+v, want unread 0", e)
		}
	}
	if got, err := s.Sync(ctx, "nobody"); err != nil || len(got) != 0 {
		t.Errorf("Sync(nobody): got %v, %v; want none", got, err)
	}
}

func testMarkRead(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "u")
	sendN(t, s, g.GID, "u", 10)
	for _, step := range []struct{ mark, want int64 }{
		{3, 3}, {7, 7}, {5, 7}, {0, 7}, {10, 10}, {99, 10}, // clamped to last_seq
	} {
		if err := s.MarkRead(ctx, g.GID, "u", step.mark); err != nil {
			t.Fatalf("MarkRead(%d): %v", step.mark, err)
		}
		m, _ := s.Member(ctx, g.GID, "u")
		if m.LastReadSeq != step.want {
			t.Errorf("MarkRead(%d): got last_read_seq %d, want %d", step.mark, m.LastReadSeq, step.want)
		}
	}
	wantIs(t, "MarkRead(non-member)", s.MarkRead(ctx, g.GID, "x", 1), store.ErrNotMember)
	wantIs(t, "MarkRead(unknown group)", s.MarkRead(ctx, g.GID+1000, "u", 1), store.ErrNotMember)
	wantIs(t, "MarkRead(negative)", s.MarkRead(ctx, g.GID, "u", -1), store.ErrBadRequest)
}

func testAdvanceConversations(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g1 := newGroup(t, s, "o", "a", "b", "c")
	g2 := newGroup(t, s, "o", "a")
	check := func(uid string, want map[int64]int64) {
		t.Helper()
		got, err := s.Conversations(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("Conversations(%s): got %v, want %v", uid, got, want)
			return
		}
		for gid, seq := range want {
			if got[gid] != seq {
				t.Errorf("Conversations(%s): got %v, want %v", uid, got, want)
				return
			}
		}
	}
	check("a", map[int64]int64{})
	if err := s.AdvanceConversations(ctx, g1.GID, []string{"a", "b", "a", "stranger"}, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.AdvanceConversations(ctx, g2.GID, []string{"a"}, 2); err != nil {
		t.Fatal(err)
	}
	check("a", map[int64]int64{g1.GID: 5, g2.GID: 2})
	check("b", map[int64]int64{g1.GID: 5})
	check("c", map[int64]int64{})
	check("stranger", map[int64]int64{}) // not a member: ignored
	// Never backwards; an advance moves only what is behind.
	if err := s.AdvanceConversations(ctx, g1.GID, []string{"a", "c"}, 3); err != nil {
		t.Fatal(err)
	}
	check("a", map[int64]int64{g1.GID: 5, g2.GID: 2})
	check("c", map[int64]int64{g1.GID: 3})
	if err := s.AdvanceConversations(ctx, g1.GID, []string{"a", "b", "c"}, 9); err != nil {
		t.Fatal(err)
	}
	check("b", map[int64]int64{g1.GID: 9})
	check("c", map[int64]int64{g1.GID: 9})
	if err := s.AdvanceConversations(ctx, g1.GID, nil, 10); err != nil {
		t.Errorf("AdvanceConversations(no uids): %v", err)
	}
	wantIs(t, "AdvanceConversations(negative)", s.AdvanceConversations(ctx, g1.GID, []string{"a"}, -1), store.ErrBadRequest)
	// Leaving a group drops it from the index.
	if _, err := s.RemoveMember(ctx, g1.GID, "a"); err != nil {
		t.Fatal(err)
	}
	check("a", map[int64]int64{g2.GID: 2})
}
