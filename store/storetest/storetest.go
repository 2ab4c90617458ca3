package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// Option configures Run.
type Option func(*suite)

// WithReopen gives the suite a second, independent handle on the database
// behind s, as a second node would open it. The handle must be closed by
// reopen's t.Cleanup. Without this option the multi-node subtests use one
// instance twice.
func WithReopen(reopen func(t *testing.T, s store.Store) store.Store) Option {
	return func(su *suite) { su.reopen = reopen }
}

// WithLimits gives the suite a way to open a fresh store with limits of
// its choosing, for the subtests of a bound (such as exhausting a small
// gid space). Every backend must pass it: those subtests fail without it.
func WithLimits(open func(t *testing.T, l store.Limits) store.Store) Option {
	return func(su *suite) { su.openLimits = open }
}

type suite struct {
	open       func(t *testing.T) store.Store
	reopen     func(t *testing.T, s store.Store) store.Store
	openLimits func(t *testing.T, l store.Limits) store.Store
}

// withLimits opens a fresh store with limits l (see WithLimits).
func (su *suite) withLimits(t *testing.T, l store.Limits) store.Store {
	t.Helper()
	if su.openLimits == nil {
		t.Fatal("storetest: this subtest needs the backend to pass storetest.WithLimits")
	}
	return su.openLimits(t, l)
}

// Run runs every conformance subtest against the backend that open
// creates. See the package comment for what open must do.
func Run(t *testing.T, open func(t *testing.T) store.Store, opts ...Option) {
	su := &suite{open: open}
	for _, o := range opts {
		o(su)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, su) })
	}
}

var tests = []struct {
	name string
	fn   func(t *testing.T, su *suite)
}{
	{"Ping", testPing},
	{"CreateGroup", testCreateGroup},
	{"CreateGroupBadInput", testCreateGroupBadInput},
	{"CreateGroupExplicitGIDBounded", testCreateGroupGIDBound},
	{"CreateGroupGIDExhausted", testCreateGroupGIDExhausted},
	{"SetGroupState", testSetGroupState},
	{"AddMembersIdempotent", testAddMembersIdempotent},
	{"AddMembersBadInput", testAddMembersBadInput},
	{"JoinSeqIsLastSeqPlusOne", testJoinSeq},
	{"OrdinalsDenseAndReused", testOrdinalsReused},
	{"MemberCount", testMemberCount},
	{"RemoveMember", testRemoveMember},
	{"SetMemberMuted", testSetMemberMuted},
	{"UserGroups", testUserGroups},
	{"Users", testUsers},
	{"TouchUserNeverBackwards", testTouchUserNeverBackwards},
	{"TouchUsersBatch", testTouchUsers},
	{"TouchUsersConcurrent", testTouchUsersConcurrent},
	{"ActiveMembersSince", testActiveMembersSince},
	{"UnstorableUIDsAreNobody", testUnstorableUIDs},
	{"MemberVersion", testMemberVersion},
	{"MembersAdded", testMembersAdded},

	{"AppendDenseSeqInRequestOrder", testAppendDense},
	{"AppendBatchSpansGroups", testAppendSpansGroups},
	{"AppendRetryReturnsOriginalSeq", testAppendRetry},
	{"AppendRetryWithinBatch", testAppendRetryWithinBatch},
	{"AppendRetryAfterMuteReturnsOriginal", testAppendRetryAfterMute},
	{"AppendRejectsPerMessageRestCommits", testAppendRejections},
	{"AppendBadInput", testAppendBadInput},
	{"AppendBatchBounds", testAppendBatchBounds},

	{"MessagesRoundTrip", testMessagesRoundTrip},
	{"MessagesJoinSeqCutoff", testMessagesJoinCutoff},
	{"MessagesRangeBounds", testMessagesRangeBounds},
	{"MessagesBadInput", testMessagesBadInput},
	{"MessagesByteBound", testMessagesByteBound},
	{"SyncUnread", testSync},
	{"SyncPages", testSyncPages},
	{"MarkReadNeverBackwards", testMarkRead},
	{"AdvanceConversationsNeverBackwards", testAdvanceConversations},
	{"ExpireMessages", testExpireMessages},
	{"GroupIDs", testGroupIDs},

	{"TwoNodesConcurrentAppendDenseUnique", testConcurrentAppend},
	{"TwoNodesConcurrentRetrySameSeq", testConcurrentRetry},
	{"TwoNodesReaderNeverSeesGap", testReaderNeverSeesGap},
	{"TwoNodesConcurrentAddMembersOrdinals", testConcurrentAddMembers},
	{"TwoNodesConcurrentMembersAdded", testConcurrentMembersAdded},
}

