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
func TestConformance(t *testing.T) {
	var mu sync.Mutex
	schemas := map[store.Store]string{}
	storetest.Run(t,
		func(t *testing.T) store.Store {
			schema := newSchema(t)
			s := openTest(t, schema, 4)
			mu.Lock()
			schemas[s] = schema
			mu.Unlock()
			return s
		},
		storetest.WithReopen(func(t *testing.T, s store.Store) store.Store {
			mu.Lock()
			schema := schemas[s]
			mu.Unlock()
			return openTest(t, schema, 4)
		}))
}
