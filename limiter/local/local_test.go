package local_test

import (
	"testing"

	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/limitertest"
	"github.com/fanfare-im/fanfare/limiter/local"
)

func TestSuite(t *testing.T) {
	limitertest.Run(t, limitertest.Backend{
		New: func(t *testing.T, limits limiter.Limits, clock *limitertest.Clock, nodes int) []limiter.Limiter {
			l, err := local.New(local.Config{Limits: limits, Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			out := make([]limiter.Limiter, nodes)
			for i := range out {
				out[i] = l // one process is one node
			}
			return out
		},
		NewRealClock: func(t *testing.T, limits limiter.Limits, nodes int) []limiter.Limiter {
			l, err := local.New(local.Config{Limits: limits})
			if err != nil {
				t.Fatal(err)
			}
			out := make([]limiter.Limiter, nodes)
			for i := range out {
				out[i] = l
			}
			return out
		},
	})
}
