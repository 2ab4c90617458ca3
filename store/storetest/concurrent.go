package storetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fanfare-im/fanfare/store"
)

type msgKey struct {
	gid         int64
	sender, cid string
}

// testConcurrentAppend: many goroutines on two nodes append batches that
// span the same groups, with retries of earlier sends mixed in (often
// through the other node). Every group's seqs must come out dense and
// unique, every retry must get its original seq, and the stored rows must
// be exactly the acked ones.
func testConcurrentAppend(t *testing.T, su *suite) {
	a, b := su.two(t)
	stores := []store.Store{a, b}
	ctx := t.Context()
	const groups, workers, batches = 6, 12, 20
	senders := uids("s", workers)
	gids := make([]int64, groups)
	for i := range gids {
		gids[i] = newGroup(t, a, "o", senders...).GID
	}
	acked := make([]map[msgKey]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			mine := map[msgKey]int64{}
			var keys []msgKey
			acked[w] = mine
			for bi := range batches {
				s := stores[(w+bi)%2]
				n := 1 + rng.IntN(16)
				reqs := make([]store.AppendRequest, 0, n)
				for k := range n {
					if len(keys) > 0 && rng.IntN(5) == 0 {
						old := keys[rng.IntN(len(keys))]
						reqs = append(reqs, req(old.gid, old.sender, old.cid))
						continue
					}
					reqs = append(reqs, req(gids[rng.IntN(groups)], senders[w], fmt.Sprintf("w%d-b%d-%d", w, bi, k)))
				}
				res := make([]store.AppendResult, len(reqs))
				if err := s.Append(ctx, reqs, res); err != nil {
					t.Errorf("worker %d batch %d: %v", w, bi, err)
					return
				}
				for i, r := range res {
					k := msgKey{reqs[i].GID, reqs[i].Sender, reqs[i].ClientMsgID}
					orig, seen := mine[k]
					switch {
					case r.Err != nil:
						t.Errorf("worker %d: %+v: %v", w, k, r.Err)
					case r.Seq <= 0:
						t.Errorf("worker %d: %+v: got seq %d", w, k, r.Seq)
					case seen && (!r.Duplicate || r.Seq != orig):
						t.Errorf("worker %d: retry of %+v: got seq %d duplicate=%v, want duplicate of seq %d", w, k, r.Seq, r.Duplicate, orig)
					case !seen && r.Duplicate:
						t.Errorf("worker %d: first send of %+v reported as duplicate", w, k)
					case !seen:
						mine[k] = r.Seq
						keys = append(keys, k)
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	bySeq := make(map[int64]map[int64]msgKey, groups)
	for _, gid := range gids {
		bySeq[gid] = map[int64]msgKey{}
	}
	for _, m := range acked {
		for k, seq := range m {
			if other, dup := bySeq[k.gid][seq]; dup {
				t.Errorf("group %d seq %d acked for both %+v and %+v", k.gid, seq, other, k)
			}
			bySeq[k.gid][seq] = k
		}
	}
	for _, gid := range gids {
		g, err := b.Group(ctx, gid)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(bySeq[gid])) != g.LastSeq {
			t.Errorf("group %d: %d distinct messages acked, last_seq %d", gid, len(bySeq[gid]), g.LastSeq)
		}
		for seq := int64(1); seq <= g.LastSeq; seq++ {
			if _, ok := bySeq[gid][seq]; !ok {
				t.Errorf("group %d: seq %d was never acked (gap)", gid, seq)
			}
		}
		msgs, last := readAll(t, b, gid, senders[0])
		if last != g.LastSeq || int64(len(msgs)) != last {
			t.Errorf("group %d: read %d messages, last_seq %d, want %d", gid, len(msgs), last, g.LastSeq)
		}
		for i, m := range msgs {
			k := bySeq[gid][m.Seq]
			if m.Seq != int64(i+1) || m.Sender != k.sender || m.ClientMsgID != k.cid {
				t.Errorf("group %d: stored seq %d is %s/%s, want %s/%s at seq %d", gid, m.Seq, m.Sender, m.ClientMsgID, k.sender, k.cid, i+1)
				break
			}
		}
	}
}

// testConcurrentRetry: the same sends race on two nodes; each is stored
// once, every copy gets the same seq and exactly one is not a duplicate.
// Each batch holds one key in two groups, in either order, so the nodes'
// transactions overlap on both group locks.
func testConcurrentRetry(t *testing.T, su *suite) {
	a, b := su.two(t)
	stores := []store.Store{a, b}
	ctx := t.Context()
	g1 := newGroup(t, a, "o", "u").GID
	g2 := newGroup(t, a, "o", "u").GID
	const keys, copies = 20, 6
	res := make([][copies][2]store.AppendResult, keys)
	var wg sync.WaitGroup
	for k := range keys {
		for c := range copies {
			wg.Go(func() {
				cid := fmt.Sprint("key", k)
				reqs := []store.AppendRequest{req(g1, "u", cid), req(g2, "u", cid)}
				if c%2 == 1 {
					reqs[0], reqs[1] = reqs[1], reqs[0]
				}
				out := make([]store.AppendResult, 2)
				if err := stores[c%2].Append(ctx, reqs, out); err != nil {
					t.Errorf("key %d copy %d: %v", k, c, err)
					return
				}
				if c%2 == 1 {
					out[0], out[1] = out[1], out[0]
				}
				res[k][c] = [2]store.AppendResult{out[0], out[1]}
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for gi, gid := range []int64{g1, g2} {
		seen := map[int64]int{}
		for k := range keys {
			stored := 0
			for c := range copies {
				r := res[k][c][gi]
				if r.Err != nil || r.Seq != res[k][0][gi].Seq {
					t.Errorf("group %d key %d copy %d: got %+v, want seq %d", gi, k, c, r, res[k][0][gi].Seq)
				}
				if !r.Duplicate {
					stored++
				}
			}
			if stored != 1 {
				t.Errorf("group %d key %d: %d copies not duplicates, want exactly 1", gi, k, stored)
			}
			if other, dup := seen[res[k][0][gi].Seq]; dup {
				t.Errorf("group %d: keys %d and %d share seq %d", gi, other, k, res[k][0][gi].Seq)
			}
			seen[res[k][0][gi].Seq] = k
		}
		if g, _ := b.Group(ctx, gid); g.LastSeq != keys {
			t.Errorf("group %d: got last_seq %d, want %d", gi, g.LastSeq, keys)
		}
	}
}

// testReaderNeverSeesGap: while writers on two nodes append to one group,
// readers on both nodes poll from their cursor. A read must start exactly
// at cursor+1 and be contiguous (a skipped seq would never be read again),
// never return a row above the last_seq it reports, and never report a
// last_seq whose rows it cannot return.
func testReaderNeverSeesGap(t *testing.T, su *suite) {
	a, b := su.two(t)
	stores := []store.Store{a, b}
	ctx := t.Context()
	const writers, batches = 4, 30
	g := newGroup(t, a, "o", append(uids("w", writers), "r0", "r1")...).GID
	var done atomic.Bool
	var writeWG, readWG sync.WaitGroup
	for r := range 2 {
		readWG.Go(func() {
			s, uid := stores[r], fmt.Sprint("r", r)
			var cursor, lastSeen int64
			for reads := 0; ; reads++ {
				finished := done.Load()
				msgs, last, err := s.Messages(ctx, g, uid, cursor+1, 0, 0, 0)
				if err != nil {
					t.Errorf("reader %d: %v", r, err)
					return
				}
				if last < lastSeen {
					t.Errorf("reader %d: last_seq went back from %d to %d", r, lastSeen, last)
				}
				lastSeen = last
				for i, m := range msgs {
					if m.Seq != cursor+1+int64(i) {
						t.Errorf("reader %d: after seq %d got seq %d: skipped rows", r, cursor+int64(i), m.Seq)
						return
					}
					if m.Seq > last {
						t.Errorf("reader %d: got seq %d above reported last_seq %d", r, m.Seq, last)
					}
				}
				if len(msgs) == 0 && last > cursor {
					t.Errorf("reader %d: last_seq %d reported but nothing returned after %d", r, last, cursor)
					return
				}
				if len(msgs) > 0 {
					cursor = msgs[len(msgs)-1].Seq
				}
				if finished && len(msgs) == 0 {
					if cursor != last {
						t.Errorf("reader %d: finished at %d, last_seq %d", r, cursor, last)
					}
					return
				}
			}
		})
	}
	for w := range writers {
		writeWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for bi := range batches {
				n := 1 + rng.IntN(8)
				reqs := make([]store.AppendRequest, n)
				for i := range reqs {
					reqs[i] = req(g, fmt.Sprint("w", w), fmt.Sprintf("%d-%d", bi, i))
				}
				if err := stores[w%2].Append(ctx, reqs, make([]store.AppendResult, n)); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		})
	}
	writeWG.Wait()
	done.Store(true)
	readWG.Wait()
}

// testConcurrentAddMembers: overlapping AddMembers and RemoveMember calls
// on two nodes keep ordinals unique and dense and member_count exact.
func testConcurrentAddMembers(t *testing.T, su *suite) {
	a, b := su.two(t)
	stores := []store.Store{a, b}
	ctx := t.Context()
	g := newGroup(t, a, "o").GID
	const n = 60
	all := uids("u", n)
	var mu sync.Mutex
	ordinals := map[string]uint32{}
	record := func(ms []store.Member) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			if o, ok := ordinals[m.UID]; ok && o != m.Ordinal {
				t.Errorf("%s: returned with ordinal %d and %d", m.UID, o, m.Ordinal)
			}
			ordinals[m.UID] = m.Ordinal
		}
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rotated := append(slices.Clone(all[w*15:]), all[:w*15]...)
			for i := 0; i < n; i += 10 {
				ms, err := stores[w%2].AddMembers(ctx, g, rotated[i:i+10])
				if err != nil {
					t.Errorf("AddMembers: %v", err)
					return
				}
				record(ms)
			}
		})
	}
	wg.Wait()
	checkOrdinals(t, stores[1], g, all, n)

	// Removals and new joins race; freed ordinals may be reused or not,
	// but never shared, and the count stays exact.
	for w := range 4 {
		wg.Go(func() {
			for i := range 5 {
				if w < 2 {
					uid := all[w*5+i]
					if _, err := stores[w%2].RemoveMember(ctx, g, uid); err != nil {
						t.Errorf("RemoveMember(%s): %v", uid, err)
					}
				} else if _, err := stores[w%2].AddMembers(ctx, g, []string{fmt.Sprintf("v%d-%d", w, i)}); err != nil {
					t.Errorf("AddMembers: %v", err)
				}
			}
		})
	}
	wg.Wait()
	now := append(slices.Clone(all[10:]), uids("v2-", 5)...)
	now = append(now, uids("v3-", 5)...)
	checkOrdinals(t, stores[0], g, now, n+10)
}

// checkOrdinals verifies that exactly members are in gid, with distinct
// ordinals below bound.
func checkOrdinals(t *testing.T, s store.Store, gid int64, members []string, bound uint32) {
	t.Helper()
	grp, err := s.Group(t.Context(), gid)
	if err != nil {
		t.Fatal(err)
	}
	if grp.MemberCount != int64(len(members)) {
		t.Errorf("member_count: got %d, want %d", grp.MemberCount, len(members))
	}
	owner := map[uint32]string{}
	for _, uid := range members {
		m, err := s.Member(t.Context(), gid, uid)
		if err != nil {
			t.Errorf("Member(%s): %v", uid, err)
			continue
		}
		if other, dup := owner[m.Ordinal]; dup {
			t.Errorf("ordinal %d held by %s and %s", m.Ordinal, other, uid)
		}
		owner[m.Ordinal] = uid
		if m.Ordinal >= bound {
			t.Errorf("%s: ordinal %d, want < %d", uid, m.Ordinal, bound)
		}
	}
}
