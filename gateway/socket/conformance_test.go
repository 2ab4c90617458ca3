package socket

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestConformanceSockets runs every conformance case over real connections
// against the gnet server with an echo handler: the input whole, byte by
// byte (one write per byte), and for short inputs split into two writes at
// every boundary. The answer must be the same every time.
func TestConformanceSockets(t *testing.T) {
	s := startServer(t, Config{MaxConnsPerUser: -1, MaxConnsPerIP: -1})
	run := func(t *testing.T, c wsCase, send func(cl *wsClient)) []out {
		cl := dialWS(t, s, "/ws", "conformance")
		send(cl)
		got, err := cl.readOuts(5 * time.Second)
		if err != nil {
			t.Errorf("%s: reading the answer: %v (got so far %v)", c.desc, err, got)
		}
		cl.nc.Close()
		return got
	}
	for _, c := range conformanceCases() {
		t.Run(c.id, func(t *testing.T) {
			if got := run(t, c, func(cl *wsClient) { cl.writeTolerant(c.in) }); !sameOuts(got, c.want) {
				t.Fatalf("%s, whole: got %v, want %v", c.desc, got, c.want)
			}
			if len(c.in) <= 4096 {
				got := run(t, c, func(cl *wsClient) {
					for i := range c.in {
						cl.writeTolerant(c.in[i : i+1])
					}
				})
				if !sameOuts(got, c.want) {
					t.Fatalf("%s, byte by byte: got %v, want %v", c.desc, got, c.want)
				}
			}
			if len(c.in) > 96 {
				return
			}
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			for cut := 1; cut < len(c.in); cut++ {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					got := run(t, c, func(cl *wsClient) {
						cl.writeTolerant(c.in[:cut])
						time.Sleep(500 * time.Microsecond)
						cl.writeTolerant(c.in[cut:])
					})
					if !sameOuts(got, c.want) {
						t.Errorf("%s, split at %d: got %v, want %v", c.desc, cut, got, c.want)
					}
				}()
			}
			wg.Wait()
		})
	}
	st := s.Stats()
	if st.Upgrades == 0 || st.Rejected != 0 {
		t.Errorf("stats: got %d upgrades and %d rejections, want some and none", st.Upgrades, st.Rejected)
	}
}

func TestCaseCount(t *testing.T) {
	// The suite must cover every Autobahn category it claims.
	seen := map[string]int{}
	for _, c := range conformanceCases() {
		var cat string
		fmt.Sscanf(c.id, "%1s", &cat)
		seen[cat]++
	}
	for _, cat := range []string{"1", "2", "3", "4", "5", "6", "7", "9"} {
		if seen[cat] == 0 {
			t.Errorf("category %s has no cases", cat)
		}
	}
}
