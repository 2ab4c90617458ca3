package gateway

import (
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// queueFrame is the queue frame of a room update at now (docs/protocol.md
// §6): eta_s only while waiting; in a scheduled room's pre-queue, total,
// starts_at and starts_in_s (whole seconds to the start, rounded up, never
// negative) instead of a position.
func queueFrame(u waitroom.Update, now time.Time) wire.Queue {
	q := wire.Queue{Room: u.Room, Status: string(u.Status), Position: u.Position, Ahead: u.Ahead, Total: u.Total,
		VIPAheadNotice: u.VIPAheadNotice, Local: u.Local}
	switch u.Status {
	case waitroom.StatusWaiting:
		eta := int64((u.ETA + time.Second - 1) / time.Second)
		q.ETAS = &eta
	case waitroom.StatusScheduled:
		q.StartsAt = u.StartsAt.UnixMilli()
		in := max(int64((u.StartsAt.Sub(now)+time.Second-1)/time.Second), 0)
		q.StartsInS = &in
	}
	return q
}
