package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanfare-im/fanfare/store"
)

// Config configures a Store. The zero value is not usable: URL is required.
type Config struct {
	// URL is the Postgres connection string
	// (postgres://user@host:port/db?sslmode=disable). Required.
	URL string
	// Schema is the schema holding fanfare's tables. "" = the server's
	// default search_path (public). When set, it is created if missing and
	// used as search_path on every pooled connection. Lowercase letters,
	// digits and '_', at most 63 bytes, not starting with a digit.
	Schema string
	// MaxConns is the pool size. 0 = max(4, 2*GOMAXPROCS).
	// A pool_max_conns in URL counts when MaxConns is 0.
	MaxConns int32
	// Limits bounds what the store accepts; zero fields mean the defaults.
	Limits store.Limits
	// SkipMigrate makes Open skip applying the embedded migrations. By
	// default Open migrates (a no-op when the schema is current).
	SkipMigrate bool
	// AppendStatements is the most Append statements in flight at once
	// when Append is called concurrently: calls arriving while that many
	// run are merged into the next statement (see merge.go). 0 =
	// DefaultAppendStatements (2); negative = no merging, every call is its
	// own statement and transaction.
	AppendStatements int
	// Logger receives migration and error logs. nil = discard.
	Logger *slog.Logger
}

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Validate reports every problem of c.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("postgres: URL is required"))
	} else if _, err := pgxpool.ParseConfig(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("postgres: bad URL: %w", err))
	}
	if err := validSchema(c.Schema); err != nil {
		errs = append(errs, err)
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("postgres: MaxConns %d is negative", c.MaxConns))
	}
	errs = append(errs, c.Limits.Problems("postgres")...)
	return errors.Join(errs...)
}

func validSchema(s string) error {
	if s != "" && !schemaRE.MatchString(s) {
		return fmt.Errorf("postgres: bad schema name %q: want [a-z_][a-z0-9_]*, at most 63 bytes", s)
	}
	return nil
}

// Store is the Postgres store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	lim  store.Limits
	log  *slog.Logger
	// copyInsert makes Append insert with COPY instead of one INSERT from
	// unnest'ed arrays (benchmark comparison only).
	copyInsert bool
	// twoStep makes Append always take the two-round-trip path
	// (benchmark comparison only).
	twoStep bool
	// fastSQL replaces sqlAppend (benchmark experiments only); "" = sqlAppend.
	fastSQL string
	// merge merges concurrent Append calls; nil = off.
	merge *merger
	// ping is Ping's own connection, outside the pool (nil until the
	// first Ping, and again after one fails): readiness asks whether
	// Postgres answers, not whether a pool slot is free, so a pool kept
	// busy by slow commits and polling clients does not fail /readyz.
	ping *pinger
}

// pinger is Ping's connection (nil until dialled) and how to dial it.
type pinger struct {
	mu   sync.Mutex
	conn *pgx.Conn
	cfg  *pgx.ConnConfig
}

var _ store.Store = (*Store)(nil)

// Open connects to Postgres, applies the migrations (unless
// cfg.SkipMigrate) and returns a Store. An unreachable database gives an
// error wrapping store.ErrUnavailable.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.MaxConns > 0:
		pcfg.MaxConns = cfg.MaxConns
	case !strings.Contains(cfg.URL, "pool_max_conns"):
		pcfg.MaxConns = int32(max(4, 2*runtime.GOMAXPROCS(0)))
	}
	rp := pcfg.ConnConfig.RuntimeParams
	// Ack after commit means after the WAL flush, whatever the server default.
	rp["synchronous_commit"] = "on"
	// Plan each cached statement once: re-planning the Append statement
	// (16 partitions, several CTEs) per call costs more than executing it,
	// and every query here is written to be index-driven under generic
	// plans.
	rp["plan_cache_mode"] = "force_generic_plan"
	if cfg.Schema != "" {
		rp["search_path"] = quoteIdent(cfg.Schema)
	}
	if rp["application_name"] == "" {
		rp["application_name"] = "fanfare"
	}
	if !cfg.SkipMigrate {
		conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig.Copy())
		if err != nil {
			return nil, dbErr("connect", err)
		}
		applied, err := migrate(ctx, conn, cfg.Schema)
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return nil, err
		}
		for _, m := range applied {
			log.Info("migration applied", "schema", cfg.Schema, "version", m.Version, "name", m.Name)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, dbErr("connect", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, dbErr("connect", err)
	}
	lim := cfg.Limits.WithDefaults()
	pingCfg := pcfg.ConnConfig.Copy()
	// One round trip per Ping, even on a fresh connection: no prepare.
	pingCfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pingCfg.RuntimeParams["application_name"] = rp["application_name"] + " (ping)"
	return &Store{pool: pool, lim: lim, log: log, merge: newMerger(cfg.AppendStatements, lim.MaxBatch), ping: &pinger{cfg: pingCfg}}, nil
}

// Ping checks that Postgres answers.
// A server in recovery (a standby, or a primary demoted by a failover) is
// reachable but cannot take writes: it counts as unavailable, so that the
// node degrades (L4) and readiness fails instead of failing every send.
//
// It runs on its own connection, not the pool's (one more connection per
// node), so that it measures reachability and not pool saturation: under a
// slow store the pool is full of commits and pulls, and the node is slow
// (the degradation levels deal with that), not down.
func (s *Store) Ping(ctx context.Context) error {
	p := s.ping
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		c, err := pgx.ConnectConfig(ctx, p.cfg)
		if err != nil {
			return dbErr("ping", err)
		}
		p.conn = c
	}
	var inRecovery bool
	if err := p.conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		p.closeLocked()
		return dbErr("ping", err)
	}
	if inRecovery {
		return store.Unavailable(errors.New("postgres: ping: server is in recovery (read-only)"))
	}
	return nil
}

// Close closes the pool, waiting for acquired connections to be released.
func (s *Store) Close() error {
	s.pool.Close()
	s.ping.mu.Lock()
	s.ping.closeLocked()
	s.ping.mu.Unlock()
	return nil
}

// closeLocked drops the connection; the next Ping dials a new one.
func (p *pinger) closeLocked() {
	if p.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	p.conn.Close(ctx)
	cancel()
	p.conn = nil
}

// Limits returns the effective limits (defaults filled in).
func (s *Store) Limits() store.Limits { return s.lim }

// quoteIdent quotes a validated schema name as an SQL identifier.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// dbErr classifies a pgx error: trouble reaching or talking to Postgres
// wraps store.ErrUnavailable (retryable); a Postgres error that says the
// request itself is wrong does not.
func dbErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		c := pgErr.Code
		switch {
		case strings.HasPrefix(c, "08"), // connection exception
			strings.HasPrefix(c, "53"),  // insufficient resources (too many connections, disk full)
			strings.HasPrefix(c, "57P"), // admin/crash shutdown, cannot connect now
			c == "57014",                // query canceled (statement timeout, cancel)
			c == "40001", c == "40P01",  // serialization failure, deadlock
			c == "55P03",               // lock not available
			c == "25P03",               // idle in transaction timeout
			c == "25006",               // read-only transaction: connected to a demoted primary / standby
			strings.HasPrefix(c, "58"): // system error (I/O)
			return store.Unavailable(fmt.Errorf("postgres: %s: %w", op, err))
		}
		return fmt.Errorf("store/postgres: %s: %w", op, err)
	}
	return store.Unavailable(fmt.Errorf("postgres: %s: %w", op, err))
}
