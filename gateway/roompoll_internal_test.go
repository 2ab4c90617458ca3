package gateway

import (
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

type waitroomUpdate = waitroom.Update

func queueAt(ahead int64, status string, eta time.Duration) waitroom.Update {
	return waitroom.Update{Kind: waitroom.UpdateQueue, Room: "r", Ahead: ahead, Position: ahead + 1,
		Status: waitroom.QueueStatus(status), ETA: eta}
}

func granted() waitroom.Update { return waitroom.Update{Kind: waitroom.UpdateGranted, Room: "r"} }

func rejected(after time.Duration) waitroom.Update {
	return waitroom.Update{Kind: waitroom.UpdateRejected, Room: "r", Reject: waitroom.RejectRoomFull, RetryAfter: after}
}