// two returns two handles on one fresh database.
func (su *suite) two(t *testing.T) (a, b store.Store) {
	a = su.open(t)
	b = a
	if su.reopen != nil {
		b = su.reopen(t, a)
	}
	return a, b
}

// newGroup creates an active group owned by owner with members.
func newGroup(t *testing.T, s store.Store, owner string, members ...string) store.Group {
	t.Helper()
	g, err := s.CreateGroup(t.Context(), store.Group{Name: "g", Owner: owner})
	if err != nil {
		t.Fatalf("CreateGroup: %v", err)
	}
	if len(members) > 0 {
		if _, err := s.AddMembers(t.Context(), g.GID, members); err != nil {
			t.Fatalf("AddMembers: %v", err)
		}
	}
	return g
}

func req(gid int64, sender, cid string) store.AppendRequest {
	return store.AppendRequest{GID: gid, Sender: sender, ClientMsgID: cid,
		Body: []byte(`{"text":"` + sender + "/" + cid + `"}`)}
}

// appendAll appends reqs as one batch; a batch-level error fails the test.
func appendAll(t *testing.T, s store.Store, reqs ...store.AppendRequest) []store.AppendResult {
	t.Helper()
	res := make([]store.AppendResult, len(reqs))
	if err := s.Append(t.Context(), reqs, res); err != nil {
		t.Fatalf("Append: %v", err)
	}
	return res
}

// sendN appends n messages from sender to gid one batch and requires them
// all stored; it returns their seqs.
func sendN(t *testing.T, s store.Store, gid int64, sender string, n int) []int64 {
	t.Helper()
	reqs := make([]store.AppendRequest, n)
	for i := range reqs {
		reqs[i] = req(gid, sender, fmt.Sprintf("%s-%d-%d", sender, time.Now().UnixNano(), i))
	}
	seqs := make([]int64, n)
	for i, r := range appendAll(t, s, reqs...) {
		if r.Err != nil {
			t.Fatalf("Append #%d: %v", i, r.Err)
		}
		seqs[i] = r.Seq
	}
	return seqs
}

// readAll pages through uid's whole view of gid.
func readAll(t *testing.T, s store.Store, gid int64, uid string) ([]store.Message, int64) {
	t.Helper()
	var out []store.Message
	var from, last int64
	for {
		msgs, l, err := s.Messages(t.Context(), gid, uid, from, 0, 0, 0)
		if err != nil {
			t.Fatalf("Messages(%d, %q, %d): %v", gid, uid, from, err)
		}
		last = l
		out = append(out, msgs...)
		if len(msgs) == 0 {
			return out, last
		}
		from = msgs[len(msgs)-1].Seq + 1
	}
}

func wantIs(t *testing.T, what string, got, want error) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Errorf("%s: got error %v, want nil", what, got)
		}
		return
	}
	if !errors.Is(got, want) {
		t.Errorf("%s: got error %v, want %v", what, got, want)
	}
}

func sameTime(a, b time.Time) bool {
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

func sameMember(a, b store.Member) bool {
	return a.GID == b.GID && a.UID == b.UID && a.Ordinal == b.Ordinal && a.JoinSeq == b.JoinSeq &&
		a.LastReadSeq == b.LastReadSeq && a.Role == b.Role && a.Muted == b.Muted && sameTime(a.JoinedAt, b.JoinedAt)
}

func sameMessage(a, b store.Message) bool {
	return a.GID == b.GID && a.Seq == b.Seq && a.Sender == b.Sender && a.ClientMsgID == b.ClientMsgID &&
		a.Kind == b.Kind && bytes.Equal(a.Body, b.Body) && sameTime(a.CreatedAt, b.CreatedAt)
}

func uids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// now is a wall-clock instant at microsecond precision.
func now() time.Time { return time.Now().Truncate(time.Microsecond) }
