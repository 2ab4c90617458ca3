package gateway

import (
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/store"
)

// wireMsg is the one conversion of a stored message to its wire form:
// pushes, batch and summary frames, pull answers and HTTP pages all go
// through it.
func wireMsg(m *store.Message) wire.Msg {
	return wire.Msg{GID: m.GID, Seq: m.Seq, From: m.Sender, TS: m.CreatedAt.UnixMilli(), Kind: m.Kind, Body: m.Body}
}

// wireMsgs converts stored messages to wire messages, appending to dst.
func wireMsgs(dst []wire.Msg, msgs []store.Message) []wire.Msg {
	for i := range msgs {
		dst = append(dst, wireMsg(&msgs[i]))
	}
	return dst
}
