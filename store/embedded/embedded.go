package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/fanfare-im/fanfare/store"
)

// Defaults for Config.
const (
	DefaultDir          = "./data"
	DefaultCacheBytes   = 64 << 20
	DefaultMemTable     = 16 << 20
	DefaultMaxOpenFiles = 500
	// DefaultMaxRoundBytes bounds the message bytes the committer gathers
	// from concurrent Append calls into one commit.
	DefaultMaxRoundBytes = 8 << 20
)

// ErrClosed is returned (wrapped in store.ErrUnavailable) by every method of
// a closed Store.
var ErrClosed = errors.New("embedded: store is closed")

// ErrLocked is returned by Open when another Store (in this or another
// process) holds the data directory.
var ErrLocked = errors.New("embedded: data directory is in use")

// Config configures a Store. The zero value works: data in ./data.
type Config struct {
	// Dir is the data directory, created (mode 0750) if missing.
	// "" = DefaultDir (./data).
	Dir string
	// Limits bounds what the store accepts; zero fields mean the defaults.
	Limits store.Limits
	// Logger receives open/close events and the storage engine's own
	// messages (at Debug, errors at Error). nil = discard.
	Logger *slog.Logger
	// CacheBytes is the block cache size in bytes. 0 = DefaultCacheBytes.
	CacheBytes int64
	// MemTableBytes is the size of one memtable in bytes. 0 = DefaultMemTable.
	MemTableBytes int
	// MaxOpenFiles bounds the file descriptors the engine keeps open for
	// its tables (fanfared needs the rest of the process limit for
	// sockets). 0 = DefaultMaxOpenFiles.
	MaxOpenFiles int
	// MaxRoundBytes bounds the body bytes of the Append calls merged into
	// one commit. 0 = DefaultMaxRoundBytes.
	MaxRoundBytes int
	// Now is the clock for created_at, joined_at and updated_at.
	// nil = time.Now.
	Now func() time.Time
}

// Validate reports every problem of c.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, c.Limits.Problems("embedded")...)
	if c.CacheBytes < 0 {
		errs = append(errs, fmt.Errorf("embedded: CacheBytes %d is negative", c.CacheBytes))
	}
	if c.MemTableBytes < 0 {
		errs = append(errs, fmt.Errorf("embedded: MemTableBytes %d is negative", c.MemTableBytes))
	}
	if c.MaxOpenFiles < 0 {
		errs = append(errs, fmt.Errorf("embedded: MaxOpenFiles %d is negative", c.MaxOpenFiles))
	}
	if c.MaxRoundBytes < 0 {
		errs = append(errs, fmt.Errorf("embedded: MaxRoundBytes %d is negative", c.MaxRoundBytes))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	c.Limits = c.Limits.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.CacheBytes == 0 {
		c.CacheBytes = DefaultCacheBytes
	}
	if c.MemTableBytes == 0 {
		c.MemTableBytes = DefaultMemTable
	}
	if c.MaxOpenFiles == 0 {
		c.MaxOpenFiles = DefaultMaxOpenFiles
	}
	if c.MaxRoundBytes == 0 {
		c.MaxRoundBytes = DefaultMaxRoundBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Store is the embedded store. It is safe for concurrent use.
type Store struct {
	db   *pebble.DB
	lim  store.Limits
	log  *slog.Logger
	now  func() time.Time
	dir  string
	maxB int

	// closeMu is held shared by every operation and exclusively by Close,
	// so Close waits for operations in flight and later ones fail with
	// ErrClosed.
	closeMu sync.RWMutex
	closed  bool

	// wmu serializes every write: a writer reads the latest committed state
	// with db.Get and commits before releasing it, so what a writer reads
	// under wmu is exactly the durable state (plus its own batch).
	wmu sync.Mutex

	// cur is the read view published after the last commit. Readers never
	// read the DB directly: pebble makes a batch visible before its WAL
	// sync completes, and a reader must not see what a crash could undo.
	cur atomic.Pointer[view]

	calls    chan *appendCall
	stop     chan struct{}
	loopDone chan struct{}
	round    roundScratch // owned by the committer goroutine
	meta     metaCache    // guarded by wmu
	roomSync atomic.Int64 // UnixNano of the last synced WriteRooms
}

var _ store.Store = (*Store)(nil)

// formatVersion is the version of the key layout and record encodings in
// keys.go, stored under metaFormatKey.
const formatVersion = 1

// Open opens (creating if needed) the store in cfg.Dir. A directory held
// by another open Store fails with ErrLocked.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: create data directory: %w", err)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("embedded: data directory: %w", err)
	}
	opts := &pebble.Options{
		CacheSize:          cfg.CacheBytes,
		MemTableSize:       uint64(cfg.MemTableBytes),
		MaxOpenFiles:       cfg.MaxOpenFiles,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{cfg.Logger},
	}
	// Append looks up (gid, sender, client_msg_id) for every message and
	// almost always misses: bloom filters make those misses cheap.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		if isLockErr(err) {
			return nil, fmt.Errorf("%w: %s: %w", ErrLocked, dir, err)
		}
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	if err := checkFormat(db); err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{
		db:       db,
		lim:      cfg.Limits,
		log:      cfg.Logger,
		now:      cfg.Now,
		dir:      dir,
		maxB:     cfg.MaxRoundBytes,
		calls:    make(chan *appendCall, 256),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	s.round.init()
	s.meta.init()
	s.publish()
	go s.commitLoop()
	s.log.Info("embedded store opened", "dir", dir)
	return s, nil
}

