package presence_test

import (
	"testing"

	"github.com/fanfare-im/fanfare/presence"
	"github.com/fanfare-im/fanfare/presence/presencetest"
)

func TestEmbeddedConformance(t *testing.T) {
	presencetest.Run(t, func(t *testing.T) presencetest.Node {
		l, err := presence.New[int](presence.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return presencetest.Node{Local: l, View: presence.NewEmbedded(l, "n1"), ID: "n1"}
	})
}
