package waitroom

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Journal is the durable storage under a Memory backend in embedded mode,
// so that rooms (configurations and queues) survive a restart as they do
// in Redis: an ordered key-value space of the waiting room's own, with
// atomic batches. The keys and values are opaque to it (their layout is
// below); store/embedded implements it in the node's pebble database.
type Journal interface {
	// ScanRooms calls fn for every key and value, in key order; fn must
	// not keep either after it returns.
	ScanRooms(ctx context.Context, fn func(key, value []byte) error) error
	// WriteRooms applies one batch atomically: keys[i] is set to values[i],
	// or deleted when values[i] is nil. It takes no context: it records a
	// change Memory has already made, which a cancellation must not split.
	WriteRooms(keys, values [][]byte) error
}

// Journal key layout. A room name is 1-64 bytes of [A-Za-z0-9_.-], so one
// length byte delimits it from the uid.
//
//	c name            -> RoomConfig (JSON)
//	r name            -> the room's counters (memMeta, JSON)
//	e len(name) name uid -> one entry (encEntry)
const (
	jConfig = 'c'
	jMeta   = 'r'
	jEntry  = 'e'
)

func configKey(name string) []byte { return append([]byte{jConfig}, name...) }
func metaKey(name string) []byte   { return append([]byte{jMeta}, name...) }

func entryKey(name, uid string) []byte {
	k := make([]byte, 0, 2+len(name)+len(uid))
	k = append(append(append(k, jEntry, byte(len(name))), name...), uid...)
	return k
}

// errCorruptJournal reports a journal record that does not decode.
var errCorruptJournal = errors.New("waitroom: corrupt journal record")

func encConfig(c *RoomConfig) ([]byte, error) { return json.Marshal(c) }

// memMeta is a room's state besides its entries. The VIP placement log is
// not kept: it only feeds vip_ahead_notice to connected users, and after a
// restart nobody is connected (Trim drops it too).
type memMeta struct {
	Tokens   float64          `json:"tokens"`
	TokenTS  int64            `json:"token_ts_us"`
	ShareV   float64          `json:"share_v"`
	ShareN   float64          `json:"share_n"`
	Rate     float64          `json:"rate"`
	LMax     int64            `json:"lmax"`
	LMaxSet  bool             `json:"lmax_set"`
	PlaceSeq int64            `json:"place_seq"`
	Adm      map[int64]int64  `json:"adm"`
	Nodes    map[string]int64 `json:"nodes"`
	Passes   int64            `json:"passes,omitempty"`
	Viol     int64            `json:"max_wait_violations,omitempty"`
	PreN     int64            `json:"pre_n,omitempty"`
	PreAt    int64            `json:"pre_at,omitempty"`
	OSeq     int64            `json:"owed_seq,omitempty"`
}

// Entry record: level(1) state(1) smoothing(1) join(8) first(8) bias(8)
// score(8) away(8) admitted(8) expires(8) [slack(8)] [seq(8)] node(rest);
// floats as IEEE bits.
const entryRecLen = 3 + 7*8

// entryV2 is set in the flags byte of records that carry the slack key
// after the seven times (records written before the max-wait guarantee
// have none: their slack reads 0, which only holds back VIP passes);
// entryV3 of records that carry the entry seq after it (older records read
// seq 0: such a normal user was owed before every later promise, such a
// VIP holds back the quota for later normal users until it is admitted).
const (
	entryV2 = 2
	entryV3 = 4
)

func encEntry(e *memEntry, smoothing bool) []byte {
	b := make([]byte, 0, entryRecLen+len(e.node))
	sm := byte(0)
	if smoothing {
		sm = 1
	}
	b = append(b, byte(e.level), byte(e.state), sm|entryV2|entryV3)
	for _, v := range []uint64{uint64(e.join), uint64(e.first), math.Float64bits(e.bias), math.Float64bits(e.score),
		uint64(e.away), uint64(e.admitted), uint64(e.expires), uint64(e.slack), uint64(e.seq)} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return append(b, e.node...)
}

