package storetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fanfare-im/fanfare/store"
)

func testAppendDense(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a", "b")
	var reqs []store.AppendRequest
	for i := range 10 {
		reqs = append(reqs, req(g.GID, []string{"a", "b"}[i%2], fmt.Sprint("c", i)))
	}
	for i, r := range appendAll(t, s, reqs...) {
		if r.Err != nil || r.Seq != int64(i+1) || r.Duplicate || r.CreatedAt.IsZero() {
			t.Errorf("request %d: got %+v, want seq %d", i, r, i+1)
		}
	}
	res := appendAll(t, s, req(g.GID, "a", "next"))
	if res[0].Seq != 11 {
		t.Errorf("next batch: got seq %d, want 11", res[0].Seq)
	}
	if gg, _ := s.Group(ctx, g.GID); gg.LastSeq != 11 {
		t.Errorf("last_seq: got %d, want 11", gg.LastSeq)
	}
}

func testAppendSpansGroups(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	var gs []store.Group
	for range 4 {
		gs = append(gs, newGroup(t, s, "o", "a"))
	}
	sendN(t, s, gs[2].GID, "a", 3) // g2 starts at last_seq 3
	// Interleave groups; seqs are per group, in request order.
	order := []int{3, 0, 2, 0, 3, 1, 2, 2, 0}
	var reqs []store.AppendRequest
	for i, gi := range order {
		reqs = append(reqs, req(gs[gi].GID, "a", fmt.Sprint("x", i)))
	}
	res := appendAll(t, s, reqs...)
	next := map[int]int64{0: 1, 1: 1, 2: 4, 3: 1}
	for i, gi := range order {
		if res[i].Err != nil || res[i].Seq != next[gi] {
			t.Errorf("request %d (group %d): got %+v, want seq %d", i, gi, res[i], next[gi])
		}
		next[gi]++
	}
	for gi, g := range gs {
		gg, _ := s.Group(ctx, g.GID)
		if gg.LastSeq != next[gi]-1 {
			t.Errorf("group %d: got last_seq %d, want %d", gi, gg.LastSeq, next[gi]-1)
		}
		msgs, last := readAll(t, s, g.GID, "a")
		if int64(len(msgs)) != last {
			t.Errorf("group %d: read %d messages, want last_seq %d", gi, len(msgs), last)
		}
		for j, m := range msgs {
			if m.Seq != int64(j+1) || m.GID != g.GID {
				t.Errorf("group %d message %d: got gid %d seq %d", gi, j, m.GID, m.Seq)
			}
		}
	}
}

func testAppendRetry(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a", "b")
	g2 := newGroup(t, s, "o", "a")
	first := appendAll(t, s, req(g.GID, "a", "k1"), req(g.GID, "a", "k2"))
	sendN(t, s, g.GID, "b", 2)
	// Retry of k2 (with a different body: the key decides), plus new messages:
	// same client_msg_id from another sender, and in another group.
	retry := req(g.GID, "a", "k2")
	retry.Body = []byte(`"changed"`)
	invalid := req(g.GID, "a", "")
	res := appendAll(t, s, retry, req(g.GID, "b", "k2"), req(g2.GID, "a", "k2"), req(g.GID, "a", "k3"), invalid)
	if r := res[0]; r.Err != nil || !r.Duplicate || r.Seq != first[1].Seq || !sameTime(r.CreatedAt, first[1].CreatedAt) {
		t.Errorf("retry: got %+v, want duplicate of %+v", r, first[1])
	}
	if r := res[1]; r.Err != nil || r.Duplicate || r.Seq != 5 {
		t.Errorf("same id from another sender: got %+v, want new seq 5", r)
	}
	if r := res[2]; r.Err != nil || r.Duplicate || r.Seq != 1 {
		t.Errorf("same id in another group: got %+v, want new seq 1", r)
	}
	if r := res[3]; r.Err != nil || r.Duplicate || r.Seq != 6 {
		t.Errorf("new message after a retry: got %+v, want seq 6 (no seq spent on the retry)", r)
	}
	wantIs(t, "invalid request in a batch with a retry", res[4].Err, store.ErrBadRequest)
	if gg, _ := s.Group(ctx, g.GID); gg.LastSeq != 6 {
		t.Errorf("last_seq: got %d, want 6", gg.LastSeq)
	}
	msgs, _ := readAll(t, s, g.GID, "a")
	if len(msgs) != 6 || string(msgs[1].Body) != string(req(g.GID, "a", "k2").Body) {
		t.Errorf("stored messages: got %d, want 6 with k2's original body", len(msgs))
	}
}

