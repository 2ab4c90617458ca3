package gateway

import (
	"context"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/store"
)

// Page byte budgets of pull answers (the messages frame and GET
// /v1/groups/{gid}/messages).
const (
	// DefaultPageBytes is the default budget: a quarter of fanfared's
	// default outbound bound, so that a page never comes near the bound
	// that closes a connection.
	DefaultPageBytes = 256 << 10
	// MinPageBytes is the smallest budget that holds one message of the
	// largest body the store takes (store.DefaultMaxBodyBytes) with the
	// rest of its frame: a page holds one message whatever its size, so a
	// smaller budget would let single pages pass it.
	MinPageBytes = store.DefaultMaxBodyBytes + 4<<10
)

// pagedMessages reads one page of uid's view of gid in [from, to] for an
// answer of about budget bytes (the store bounds the sizes of the
// messages; the encoder bounds the frame exactly) and returns the seq the
// next page starts at: 0 when the page reaches the end of the range
// (min(to, last_seq); seqs are dense above the oldest message left).
func pagedMessages(ctx context.Context, eng *fanout.Engine, gid int64, uid string, from, to int64, budget int) (msgs []store.Message, last, next int64, err error) {
	msgs, last, err = eng.Messages(ctx, gid, uid, from, to, budget)
	if err != nil {
		return nil, 0, 0, err
	}
	if n := len(msgs); n > 0 {
		end := last
		if to != 0 && to < end {
			end = to
		}
		if s := msgs[n-1].Seq; s < end {
			next = s + 1
		}
	}
	return msgs, last, next, nil
}