func decEntry(v []byte) (e memEntry, smoothing bool, err error) {
	if len(v) < entryRecLen || v[0] > MaxTier || EntryState(v[1]) > EntryScheduled || EntryState(v[1]) == EntryNone {
		return e, false, errCorruptJournal
	}
	e.level, e.state, smoothing = int(v[0]), EntryState(v[1]), v[2]&1 == 1
	n := entryRecLen
	if v[2]&entryV2 != 0 {
		if len(v) < entryRecLen+8 {
			return e, false, errCorruptJournal
		}
		e.slack = int64(binary.BigEndian.Uint64(v[entryRecLen:]))
		n += 8
		if v[2]&entryV3 != 0 {
			if len(v) < n+8 {
				return e, false, errCorruptJournal
			}
			e.seq = int64(binary.BigEndian.Uint64(v[n:]))
			n += 8
		}
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(v[3+8*i:]) }
	e.join, e.first = int64(u(0)), int64(u(1))
	e.bias, e.score = math.Float64frombits(u(2)), math.Float64frombits(u(3))
	e.away, e.admitted, e.expires = int64(u(4)), int64(u(5)), int64(u(6))
	e.node = string(v[n:])
	return e, smoothing, nil
}

// OpenMemory returns an in-process backend that keeps its rooms in j: the
// configurations and every room's queue, away users, admitted sessions,
// token bucket and admission window are read back from j, and every
// operation writes what it changed before it returns.
//
// What j holds was left by a process that is gone, and so are its
// sockets: a user who was waiting becomes away from the last heartbeat of
// its node (it keeps its position for Grace and decays after, as after
// any disconnect), and an admitted session is held for the user for
// NodeTimeout from that heartbeat, then ended (reason disconnect) by
// Maintain unless the user entered again (MaintainRequest.NodeTimeout);
// the same as when a node of a cluster dies.
func OpenMemory(ctx context.Context, j Journal, cfg MemoryConfig) (*Memory, error) {
	if j == nil {
		return nil, errors.New("waitroom: OpenMemory needs a Journal")
	}
	m := NewMemory(cfg)
	m.j = j
	if err := m.load(ctx); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, r := range m.rooms {
		r.restarted()
		var err error
		m.persistLocked(name, r, &err)
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// load reads every record of m.j into m, exactly as it was written.
func (m *Memory) load(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.j.ScanRooms(ctx, func(k, v []byte) error {
		if len(k) < 2 {
			return fmt.Errorf("%w: key %q", errCorruptJournal, k)
		}
		switch k[0] {
		case jConfig:
			var c RoomConfig
			if err := json.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("%w: config of room %q: %w", errCorruptJournal, k[1:], err)
			}
			m.configs[c.Name] = c.WithDefaults()
		case jMeta:
			var mm memMeta
			if err := json.Unmarshal(v, &mm); err != nil {
				return fmt.Errorf("%w: counters of room %q: %w", errCorruptJournal, k[1:], err)
			}
			r := m.roomLocked(string(k[1:]))
			r.tokens, r.tokenTS, r.shareV, r.shareN = mm.Tokens, mm.TokenTS, mm.ShareV, mm.ShareN
			r.rate, r.lmax, r.lmaxSet, r.placeSeq = mm.Rate, mm.LMax, mm.LMaxSet, mm.PlaceSeq
			r.passes, r.viol, r.preN, r.preAt, r.oseq = mm.Passes, mm.Viol, mm.PreN, mm.PreAt, mm.OSeq
			for s, c := range mm.Adm {
				r.adm[s] = c
			}
			for n, hb := range mm.Nodes {
				r.nodes[n] = hb
			}
		case jEntry:
			n := int(k[1])
			if len(k) < 2+n {
				return fmt.Errorf("%w: key %q", errCorruptJournal, k)
			}
			name, uid := string(k[2:2+n]), string(k[2+n:])
			e, smoothing, err := decEntry(v)
			if err != nil {
				return fmt.Errorf("%w: room %q uid %q", err, name, uid)
			}
			m.roomLocked(name).restore(uid, &e, smoothing)
		default:
			return fmt.Errorf("%w: key %q", errCorruptJournal, k)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waitroom: load rooms: %w", err)
	}
	for _, r := range m.rooms {
		clear(r.dirty)
		r.metaDirty = false
	}
	return nil
}

// restore puts a loaded entry into the table and its indexes.
func (r *memRoom) restore(uid string, e *memEntry, smoothing bool) {
	r.entries[uid] = e
	switch e.state {
	case EntryWaiting:
		r.q.Insert(e.score, uid)
		r.j.Insert(float64(e.join), uid)
		r.byTier[e.level]++
		if e.level > 0 {
			r.qv.Insert(e.score, uid)
			r.jv.Insert(float64(e.seq), uid)
		} else {
			r.qn.Insert(e.score, uid)
		}
	case EntryAway:
		r.away.Insert(float64(e.away), uid)
	case EntryActive:
		r.active.Insert(float64(e.expires), uid)
	case EntryScheduled:
		r.pre.Insert(e.score, uid)
	}
	if e.state == EntryWaiting || e.state == EntryAway {
		r.sl.Insert(float64(e.slack), uid)
	}
	if smoothing {
		r.smooth.Insert(float64(e.join), uid)
	}
	eachHolder(e.node, func(n string) {
		set := r.owned[n]
		if set == nil {
			set = make(map[string]struct{})
			r.owned[n] = set
		}
		set[uid] = struct{}{}
	})
}

// goneNode names, in a loaded room, a node of the process that wrote the
// journal. '~' is not allowed in node names (ValidNode), so a new process
// heartbeating under the same name never keeps the old sockets' entries
// alive.
func goneNode(node string) string {
	if strings.HasPrefix(node, "~") {
		return node
	}
	return "~" + node
}

// restarted applies, after a load, that the sockets of every node are
// gone (see OpenMemory).
func (r *memRoom) restarted() {
	uids := make([]string, 0, len(r.entries))
	for uid, e := range r.entries {
		if e.node != "" {
			uids = append(uids, uid)
		}
	}
	for _, uid := range uids {
		e := r.entries[uid]
		hb, ok := int64(0), false
		eachHolder(e.node, func(n string) {
			if h, has := r.nodes[n]; has && h > hb {
				hb, ok = h, true
			}
		})
		if !ok {
			hb = max(e.join, e.admitted)
		}
		first := firstHolder(e.node)
		r.disownAll(uid, e)
		switch e.state {
		case EntryWaiting:
			r.unqueue(uid, e)
			e.state, e.away = EntryAway, hb
			r.away.Insert(float64(hb), uid)
		case EntryScheduled:
			e.away = hb
		case EntryActive:
			gone := goneNode(first)
			r.own(uid, e, gone, hb)
			if old, ok := r.nodes[gone]; !ok || old < hb {
				r.nodes[gone] = hb
			}
		}
	}
	for n := range r.nodes {
		if len(r.owned[n]) == 0 && !strings.HasPrefix(n, "~") {
			delete(r.nodes, n) // a live node heartbeats again
			r.metaDirty = true
		}
	}
}

// persistLocked writes what the operation that just ran changed in room
// name: the touched entries (deleted when gone) and the room's counters.
// A failed write is returned (wrapped in ErrUnavailable) with the change
// still in memory and still dirty, so the next operation writes it again.
// It only fails once the journal is closed (the node is stopping).
func (m *Memory) persistLocked(name string, r *memRoom, errp *error) {
	if m.j == nil || *errp != nil || (len(r.dirty) == 0 && !r.metaDirty) {
		return
	}
	keys := make([][]byte, 0, len(r.dirty)+1)
	vals := make([][]byte, 0, len(r.dirty)+1)
	for uid := range r.dirty {
		keys = append(keys, entryKey(name, uid))
		var v []byte
		if e := r.entries[uid]; e != nil {
			v = encEntry(e, r.smooth.Has(float64(e.join), uid))
		}
		vals = append(vals, v)
	}
	mm := memMeta{Tokens: r.tokens, TokenTS: r.tokenTS, ShareV: r.shareV, ShareN: r.shareN, Rate: r.rate,
		LMax: r.lmax, LMaxSet: r.lmaxSet, PlaceSeq: r.placeSeq, Adm: r.adm, Nodes: r.nodes,
		Passes: r.passes, Viol: r.viol, PreN: r.preN, PreAt: r.preAt, OSeq: r.oseq}
	mv, err := json.Marshal(&mm)
	if err != nil {
		*errp = err
		return
	}
	keys, vals = append(keys, metaKey(name)), append(vals, mv)
	if err := m.write(keys, vals); err != nil {
		*errp = err
		return
	}
	clear(r.dirty)
	r.metaDirty = false
}

func (m *Memory) write(keys, vals [][]byte) error {
	if err := m.j.WriteRooms(keys, vals); err != nil {
		return fmt.Errorf("%w: room journal: %w", ErrUnavailable, err)
	}
	return nil
}
