package gateway

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestSyncPageBytes: a GET /v1/sync answer of MaxSyncPage groups whose
// numbers all take the most digits (and a cursor) stays under 1 MiB, as
// MaxSyncPage's comment says.
func TestSyncPageBytes(t *testing.T) {
	g := wire.SyncGroup{GID: math.MaxInt64, LastSeq: math.MaxInt64, LastReadSeq: math.MaxInt64, Unread: math.MaxInt64}
	one, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(one)+1 > 124 { // with its comma
		t.Errorf("one group: got %d bytes, want at most 124", len(one)+1)
	}
	resp := wire.SyncResponse{Groups: make([]wire.SyncGroup, MaxSyncPage), NextAfter: math.MaxInt64}
	for i := range resp.Groups {
		resp.Groups[i] = g
	}
	body, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(body) + 1; n >= 1<<20 { // WriteJSON adds a newline
		t.Errorf("page of %d groups: got %d bytes, want under 1 MiB", MaxSyncPage, n)
	}
}
