package embedded

import (
	"testing"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/storetest"
)

// TestConformance runs the shared suite. The embedded store cannot be
// opened twice (the engine locks its directory), so the two-node subtests
// use one instance twice (no WithReopen).
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTest(t, Config{}) },
		storetest.WithLimits(func(t *testing.T, l store.Limits) store.Store { return openTest(t, Config{Limits: l}) }))
}