func testAppendRetryWithinBatch(t *testing.T, su *suite) {
	s := su.open(t)
	g := newGroup(t, s, "o", "a")
	res := appendAll(t, s,
		req(g.GID, "a", "k1"),
		req(g.GID, "nobody", "k9"),
		req(g.GID, "a", "k1"),
		req(g.GID, "a", "k2"),
		req(g.GID, "nobody", "k9"),
		req(g.GID, "a", "k1"))
	if res[0].Err != nil || res[0].Seq != 1 || res[0].Duplicate {
		t.Errorf("first k1: got %+v, want seq 1", res[0])
	}
	for _, i := range []int{2, 5} {
		if r := res[i]; r.Err != nil || r.Seq != 1 || !r.Duplicate || !sameTime(r.CreatedAt, res[0].CreatedAt) {
			t.Errorf("repeat %d of k1: got %+v, want duplicate of seq 1", i, r)
		}
	}
	if res[3].Err != nil || res[3].Seq != 2 {
		t.Errorf("k2: got %+v, want seq 2", res[3])
	}
	for _, i := range []int{1, 4} {
		if r := res[i]; !errors.Is(r.Err, store.ErrNotMember) || r.Duplicate || r.Seq != 0 {
			t.Errorf("request %d from non-member: got %+v, want ErrNotMember", i, r)
		}
	}
}

func testAppendRetryAfterMute(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	first := appendAll(t, s, req(g.GID, "a", "k"))
	if err := s.SetMemberMuted(ctx, g.GID, "a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetGroupState(ctx, g.GID, store.StateDissolved); err != nil {
		t.Fatal(err)
	}
	// The send was stored before: a retry answers with its seq, whatever
	// happened since.
	res := appendAll(t, s, req(g.GID, "a", "k"), req(g.GID, "a", "new"))
	if r := res[0]; r.Err != nil || !r.Duplicate || r.Seq != first[0].Seq {
		t.Errorf("retry: got %+v, want duplicate of seq %d", r, first[0].Seq)
	}
	wantIs(t, "new send to dissolved group", res[1].Err, store.ErrGroupClosed)
}