// isLockErr reports whether err is pebble's "directory locked" failure.
func isLockErr(err error) bool {
	var pe *os.PathError
	if errors.As(err, &pe) && pe.Op == "lock" {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "lock held") || strings.Contains(msg, "resource temporarily unavailable")
}

// checkFormat stamps a new database with formatVersion and refuses one
// written by an incompatible version.
func checkFormat(db *pebble.DB) error {
	v, closer, err := db.Get(metaFormatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		b := db.NewBatch()
		defer b.Close()
		b.Set(metaFormatKey, []byte{formatVersion}, nil)
		b.Set(gidCounterKey, make([]byte, 8), nil) // no gid assigned yet (see nextGID)
		return b.Commit(pebble.Sync)
	case err != nil:
		return fmt.Errorf("embedded: read format version: %w", err)
	}
	defer closer.Close()
	if len(v) != 1 || v[0] != formatVersion {
		return fmt.Errorf("embedded: data directory has format %v, this build reads %d", v, formatVersion)
	}
	return nil
}

// Dir returns the absolute data directory.
func (s *Store) Dir() string { return s.dir }

// Limits returns the effective limits (defaults filled in).
func (s *Store) Limits() store.Limits { return s.lim }

// enter marks the start of an operation; the caller must call s.leave()
// when it returns nil.
func (s *Store) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return store.Unavailable(ErrClosed)
	}
	return nil
}

func (s *Store) leave() { s.closeMu.RUnlock() }

// Ping checks that the store is open and its engine answers a read.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	v := s.acquire()
	defer v.release()
	_, closer, err := v.snap.Get(metaFormatKey)
	if err != nil {
		return store.Unavailable(fmt.Errorf("embedded: ping: %w", err))
	}
	return closer.Close()
}

// Close waits for operations in flight, stops the committer and closes the
// engine (which syncs its WAL). Later calls of any method fail with
// ErrClosed; Close itself is idempotent.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.stop)
	<-s.loopDone
	if v := s.cur.Swap(nil); v != nil {
		v.release()
	}
	err := s.db.Close()
	s.log.Info("embedded store closed", "dir", s.dir, "err", err)
	return err
}

// view is a pebble snapshot taken right after a commit returned (so it
// holds only durable data), shared by readers through a reference count.
// The count starts at 1 for s.cur; the last release closes the snapshot.
type view struct {
	snap *pebble.Snapshot
	refs atomic.Int32
}

// publish replaces the read view with a snapshot of the current state.
// Callers hold wmu (or are Open), right after a commit returned.
func (s *Store) publish() {
	nv := &view{snap: s.db.NewSnapshot()}
	nv.refs.Store(1)
	if old := s.cur.Swap(nv); old != nil {
		old.release()
	}
}

// acquire returns the current view with a reference the caller releases.
// Callers are between enter and leave, so the store is open.
func (s *Store) acquire() *view {
	for {
		v := s.cur.Load()
		n := v.refs.Load()
		// n == 0: v was just retired; s.cur already points to its successor.
		if n > 0 && v.refs.CompareAndSwap(n, n+1) {
			return v
		}
	}
}

func (v *view) release() {
	if v.refs.Add(-1) == 0 {
		v.snap.Close()
	}
}

// pebbleLogger routes the engine's log lines to slog.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("pebble: " + fmt.Sprintf(format, args...))
	}
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is called by the engine on unrecoverable corruption; like
// pebble's default logger it does not return.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	l.log.Error(msg)
	panic(msg)
}
