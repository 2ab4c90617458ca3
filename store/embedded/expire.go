package embedded

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/fanfare-im/fanfare/store"
)

// ExpireMessages implements store.Store: one batch deletes the messages,
// as one range (the next scan and range reads skip it at once, not message
// by message), and their idempotency entries. It does not wait for an
// fsync: a crash may bring back messages it deleted, which the next call
// deletes again.
func (s *Store) ExpireMessages(ctx context.Context, gid int64, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("%w: limit %d", store.ErrBadRequest, limit)
	}
	n := 0
	err := s.update(ctx, "expire messages", false, func(b *pebble.Batch) error {
		lo := msgKey(make([]byte, 0, 34), gid, 0)
		hi := msgKey(lo[len(lo):], gid, math.MaxInt64)
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		kb := make([]byte, 0, 64)
		last := int64(-1)
		for ok := it.First(); ok && n < limit; ok = it.Next() {
			v, err := it.ValueAndErr()
			if err != nil {
				return errors.Join(err, it.Close())
			}
			m, err := decMsg(v)
			if err != nil {
				return errors.Join(err, it.Close())
			}
			if !m.CreatedAt.Before(before) {
				break
			}
			last = seqSuffix(it.Key())
			kb = idemKey(kb[:0], gid, m.Sender, m.ClientMsgID)
			if err := b.Delete(kb, nil); err != nil {
				return errors.Join(err, it.Close())
			}
			n++
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil || last < 0 {
			return err
		}
		return b.DeleteRange(lo, msgKey(nil, gid, last+1), nil)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// GroupIDs implements store.Store.
func (s *Store) GroupIDs(ctx context.Context, after int64, limit int) ([]int64, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: limit %d", store.ErrBadRequest, limit)
	}
	if after == math.MaxInt64 {
		return nil, nil
	}
	var out []int64
	err := s.view(ctx, "group ids", func(snap *pebble.Snapshot) error {
		lo := groupKey(nil, max(after, 0)+1)
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: []byte{pGroup + 1}})
		if err != nil {
			return err
		}
		for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
			out = append(out, gidSuffix(it.Key()))
		}
		return errors.Join(it.Error(), it.Close())
	})
	return out, err
}
