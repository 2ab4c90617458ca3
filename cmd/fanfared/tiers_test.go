package main

import (
	"testing"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/store"
)

// TestTiersAgree holds the three homes of the highest VIP tier equal: the
// token's claim (auth), the user row (store) and the waiting room's queues
// (waitroom) are bottom packages that may not import each other, so each
// names the number and this test, where all three meet, pins them.
func TestTiersAgree(t *testing.T) {
	if auth.MaxTier != store.MaxTier || store.MaxTier != waitroom.MaxTier {
		t.Fatalf("highest VIP tier: auth %d, store %d, waitroom %d; want one number", auth.MaxTier, store.MaxTier, waitroom.MaxTier)
	}
	if err := store.CheckTier(store.MaxTier); err != nil {
		t.Errorf("CheckTier(%d): %v", store.MaxTier, err)
	}
	for _, bad := range []int{-1, store.MaxTier + 1} {
		if store.CheckTier(bad) == nil {
			t.Errorf("CheckTier(%d) accepted", bad)
		}
	}
}
