package gateway

import (
	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// The engine's degradation levels and the wire's meet here only. The
// engine may not import the wire format (the layering: fanout sits below
// the gateway, gateway/wire imports nothing of fanfare's), so each names
// the levels itself with the same values, and TestLevelsMatchWire pins
// fanout.Level to the wire.Level* constants.

// wireLevel is l as degraded frames and the degrade admin route carry it.
func wireLevel(l fanout.Level) int { return int(l) }

// engineLevel is the wire level n as the engine's; false when n is not a
// level.
func engineLevel(n int) (fanout.Level, bool) {
	if n < wire.LevelNormal || n > wire.MaxLevel {
		return 0, false
	}
	return fanout.Level(n), true
}
