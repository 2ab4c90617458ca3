package embedded

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	bolt "go.etcd.io/bbolt"
)

// BenchmarkEngine reproduces the measurement behind the choice of pebble
// over bbolt (doc.go): the raw key-value work of Append (a message key
// gid|seq, a random idempotency key, the group's last_seq), committed with
// an fsync per batch, into a database that already holds prefill messages
// over 1,000 groups; and a 200-message range read. Run:
//
//	go test -run '^$' -bench Engine -benchtime 3s ./store/embedded/
func BenchmarkEngine(b *testing.B) {
	const prefill = 100_000
	for _, engine := range []string{"bbolt", "pebble"} {
		b.Run("engine="+engine, func(b *testing.B) {
			e := openEngine(b, engine)
			defer e.close()
			for range prefill / 1000 {
				e.commit(1000)
			}
			for _, batch := range []int{1, 100, 500} {
				b.Run(fmt.Sprintf("op=append/batch=%d", batch), func(b *testing.B) {
					for b.Loop() {
						e.commit(batch)
					}
					b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
				})
			}
			b.Run("op=range/n=200", func(b *testing.B) {
				for b.Loop() {
					if n := e.read(1 + rand.Int64N(1000)); n < 100 {
						b.Fatalf("read %d messages, want at least 100", n)
					}
				}
			})
		})
	}
}

// kvEngine is the raw workload on one engine.
type kvEngine struct {
	bolt   *bolt.DB
	pebble *pebble.DB
	last   [1001]int64
	body   []byte
}

func openEngine(b *testing.B, engine string) *kvEngine {
	e := &kvEngine{body: make([]byte, 200)}
	var err error
	switch engine {
	case "bbolt":
		e.bolt, err = bolt.Open(b.TempDir()+"/db", 0o600, &bolt.Options{
			NoFreelistSync: true, FreelistType: bolt.FreelistMapType, InitialMmapSize: 1 << 30})
		if err == nil {
			err = e.bolt.Update(func(tx *bolt.Tx) error {
				for _, name := range []string{"m", "g", "i"} {
					if _, err := tx.CreateBucket([]byte(name)); err != nil {
						return err
					}
				}
				return nil
			})
		}
	case "pebble":
		opts := &pebble.Options{MemTableSize: DefaultMemTable, Logger: pebbleLogger{discardLogger()}}
		e.pebble, err = pebble.Open(b.TempDir(), opts)
	}
	if err != nil {
		b.Fatal(err)
	}
	return e
}

func (e *kvEngine) close() {
	if e.bolt != nil {
		e.bolt.Close()
	}
	if e.pebble != nil {
		e.pebble.Close()
	}
}

func (e *kvEngine) next() (mk, ik, gk, gv []byte) {
	gid := 1 + rand.Int64N(1000)
	e.last[gid]++
	mk = msgKey(nil, gid, e.last[gid])
	ik = idemKey(nil, gid, "user"+strconv.Itoa(rand.IntN(1e6)), strconv.FormatUint(rand.Uint64(), 36))
	gk = groupKey(nil, gid)
	gv = binary.BigEndian.AppendUint64(nil, uint64(e.last[gid]))
	return
}

func (e *kvEngine) commit(n int) {
	if e.bolt != nil {
		err := e.bolt.Update(func(tx *bolt.Tx) error {
			m, g, id := tx.Bucket([]byte("m")), tx.Bucket([]byte("g")), tx.Bucket([]byte("i"))
			for range n {
				mk, ik, gk, gv := e.next()
				if err := errorsJoin(m.Put(mk, e.body), id.Put(ik, mk), g.Put(gk, gv)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			panic(err)
		}
		return
	}
	bt := e.pebble.NewBatch()
	defer bt.Close()
	for range n {
		mk, ik, gk, gv := e.next()
		bt.Set(mk, e.body, nil)
		bt.Set(ik, mk, nil)
		bt.Set(gk, gv, nil)
	}
	if err := bt.Commit(pebble.Sync); err != nil {
		panic(err)
	}
}

func (e *kvEngine) read(gid int64) int {
	lo, hi := msgKey(nil, gid, 1), msgKey(nil, gid, 201)
	n := 0
	if e.bolt != nil {
		e.bolt.View(func(tx *bolt.Tx) error {
			c := tx.Bucket([]byte("m")).Cursor()
			for k, v := c.Seek(lo); k != nil && string(k) < string(hi); k, v = c.Next() {
				_ = append([]byte(nil), v...)
				n++
			}
			return nil
		})
		return n
	}
	it, err := e.pebble.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		panic(err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		_ = append([]byte(nil), it.Value()...)
		n++
	}
	it.Close()
	return n
}

func errorsJoin(errs ...error) error { return errors.Join(errs...) }

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