func testAppendRejections(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a", "b", "m")
	mutedAll := newGroup(t, s, "o", "a")
	dissolved := newGroup(t, s, "o", "a")
	if err := s.SetMemberMuted(ctx, g.GID, "m", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetGroupState(ctx, mutedAll.GID, store.StateMutedAll); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetGroupState(ctx, dissolved.GID, store.StateDissolved); err != nil {
		t.Fatal(err)
	}
	big := req(g.GID, "a", "big")
	big.Body = []byte(`"` + strings.Repeat("x", store.DefaultMaxBodyBytes) + `"`)
	reqs := []store.AppendRequest{
		req(g.GID, "a", "1"),
		req(g.GID, "stranger", "2"),
		req(g.GID, "m", "3"),
		req(g.GID, "b", "4"),
		req(g.GID+1000, "a", "5"),
		req(mutedAll.GID, "a", "6"),
		big,
		req(dissolved.GID, "a", "7"),
		req(g.GID, "a", "8"),
	}
	want := []struct {
		seq int64
		err error
	}{{1, nil}, {0, store.ErrNotMember}, {0, store.ErrMuted}, {2, nil}, {0, store.ErrGroupNotFound},
		{0, store.ErrGroupClosed}, {0, store.ErrTooLarge}, {0, store.ErrGroupClosed}, {3, nil}}
	res := appendAll(t, s, reqs...)
	for i, w := range want {
		if !errors.Is(res[i].Err, w.err) || (w.err == nil && res[i].Err != nil) || res[i].Seq != w.seq {
			t.Errorf("request %d: got seq %d err %v, want seq %d err %v", i, res[i].Seq, res[i].Err, w.seq, w.err)
		}
	}
	// The accepted messages are stored, densely; the rejected groups did not move.
	msgs, last := readAll(t, s, g.GID, "b")
	if last != 3 || len(msgs) != 3 || msgs[0].ClientMsgID != "1" || msgs[1].ClientMsgID != "4" || msgs[2].ClientMsgID != "8" {
		t.Errorf("stored: got last_seq %d and %d messages, want 1, 4, 8 at seqs 1..3", last, len(msgs))
	}
	for _, gid := range []int64{mutedAll.GID, dissolved.GID} {
		if gg, _ := s.Group(ctx, gid); gg.LastSeq != 0 {
			t.Errorf("group %d: got last_seq %d, want 0", gid, gg.LastSeq)
		}
	}
	// muted_all lifted: the group accepts sends again.
	if _, err := s.SetGroupState(ctx, mutedAll.GID, store.StateActive); err != nil {
		t.Fatal(err)
	}
	if res := appendAll(t, s, req(mutedAll.GID, "a", "6")); res[0].Err != nil || res[0].Seq != 1 {
		t.Errorf("after reactivation: got %+v, want seq 1", res[0])
	}
}

func testAppendBadInput(t *testing.T, su *suite) {
	s := su.open(t)
	g := newGroup(t, s, "o", "a")
	mk := func(f func(r *store.AppendRequest)) store.AppendRequest {
		r := req(g.GID, "a", "ok")
		f(&r)
		return r
	}
	cases := []struct {
		name string
		r    store.AppendRequest
		want error
	}{
		{"body too large", mk(func(r *store.AppendRequest) {
			r.ClientMsgID, r.Body = "big", []byte(`"`+strings.Repeat("x", store.DefaultMaxBodyBytes-1)+`"`)
		}), store.ErrTooLarge},
		{"empty client_msg_id", mk(func(r *store.AppendRequest) { r.ClientMsgID = "" }), store.ErrBadRequest},
		{"long client_msg_id", mk(func(r *store.AppendRequest) {
			r.ClientMsgID = strings.Repeat("c", store.DefaultMaxClientMsgID+1)
		}), store.ErrBadRequest},
		{"client_msg_id with NUL", mk(func(r *store.AppendRequest) { r.ClientMsgID = "a\x00" }), store.ErrBadRequest},
		{"empty sender", mk(func(r *store.AppendRequest) { r.Sender, r.ClientMsgID = "", "s" }), store.ErrBadRequest},
		{"unknown kind", mk(func(r *store.AppendRequest) { r.Kind, r.ClientMsgID = "image", "k" }), store.ErrBadRequest},
		{"body not JSON", mk(func(r *store.AppendRequest) { r.Body, r.ClientMsgID = []byte("{oops"), "j" }), store.ErrBadRequest},
		{"empty body", mk(func(r *store.AppendRequest) { r.Body, r.ClientMsgID = nil, "e" }), store.ErrBadRequest},
		{"gid zero", mk(func(r *store.AppendRequest) { r.GID, r.ClientMsgID = 0, "z" }), store.ErrBadRequest},
		{"negative gid", mk(func(r *store.AppendRequest) { r.GID, r.ClientMsgID = -4, "n" }), store.ErrBadRequest},
	}
	reqs := []store.AppendRequest{}
	for _, c := range cases {
		reqs = append(reqs, c.r)
	}
	// Limits are inclusive: a body of exactly MaxBodyBytes, a client_msg_id
	// of exactly MaxClientMsgID, kind at_all are fine.
	exact := req(g.GID, "a", strings.Repeat("c", store.DefaultMaxClientMsgID))
	exact.Body = []byte(`"` + strings.Repeat("x", store.DefaultMaxBodyBytes-2) + `"`)
	exact.Kind = store.KindAtAll
	reqs = append(reqs, exact)
	res := appendAll(t, s, reqs...)
	for i, c := range cases {
		wantIs(t, c.name, res[i].Err, c.want)
		if res[i].Seq != 0 {
			t.Errorf("%s: got seq %d, want 0", c.name, res[i].Seq)
		}
	}
	if r := res[len(cases)]; r.Err != nil || r.Seq != 1 {
		t.Fatalf("request at the limits: got %+v, want seq 1", r)
	}
	msgs, _ := readAll(t, s, g.GID, "a")
	if len(msgs) != 1 || msgs[0].Kind != store.KindAtAll || len(msgs[0].Body) != store.DefaultMaxBodyBytes {
		t.Errorf("stored: got %d messages, want the one at the limits", len(msgs))
	}
}

func testAppendBatchBounds(t *testing.T, su *suite) {
	s := su.open(t)
	ctx := t.Context()
	g := newGroup(t, s, "o", "a")
	reqs := []store.AppendRequest{req(g.GID, "a", "1"), req(g.GID, "a", "2")}
	err := s.Append(ctx, reqs, make([]store.AppendResult, 1))
	wantIs(t, "Append(len(res) != len(reqs))", err, store.ErrBadRequest)
	many := make([]store.AppendRequest, store.DefaultMaxBatch+1)
	for i := range many {
		many[i] = req(g.GID, "a", fmt.Sprint("m", i))
	}
	err = s.Append(ctx, many, make([]store.AppendResult, len(many)))
	wantIs(t, "Append(batch above MaxBatch)", err, store.ErrTooLarge)
	if err := s.Append(ctx, nil, nil); err != nil {
		t.Errorf("Append(empty): got %v, want nil", err)
	}
	if gg, _ := s.Group(ctx, g.GID); gg.LastSeq != 0 {
		t.Errorf("last_seq after rejected batches: got %d, want 0", gg.LastSeq)
	}
	// A batch of exactly MaxBatch is accepted.
	many = many[:store.DefaultMaxBatch]
	res := make([]store.AppendResult, len(many))
	if err := s.Append(ctx, many, res); err != nil {
		t.Fatalf("Append(MaxBatch): %v", err)
	}
	if r := res[len(res)-1]; r.Err != nil || r.Seq != int64(store.DefaultMaxBatch) {
		t.Errorf("last of MaxBatch: got %+v, want seq %d", r, store.DefaultMaxBatch)
	}
}
