// Package storetest is the one conformance suite every store.Store backend
// passes (store/postgres, store/embedded): the storage invariants of
// docs/architecture.md §1 and the method contracts of store.Store, each as its own
// subtest, using only the public interface.
//
// Usage, in a backend's _test.go:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return openFresh(t) },
//			storetest.WithReopen(func(t *testing.T, s store.Store) store.Store {
//				return openSecondHandle(t, s)
//			}))
//	}
//
// open must return a fresh, empty, isolated store opened with zero
// store.Limits (the defaults) and register its Close with t.Cleanup; it is
// called once per subtest. WithReopen (optional) returns a second,
// independent handle on the same database as s, as a second node would open
// it; the multi-node subtests append through both handles concurrently.
// Backends that cannot be opened twice omit it and the subtests use s twice.
//
// Timestamps are compared at microsecond precision (Postgres' resolution).
// The suite runs its subtests sequentially; the concurrency subtests start
// their own goroutines and wait for them.
package storetest
