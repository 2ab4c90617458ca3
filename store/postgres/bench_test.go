package postgres

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/storetest"
)

// Benchmarks of the Postgres store against the shared test database
// (FANFARE_TEST_POSTGRES_URL). Run:
//
//	go test -run '^$' -bench . -benchtime 5s ./store/postgres/
//
// BenchmarkAppend measures acked messages per second from closed-loop
// senders (each waits for its ack before sending again), through the one
// benchmark every backend shares (storetest.BenchAppend). The modes, all
// in one run so that they compare:
//   - batched: through a stand-in for the engine's shard workers (a few
//     workers, each committing everything pending as one Append per
//     flush), with concurrent Appends merged (Config.AppendStatements
//     default) on the current schema;
//   - before: the same workers with merging off, on a schema that still
//     has the two messages CHECKs of migration 0001 (what the store was
//     before migration 0003 and merging);
//   - naive: the baseline, every send its own Append and transaction,
//     merging off;
//   - direct: every send its own Append, merging on (callers that do not
//     batch themselves).

// Batcher shape: 4 workers, each flushing when its queue is empty for 1 ms
// or at 1024 sends; overridable for exploration (FANFARE_BENCH_WORKERS,
// FANFARE_BENCH_LINGER_US).
var (
	benchWorkers = envInt("FANFARE_BENCH_WORKERS", 4)
	benchLinger  = time.Duration(envInt("FANFARE_BENCH_LINGER_US", 1000)) * time.Microsecond
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// benchFixture is a schema with groups whose members are the senders.
type benchFixture struct {
	s       *Store
	gids    []int64
	senders []string
	member  [][]int64 // sender index -> gids it may send to
}

var (
	fixtureMu sync.Mutex
	fixtures  = map[string]*benchFixture{}
)

// fixture returns (creating once per process) groups groups and senders
// senders; sender i is a member of every group when groups <= 10, else of
// the groups g with g % 10 == i % 10.
func fixture(b *testing.B, groups, senders int) *benchFixture {
	return fixtureChecks(b, groups, senders, false)
}

// sqlOldChecks puts back the messages CHECKs that migration 0003 dropped.
const sqlOldChecks = `ALTER TABLE messages ADD CONSTRAINT messages_seq_check CHECK (seq > 0),
	ADD CONSTRAINT messages_kind_check CHECK (kind IN ('text', 'at_all'))`

// fixtureChecks is fixture; oldChecks puts back the CHECKs on messages.
func fixtureChecks(b *testing.B, groups, senders int, oldChecks bool) *benchFixture {
	b.Helper()
	key := fmt.Sprint(groups, "/", senders, "/", oldChecks)
	fixtureMu.Lock()
	defer fixtureMu.Unlock()
	if f, ok := fixtures[key]; ok {
		return f
	}
	ctx := context.Background()
	schema := newBenchSchema(b)
	s, err := Open(ctx, Config{URL: testURL(), Schema: schema, MaxConns: 16})
	if err != nil {
		b.Fatalf("open %s (is Postgres running?): %v", testURL(), err)
	}
	if oldChecks {
		if _, err := s.pool.Exec(ctx, sqlOldChecks); err != nil {
			b.Fatal(err)
		}
	}
	// FANFARE_BENCH_FIXTURE_SQL changes the schema for an experiment (say,
	// dropping an index to see what it costs).
	if q := os.Getenv("FANFARE_BENCH_FIXTURE_SQL"); q != "" {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	f := &benchFixture{s: s, member: make([][]int64, senders)}
	for i := range senders {
		f.senders = append(f.senders, "sender"+strconv.Itoa(i))
	}
	for g := range groups {
		grp, err := s.CreateGroup(ctx, store.Group{Name: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		f.gids = append(f.gids, grp.GID)
		var ms []string
		for i := range senders {
			if groups <= 10 || g%10 == i%10 {
				ms = append(ms, f.senders[i])
				f.member[i] = append(f.member[i], grp.GID)
			}
		}
		if _, err := s.AddMembers(ctx, grp.GID, ms); err != nil {
			b.Fatal(err)
		}
	}
	fixtures[key] = f
	return f
}

// benchSchemas are dropped by TestMain after all benchmarks ran.
var benchSchemas []string

func newBenchSchema(b *testing.B) string {
	var r [6]byte
	for i := range r {
		r[i] = "0123456789abcdef"[rand.IntN(16)]
	}
	schema := "fanfare_bench_" + string(r[:])
	benchSchemas = append(benchSchemas, schema)
	return schema
}

func BenchmarkAppend(b *testing.B) {
	for _, groups := range []int{1000, 1} {
		for _, mode := range benchModes {
			name := fmt.Sprintf("groups=%d/senders=200/mode=%s", groups, mode)
			b.Run(name, func(b *testing.B) { benchAppend(b, groups, 200, mode) })
		}
	}
}

// FANFARE_BENCH_STATEMENTS overrides Config.AppendStatements of the
// merged modes.

// benchModes are BenchmarkAppend's modes (see above), in the order they
// run; FANFARE_BENCH_MODES (comma-separated) picks some.
var benchModes = strings.Split(cmp.Or(os.Getenv("FANFARE_BENCH_MODES"), "before,batched,naive,direct"), ",")

func benchAppend(b *testing.B, groups, senders int, mode string) {
	f := fixtureChecks(b, groups, senders, mode == "before")
	st := *f.s
	if n := envInt("FANFARE_BENCH_STATEMENTS", 0); n != 0 {
		st.merge = newMerger(n, st.lim.MaxBatch)
	}
	if mode == "before" || mode == "naive" {
		st.merge = nil
	}
	if os.Getenv("FANFARE_BENCH_ONE_UPDATE") != "" && mode != "before" {
		st.fastSQL = sqlAppendOneUpdate
	}
	var st0, calls0 int64
	if st.merge != nil {
		st0, calls0 = st.merge.statements.Load(), st.merge.calls.Load()
	}
	pgStats := os.Getenv("FANFARE_BENCH_PGSTATS") != ""
	var p0 pgSnap
	if pgStats {
		p0 = snapPG(b, f.s)
	}
	storetest.BenchAppend(b, &st, storetest.Load{Senders: f.senders, Groups: f.member, Body: []byte(storetest.BenchBody),
		Batched: mode == "batched" || mode == "before", Workers: benchWorkers, Linger: benchLinger})
	if pgStats {
		reportPG(b, p0, snapPG(b, f.s), b.N)
	}
	if st.merge != nil {
		if n := st.merge.statements.Load() - st0; n > 0 {
			b.ReportMetric(float64(st.merge.calls.Load()-calls0)/float64(n), "calls/stmt")
			b.ReportMetric(float64(b.N)/float64(n), "msgs/stmt")
		}
	}
}

// BenchmarkMessagesRange reads 200 messages at random offsets of a group
// holding 20,000; it reports p50 and p99 latency.
func BenchmarkMessagesRange(b *testing.B) {
	f := fixture(b, 1, 200)
	ctx := context.Background()
	gid, uid := f.gids[0], f.senders[0]
	g, err := f.s.Group(ctx, gid)
	if err != nil {
		b.Fatal(err)
	}
	const want = 20000
	for g.LastSeq < want {
		n := min(1000, want-int(g.LastSeq))
		reqs := make([]store.AppendRequest, n)
		for i := range reqs {
			reqs[i] = store.AppendRequest{GID: gid, Sender: uid, ClientMsgID: storetest.NextClientMsgID(), Body: []byte(storetest.BenchBody)}
		}
		if err := f.s.Append(ctx, reqs, make([]store.AppendResult, n)); err != nil {
			b.Fatal(err)
		}
		g.LastSeq += int64(n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	for b.Loop() {
		from := 1 + rng.Int64N(g.LastSeq-200)
		t0 := time.Now()
		msgs, _, err := f.s.Messages(ctx, gid, uid, from, 0, 200, 0)
		lat = append(lat, time.Since(t0))
		if err != nil || len(msgs) != 200 {
			b.Fatalf("got %d messages, %v; want 200", len(msgs), err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}

// BenchmarkAppendBatch measures one Append (one transaction) of batch
// messages from one goroutine: the cost of a flush, without concurrency.
// groups=1000 spreads a batch over the 1,000 groups (about one group per
// message, 16 partitions), groups=1 puts it all in one group (one
// partition, one group row): the difference is the per-group and
// per-partition work. path compares the one-statement Append with the
// two-round-trip path that batches holding retries take, inserting with
// one INSERT from arrays or with COPY (FANFARE_BENCH_PATHS picks some).
// With FANFARE_BENCH_PGSTATS it reports the server's CPU and WAL per
// message, as BenchmarkAppend does: batch=1 against batch=500 separates
// the per-statement from the per-message work.
func BenchmarkAppendBatch(b *testing.B) {
	f := fixture(b, 1000, 200)
	ctx := context.Background()
	paths := strings.Split(cmp.Or(os.Getenv("FANFARE_BENCH_PATHS"), "one-statement,two-step,two-step-copy"), ",")
	pgStats := os.Getenv("FANFARE_BENCH_PGSTATS") != ""
	for _, n := range []int{1, 50, 500} {
		for _, groups := range []int{1000, 1} {
			for _, path := range paths {
				// batch first, so that -bench 'BenchmarkAppend/groups=1000/' does not match these
				b.Run(fmt.Sprintf("batch=%d/groups=%d/path=%s", n, groups, path), func(b *testing.B) {
					st := *f.s
					st.merge = nil
					st.twoStep = path != "one-statement"
					st.copyInsert = path == "two-step-copy"
					rng := rand.New(rand.NewPCG(3, 4))
					reqs := make([]store.AppendRequest, n)
					res := make([]store.AppendResult, n)
					var p0 pgSnap
					if pgStats {
						p0 = snapPG(b, f.s)
					}
					b.ReportAllocs()
					for b.Loop() {
						for i := range reqs {
							si := rng.IntN(len(f.senders))
							gids := f.member[si]
							gid := gids[rng.IntN(len(gids))]
							if groups == 1 { // the senders of f.gids[0]: every tenth (see fixture)
								si, gid = 10*rng.IntN(len(f.senders)/10), f.gids[0]
							}
							reqs[i] = store.AppendRequest{GID: gid, Sender: f.senders[si],
								ClientMsgID: storetest.NextClientMsgID(), Body: []byte(storetest.BenchBody)}
						}
						if err := st.Append(ctx, reqs, res); err != nil {
							b.Fatal(err)
						}
						for i := range res {
							if res[i].Err != nil {
								b.Fatal(res[i].Err)
							}
						}
					}
					b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "msgs/s")
					if pgStats {
						reportPG(b, p0, snapPG(b, f.s), b.N*n)
					}
				})
			}
		}
	}
}

// pgSnap is what the server did so far, for per-message figures: the CPU
// of its processes (read from /proc, so only for a server on this
// machine; 0 otherwise) and the WAL position.
type pgSnap struct {
	cpu time.Duration
	lsn int64
}

func snapPG(b *testing.B, s *Store) pgSnap {
	ctx := context.Background()
	var p pgSnap
	if err := s.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&p.lsn); err != nil {
		b.Fatal(err)
	}
	rows, err := s.pool.Query(ctx, `SELECT pid FROM pg_stat_activity`)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // not on this machine, or gone
		}
		// After the parenthesised command: utime and stime are the 12th
		// and 13th fields.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		p.cpu += time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
	}
	return p
}

// reportPG reports the server's CPU and WAL bytes per message between
// two snapshots, when FANFARE_BENCH_PGSTATS is set (it expects the
// server on this machine, alone: another client's work counts too).
func reportPG(b *testing.B, p0, p1 pgSnap, msgs int) {
	n := float64(msgs)
	if p1.cpu > 0 {
		b.ReportMetric(float64((p1.cpu-p0.cpu).Microseconds())/n, "pg-cpu-us/msg")
	}
	b.ReportMetric(float64(p1.lsn-p0.lsn)/n, "wal-B/msg")
}

// sqlAppendOneUpdate is an experiment (FANFARE_BENCH_ONE_UPDATE): sqlAppend
// with the group row lock taken by the UPDATE that advances last_seq,
// instead of a FOR NO KEY UPDATE before it, so that each group costs one
// heap record instead of two. It is not safe for production: an UPDATE
// locks rows in the order of its join, not in gid order (two statements
// could deadlock), a group closed after the statement's snapshot leaves its
// accepted requests without a seq, and it checks membership before the
// group's state.
const sqlAppendOneUpdate = `
WITH r AS (
	SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bytea[])
		WITH ORDINALITY AS r(gid, sender, cid, kind, body, i)
), m AS MATERIALIZED (
	SELECT r.*, mm.muted FROM r LEFT JOIN LATERAL (SELECT muted FROM group_members
		WHERE gid = r.gid AND uid = r.sender LIMIT 1) mm ON true
), c AS (
	SELECT gid, count(*) AS n FROM m WHERE muted = false GROUP BY gid
), adv AS MATERIALIZED (
	UPDATE groups g SET last_seq = g.last_seq + c.n FROM c
	WHERE g.gid = c.gid AND g.state = 'active'
	RETURNING g.gid, g.last_seq - c.n AS base, g.member_version
), gs AS (
	SELECT gid, member_version FROM groups WHERE gid = ANY($6::bigint[])
), v AS MATERIALIZED (
	SELECT m.i, m.gid, m.sender, m.cid, m.kind, m.body, adv.base,
		coalesce(adv.member_version, gs.member_version) AS member_version,
		CASE WHEN gs.gid IS NULL THEN 1 WHEN m.muted IS NULL THEN 3 WHEN m.muted THEN 4
		     WHEN adv.gid IS NULL THEN 2 ELSE 0 END AS status
	FROM m LEFT JOIN adv ON adv.gid = m.gid LEFT JOIN gs ON gs.gid = m.gid
), ok AS MATERIALIZED (
	SELECT i, gid, sender, cid, kind, body,
		base + row_number() OVER (PARTITION BY gid ORDER BY i) AS seq
	FROM v WHERE status = 0
), ins AS (
	INSERT INTO messages (gid, seq, sender, client_msg_id, kind, body, created_at)
	SELECT gid, seq, sender, cid, kind, body, now() FROM ok
)
SELECT v.i, v.status, coalesce(ok.seq, 0), now(), coalesce(v.member_version, 0) FROM v LEFT JOIN ok ON ok.i = v.i`
