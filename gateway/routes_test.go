package gateway

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/store"
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

// TestRoutesHoldNoStore: the HTTP routes reach groups only through the
// engine (fanout.Engine's CreateGroup, AddMembers, RemoveMember,
// SetGroupState, SetUserTier, Group): no field of routes is or holds a
// store, so no route can change a group around the engine.
func TestRoutesHoldNoStore(t *testing.T) {
	storeType := reflect.TypeFor[store.Store]()
	rt := reflect.TypeFor[routes]()
	for i := range rt.NumField() {
		f := rt.Field(i)
		if f.Type == storeType || f.Type.Implements(storeType) || (f.Type.Kind() == reflect.Interface && storeType.Implements(f.Type) && f.Type.NumMethod() > 0) {
			t.Errorf("routes.%s (%v) reaches the store: change groups through the engine", f.Name, f.Type)
		}
	}
}
