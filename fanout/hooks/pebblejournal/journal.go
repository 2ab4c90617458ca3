// Package pebblejournal is the event journal of embedded mode: the
// undelivered events and the delivery cursor in a pebble database of
// their own (docs/architecture.md §17), fsynced on every append and ack.
//
// Invariants: record ids are dense and increasing; an Append is durable
// when it returns, and visible to Read only then (appends are serialized
// under one mutex, so a reader never sees id N+1 before N); the cursor
// only moves forward, and records at or below it are deleted in the same
// synced batch. Capacity bounds the records after the cursor (ErrFull).
// No goroutines of its own.
package pebblejournal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/fanfare-im/fanfare/fanout/hooks"
)

var (
	cursorKey = []byte("c")
	recPrefix = byte('r')
)

func recKey(id uint64) []byte {
	k := make([]byte, 9)
	k[0] = recPrefix
	binary.BigEndian.PutUint64(k[1:], id)
	return k
}

// Journal is a pebble-backed hooks.Journal.
type Journal struct {
	db       *pebble.DB
	capacity int64

	mu     sync.Mutex
	next   uint64 // id of the next record
	cursor uint64 // last delivered id
}

var _ hooks.Journal = (*Journal)(nil)

// Open opens (or creates) the journal in dir, holding at most capacity
// undelivered records.
func Open(dir string, capacity int) (*Journal, error) {
	if capacity < 1 {
		return nil, fmt.Errorf("pebblejournal: capacity %d < 1", capacity)
	}
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest, Logger: quiet{}})
	if err != nil {
		return nil, fmt.Errorf("pebblejournal: %w", err)
	}
	j := &Journal{db: db, capacity: int64(capacity)}
	if v, closer, err := db.Get(cursorKey); err == nil {
		j.cursor = binary.BigEndian.Uint64(v)
		closer.Close()
	} else if !errors.Is(err, pebble.ErrNotFound) {
		db.Close()
		return nil, fmt.Errorf("pebblejournal: %w", err)
	}
	j.next = j.cursor + 1
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{recPrefix}, UpperBound: []byte{recPrefix + 1}})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("pebblejournal: %w", err)
	}
	if it.Last() {
		j.next = max(j.next, binary.BigEndian.Uint64(it.Key()[1:])+1)
	}
	if err := it.Close(); err != nil {
		db.Close()
		return nil, fmt.Errorf("pebblejournal: %w", err)
	}
	return j, nil
}

// Append implements hooks.Journal.
// It does not read ctx: a local fsync is not cancelled halfway.
func (j *Journal) Append(_ context.Context, recs [][]byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if int64(j.next-1-j.cursor)+int64(len(recs)) > j.capacity {
		return hooks.ErrFull
	}
	b := j.db.NewBatch()
	defer b.Close()
	for i, r := range recs {
		if err := b.Set(recKey(j.next+uint64(i)), r, nil); err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("pebblejournal: %w", err)
	}
	j.next += uint64(len(recs))
	return nil
}

// Read implements hooks.Journal.
func (j *Journal) Read(ctx context.Context, max int) ([]hooks.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	j.mu.Lock()
	from, to := j.cursor+1, j.next
	j.mu.Unlock()
	if from >= to {
		return nil, nil
	}
	it, err := j.db.NewIter(&pebble.IterOptions{LowerBound: recKey(from), UpperBound: recKey(to)})
	if err != nil {
		return nil, err
	}
	var out []hooks.Record
	for ok := it.First(); ok && len(out) < max; ok = it.Next() {
		id := binary.BigEndian.Uint64(it.Key()[1:])
		out = append(out, hooks.Record{ID: strconv.FormatUint(id, 10), Data: append([]byte(nil), it.Value()...)})
	}
	return out, it.Close()
}

// Ack implements hooks.Journal.
func (j *Journal) Ack(ctx context.Context, id string) error {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return fmt.Errorf("pebblejournal: bad id %q", id)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if n <= j.cursor {
		return nil
	}
	if n >= j.next {
		return fmt.Errorf("pebblejournal: ack of %d past the last record %d", n, j.next-1)
	}
	b := j.db.NewBatch()
	defer b.Close()
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], n)
	if err := b.Set(cursorKey, v[:], nil); err != nil {
		return err
	}
	if err := b.DeleteRange(recKey(j.cursor+1), recKey(n+1), nil); err != nil {
		return err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("pebblejournal: %w", err)
	}
	j.cursor = n
	return nil
}

// Pending implements hooks.Journal.
func (j *Journal) Pending(context.Context) (int64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return int64(j.next - 1 - j.cursor), nil
}

// Close closes the database.
func (j *Journal) Close() error { return j.db.Close() }

// quiet keeps pebble's informational lines out of fanfared's JSON log;
// errors surface through the calls that fail.
type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("pebblejournal: "+format, args...))
}
