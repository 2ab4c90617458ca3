package postgres

import (
	"sync"
	"testing"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/storetest"
)

// TestConformance runs the shared suite against the real Postgres, each
// subtest in a fresh random schema; the second node is a second Store (its
// own pool) on the same schema.
func TestConformance(t *testing.T) { runConformance(t, false, 0) }

// TestConformanceTwoStep runs the suite with every Append on the
// two-round-trip path, which production takes only for batches holding
// retries, so that its rejections and orderings are covered as fully.
func TestConformanceTwoStep(t *testing.T) { runConformance(t, true, 0) }

// TestConformanceOneStatement runs the suite with one Append statement in
// flight, so that concurrent calls merge as much as they can, and
// TestConformanceUnmerged with merging off.
func TestConformanceOneStatement(t *testing.T) { runConformance(t, false, 1) }

func TestConformanceUnmerged(t *testing.T) { runConformance(t, false, -1) }

func runConformance(t *testing.T, twoStep bool, statements int) {
	var mu sync.Mutex
	schemas := map[store.Store]string{}
	open := func(t *testing.T, schema string) *Store {
		s := openTest(t, schema, 4)
		s.twoStep = twoStep
		s.merge = newMerger(statements, s.lim.MaxBatch)
		mu.Lock()
		schemas[s] = schema
		mu.Unlock()
		return s
	}
	storetest.Run(t,
		func(t *testing.T) store.Store { return open(t, newSchema(t)) },
		storetest.WithReopen(func(t *testing.T, s store.Store) store.Store {
			mu.Lock()
			schema := schemas[s]
			mu.Unlock()
			return open(t, schema)
		}),
		storetest.WithLimits(func(t *testing.T, l store.Limits) store.Store {
			s := openTestLimits(t, newSchema(t), 4, l)
			s.twoStep = twoStep
			s.merge = newMerger(statements, s.lim.MaxBatch)
			return s
		}))
}
