package storetest

import (
	"fmt"
	"math"
	"slices"
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
	got, err := s.Sync(ctx, "u", 0, 10)
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
	got, _ = s.Sync(ctx, "u", 0, 10)
	for _, e := range got {
		if e.GID == g2.GID && (e.Unread != 0 || e.LastReadSeq != 9) {
			t.Errorf("after MarkRead(9): got %+v, want unread 0", e)
		}
	}
	if got, err := s.Sync(ctx, "nobody", 0, 10); err != nil || len(got) != 0 {
		t.Errorf("Sync(nobody): got %v, %v; want none", got, err)
	}
}

// testSyncPages: Sync pages through a user's groups in gid order, at
// most limit per call, from after the cursor: a page of exactly the
// groups left, one more than a page, no groups, a cursor past the end,
// and the gids of groups the user left or never joined between them.
func testSyncPages(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	var mine []int64 // u's gids, ascending
	for i := range 7 {
		gid := int64(100 + 10*i)
		g, err := s.CreateGroup(ctx, store.Group{GID: gid, Name: "g", Owner: "o"})
		if err != nil {
			t.Fatal(err)
		}
		members := []string{"w"}
		if i != 3 { // gid 130: w's only
			members = append(members, "u")
		}
		if _, err := s.AddMembers(ctx, g.GID, members); err != nil {
			t.Fatal(err)
		}
		if i == 5 { // gid 150: u left
			if _, err := s.RemoveMember(ctx, g.GID, "u"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if i != 3 {
			mine = append(mine, gid)
		}
		sendN(t, s, g.GID, "w", i+1)
	}
	// mine = 100 110 120 140 160
	gids := func(es []store.SyncEntry) []int64 {
		out := make([]int64, len(es))
		for i, e := range es {
			out[i] = e.GID
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		after int64
		limit int
		want  []int64
	}{
		{"first page", 0, 2, mine[:2]},
		{"middle page", 110, 2, []int64{120, 140}},
		{"cursor on a gid the user is not in", 130, 2, []int64{140, 160}},
		{"cursor on a gid the user left", 150, 2, []int64{160}},
		{"exactly the groups left", 120, 2, []int64{140, 160}},
		{"one more than the groups left", 120, 3, []int64{140, 160}},
		{"one less than the groups left", 110, 2, []int64{120, 140}},
		{"all at once, exactly", 0, len(mine), mine},
		{"all but the last", 0, len(mine) - 1, mine[:len(mine)-1]},
		{"all, limit above", 0, len(mine) + 1, mine},
		{"after the last", 160, 2, nil},
		{"past the end", 1 << 40, 2, nil},
		{"after the largest gid", math.MaxInt64, 2, nil},
		{"limit 1", 100, 1, []int64{110}},
	} {
		got, err := s.Sync(ctx, "u", tc.after, tc.limit)
		if err != nil {
			t.Errorf("%s: Sync(after %d, limit %d): %v", tc.name, tc.after, tc.limit, err)
			continue
		}
		if !slices.Equal(gids(got), tc.want) {
			t.Errorf("%s: Sync(after %d, limit %d): got gids %v, want %v", tc.name, tc.after, tc.limit, gids(got), tc.want)
		}
	}
	// Paging by the last gid visits every group once, in order, and the
	// entries are those of one whole read.
	all, err := s.Sync(ctx, "u", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for limit := 1; limit <= len(mine)+1; limit++ {
		var paged []store.SyncEntry
		for after := int64(0); ; {
			page, err := s.Sync(ctx, "u", after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("limit %d: got a page of %d", limit, len(page))
			}
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			after = page[len(page)-1].GID
		}
		if !slices.Equal(paged, all) {
			t.Errorf("limit %d: paged %+v, want %+v", limit, paged, all)
		}
	}
	if len(all) != len(mine) || all[3] != (store.SyncEntry{GID: 140, LastSeq: 5, Unread: 5}) {
		t.Errorf("Sync(after 0, limit 100): got %+v, want %d groups, the 4th gid 140 with last_seq 5, unread 5", all, len(mine))
	}
	for _, uid := range []string{"nobody", "o"} { // no memberships (the owner is not a member)
		if got, err := s.Sync(ctx, uid, 0, 10); err != nil || len(got) != 0 {
			t.Errorf("Sync(%q): got %v, %v; want none", uid, got, err)
		}
	}
	for _, bad := range []struct {
		after int64
		limit int
	}{{0, 0}, {0, -1}, {-1, 10}} {
		_, err := s.Sync(ctx, "u", bad.after, bad.limit)
		wantIs(t, fmt.Sprintf("Sync(after %d, limit %d)", bad.after, bad.limit), err, store.ErrBadRequest)
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
