// Package enginetest holds what tests of the engine and of its Redis
// backends (redishot, redisquota) share: an engine that runs until the
// test ends, a group in a store of its own, and a log sink the test can
// read while the engine writes. Only tests import it.
package enginetest

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
)

// Start runs an engine on cfg until the test ends; its cleanup drains it
// (Shutdown, 5 s) and waits for Run.
func Start(t testing.TB, cfg fanout.Config) *fanout.Engine {
	t.Helper()
	e, err := fanout.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		if err := e.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		cancel()
		<-done
	})
	return e
}

// OpenGroup opens an embedded store in a temporary directory (closed when
// the test ends) with one group owned by uids[0] whose members are uids.
func OpenGroup(t testing.TB, uids ...string) (store.Store, int64) {
	t.Helper()
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	g, err := st.CreateGroup(ctx, store.Group{Name: "g", Owner: uids[0]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AddMembers(ctx, g.GID, uids); err != nil {
		t.Fatal(err)
	}
	return st, g.GID
}

// LogBuffer is a log sink shared by the engine's goroutines and the test.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Count returns how many times sub appears in the log so far.
func (l *LogBuffer) Count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), sub)
}

// String returns the log so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
