package gateway

import (
	"testing"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestLevelsMatchWire pins the engine's degradation levels to the wire's:
// a level added to one and not the other, or renumbered, fails here.
func TestLevelsMatchWire(t *testing.T) {
	pairs := []struct {
		engine fanout.Level
		wire   int
	}{
		{fanout.L0Normal, wire.LevelNormal},
		{fanout.L1Merge, wire.LevelMerge},
		{fanout.L2Summary, wire.LevelSummary},
		{fanout.L3WriteOnly, wire.LevelWriteOnly},
		{fanout.L4Reject, wire.LevelReject},
	}
	if int(fanout.MaxLevel) != wire.MaxLevel || len(pairs) != wire.MaxLevel+1 {
		t.Fatalf("engine MaxLevel %d, wire MaxLevel %d, %d pairs here: every level needs a constant on both sides and a row here",
			fanout.MaxLevel, wire.MaxLevel, len(pairs))
	}
	for i, p := range pairs {
		if int(p.engine) != p.wire || p.wire != i || wireLevel(p.engine) != p.wire {
			t.Errorf("level %d: engine %d, wire %d, wireLevel %d; want all %d", i, p.engine, p.wire, wireLevel(p.engine), i)
		}
		if got, ok := engineLevel(p.wire); !ok || got != p.engine {
			t.Errorf("engineLevel(%d) = %v, %v; want %v, true", p.wire, got, ok, p.engine)
		}
	}
	for _, n := range []int{wire.LevelNormal - 1, wire.MaxLevel + 1} {
		if got, ok := engineLevel(n); ok {
			t.Errorf("engineLevel(%d) = %v, true; want false (not a level)", n, got)
		}
	}
}
