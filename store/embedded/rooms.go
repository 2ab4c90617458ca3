package embedded

import (
	"context"
	"errors"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// The waiting room's journal (fanout/waitroom.Journal, which Store
// satisfies without importing it) lives under its own key prefix; its
// keys and values are the waiting room's, opaque here.
//
//	w key -> value
const pRoom = 'w'

// ScanRooms calls fn for every waiting-room record, in key order, with the
// prefix stripped. It reads the engine's latest state, not the read view:
// the room journal is written without an fsync (see WriteRooms), and it is
// read once, when the node starts.
func (s *Store) ScanRooms(ctx context.Context, fn func(key, value []byte) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pRoom}, UpperBound: []byte{pRoom + 1}})
	if err != nil {
		return dbErr("scan rooms", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		if err := ctx.Err(); err != nil {
			it.Close()
			return err
		}
		if err := fn(it.Key()[1:], it.Value()); err != nil {
			it.Close()
			return err
		}
	}
	return dbErr("scan rooms", errors.Join(it.Error(), it.Close()))
}

// WriteRooms applies one batch of waiting-room records atomically: keys[i]
// is set to values[i], or deleted when values[i] is nil. A room changes on
// every enter, admission and heartbeat, and an fsync each would bound a
// flash crowd's enters by the disk: so a batch waits for an fsync of the
// WAL only when none did for RoomSyncEvery (the waiting room writes every
// room's heartbeat once a second, so there is always a next batch). A
// crash of the machine loses at most the last RoomSyncEvery of room
// changes, like Redis with appendfsync everysec; a crash of the process
// alone loses at most what the engine had not yet written to the WAL
// (it writes in the background, within milliseconds).
func (s *Store) WriteRooms(keys, values [][]byte) error {
	if len(keys) != len(values) {
		return errors.New("embedded: write rooms: keys and values differ in length")
	}
	if err := s.enter(context.Background()); err != nil {
		return err
	}
	defer s.leave()
	b := s.db.NewBatch()
	defer b.Close()
	var kb []byte
	for i, k := range keys {
		kb = append(append(kb[:0], pRoom), k...)
		var err error
		if values[i] == nil {
			err = b.Delete(kb, nil)
		} else {
			err = b.Set(kb, values[i], nil)
		}
		if err != nil {
			return dbErr("write rooms", err)
		}
	}
	wo := pebble.NoSync
	now := time.Now().UnixNano()
	if last := s.roomSync.Load(); now-last >= int64(RoomSyncEvery) && s.roomSync.CompareAndSwap(last, now) {
		wo = pebble.Sync
	}
	if err := b.Commit(wo); err != nil {
		return dbErr("write rooms: commit", err)
	}
	return nil
}

// RoomSyncEvery bounds the time between two fsyncs of waiting-room
// changes (WriteRooms).
const RoomSyncEvery = time.Second
