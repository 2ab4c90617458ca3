package gateway

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/store"
)

// TestWireMsg pins the store-to-wire conversion every frame and page uses:
// each stored field lands in its wire field.
func TestWireMsg(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_123).Add(456 * time.Microsecond)
	in := []store.Message{
		{GID: 7, Seq: 42, Sender: "alice", CreatedAt: at, Kind: store.KindAtAll, Body: []byte(`{"t":"hi"}`)},
		{GID: 7, Seq: 43, Sender: "bob", CreatedAt: at.Add(time.Second), Kind: store.KindText, Body: []byte(`1`)},
	}
	want := []wire.Msg{
		{GID: 7, Seq: 42, From: "alice", TS: 1_700_000_000_123, Kind: wire.KindAtAll, Body: []byte(`{"t":"hi"}`)},
		{GID: 7, Seq: 43, From: "bob", TS: 1_700_000_001_123, Kind: wire.KindText, Body: json.RawMessage(`1`)},
	}
	if got := wireMsg(&in[0]); !reflect.DeepEqual(got, want[0]) {
		t.Errorf("wireMsg: got %+v, want %+v", got, want[0])
	}
	if got := wireMsgs([]wire.Msg{{Seq: 1}}, in); !reflect.DeepEqual(got, append([]wire.Msg{{Seq: 1}}, want...)) {
		t.Errorf("wireMsgs: got %+v, want the first message kept and %+v appended", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { _ = wireMsgs(make([]wire.Msg, 0, 2), in) }); n > 1 {
		t.Errorf("wireMsgs: %v allocations, want at most 1 (dst)", n)
	}
}
