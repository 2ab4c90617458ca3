package bus_test

import (
	"testing"

	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/bus/bustest"
)

type localMedium struct{ l *bus.Local }

func (m localMedium) NewNode(t *testing.T, cfg bus.Config) *bus.Node {
	t.Helper()
	n, err := m.l.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (m localMedium) Stop(*testing.T)  { m.l.SetDown(true) }
func (m localMedium) Start(*testing.T) { m.l.SetDown(false) }

func TestLocal(t *testing.T) {
	bustest.Run(t, bustest.Harness{
		NewMedium: func(*testing.T) bustest.Medium { return localMedium{bus.NewLocal()} },
		NewOutage: func(*testing.T) bustest.Outage { return localMedium{bus.NewLocal()} },
	})
}
