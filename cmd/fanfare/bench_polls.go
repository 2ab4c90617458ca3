package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
)

// pollRules are the limits rules bench polls disables with -limits off:
// one process enters and polls as -users visitors from one address.
var pollRules = []string{limiter.RoomEnter, limiter.RoomEnterIP, limiter.RoomPoll}

// pollResult is what bench polls reports.
type pollResult struct {
	Room        string
	Users       int
	Clients     int
	Entered     int
	EnterPerSec float64
	Polls       int
	PollsPerSec float64
	Failed      int64
	P50, P90    time.Duration
	P99, Max    time.Duration
	Duration    time.Duration
}

func benchPolls(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench polls", "[-users N] [-clients C] [-duration D] [-room NAME] [-admit-rate R] [-limits keep|off] [-http URL] [-admin-token T]", `
Load on the waiting room's HTTP polling path (docs/protocol.md §8.7) of a
running fanfared: it creates the room -room (anonymous visitors, admitting
-admit-rate per second with no cap on admitted users, so the queue moves
as in a live room and stays about -users deep), enters -users visitors
with POST /v1/rooms/{room}/enter, then -clients goroutines, each on its own keep-alive connection, poll
random visitors' GET /v1/rooms/{room}/status for -duration as fast as
answers come, and it reports polls/s and the latency percentiles. A
visitor is polled about every users/(polls/s) seconds, which may be longer
than the room's poll timeout: start fanfared with -room-poll-grace 10m so
that visitors stay connected. With -limits off (the default) it disables
the room_enter, room_enter_ip and room_poll rules for
the run through PUT /admin/v1/limits and restores them after.`)
	var a adminFlags
	a.register(fs.FlagSet, e)
	users := fs.Int("users", 100_000, "waiting visitors")
	clients := fs.Int("clients", 64, "polling goroutines, each with its own connection")
	dur := fs.Duration("duration", 20*time.Second, "how long polls are measured")
	room := fs.String("room", "bench-polls", "room to create (or update) and fill")
	rate := fs.Float64("admit-rate", 10, "the room's admissions per second: the queue moves, positions change, as in a live room")
	limits := fs.String("limits", "off", "server rate limits during the run: keep, or off")
	jsonOut := fs.Bool("json", false, "print the result as JSON")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if err := a.check(fs); err != nil {
		return err
	}
	if *users < 1 || *clients < 1 || *dur <= 0 || (*limits != "keep" && *limits != "off") {
		return fs.usageErr("-users and -clients must be positive, -duration too, -limits keep or off")
	}
	logf := func(format string, args ...any) { fmt.Fprintf(e.stderr, "bench polls: "+format+"\n", args...) }
	ac := &adminClient{base: strings.TrimRight(a.http, "/"), token: a.token}
	if *limits == "off" {
		restore, err := ac.disableRules(ctx, pollRules)
		if err != nil {
			return err
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := restore(rctx); err != nil {
				logf("restoring the server's limits: %v", err)
			}
		}()
	}
	cfg := map[string]any{"room": *room, "max_active": 1_000_000, "admit_rate": *rate, "max_wait_s": 7 * 24 * 3600,
		"target_wait_s": 7 * 24 * 3600, "grace_s": 3600, "hard_timeout_s": 7 * 24 * 3600, "state": "open",
		"site": map[string]any{"anonymous": true}}
	if err := ac.do(ctx, http.MethodPost, "/admin/v1/rooms", cfg, nil); err != nil {
		return fmt.Errorf("creating room %s: %w", *room, err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: *clients, MaxConnsPerHost: *clients, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	base := ac.base + "/v1/rooms/" + *room

	tickets := make([]string, *users)
	start := time.Now()
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Pointer[string]
	note := func(err string) {
		failed.Add(1)
		firstErr.CompareAndSwap(nil, &err)
	}
	var wg sync.WaitGroup
	for range *clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(tickets) {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/enter", nil)
				resp, err := hc.Do(req)
				if err != nil {
					note(err.Error())
					continue
				}
				var body struct {
					Ticket string `json:"ticket"`
					Frame  struct {
						Type string `json:"type"`
						Code string `json:"code"`
					} `json:"frame"`
				}
				err = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || err != nil {
					note(fmt.Sprintf("enter: %s", resp.Status))
					continue
				}
				if body.Frame.Type == "rejected" {
					note("enter: rejected " + body.Frame.Code)
					continue
				}
				tickets[i] = body.Ticket
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	entered := slices.DeleteFunc(slices.Clone(tickets), func(s string) bool { return s == "" })
	enterTook := time.Since(start)
	res := pollResult{Room: *room, Users: *users, Clients: *clients, Entered: len(entered),
		EnterPerSec: float64(len(entered)) / enterTook.Seconds()}
	logf("%d of %d visitors entered in %v (%.0f/s), %d failed", len(entered), *users, enterTook.Round(time.Millisecond),
		res.EnterPerSec, failed.Load())
	if len(entered) == 0 {
		if p := firstErr.Load(); p != nil {
			return errors.New("no visitor entered: " + *p)
		}
		return errors.New("no visitor entered")
	}
	failed.Store(0)

	pctx, cancel := context.WithTimeout(ctx, *dur)
	defer cancel()
	lat := make([][]time.Duration, *clients)
	pollStart := time.Now()
	for w := range *clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(pollStart.UnixNano())))
			for pctx.Err() == nil {
				req, _ := http.NewRequestWithContext(pctx, http.MethodGet, base+"/status", nil)
				req.Header.Set("X-Fanfare-Ticket", entered[rng.IntN(len(entered))])
				t0 := time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					if pctx.Err() == nil {
						note(err.Error())
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					note("status: " + resp.Status)
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	res.Duration = time.Since(pollStart)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	res.Polls, res.Failed = len(all), failed.Load()
	if len(all) > 0 {
		pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
		res.PollsPerSec = float64(len(all)) / res.Duration.Seconds()
		res.P50, res.P90, res.P99, res.Max = pct(0.5), pct(0.9), pct(0.99), all[len(all)-1]
	}
	if *jsonOut {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	fmt.Fprintf(e.stdout, "fanfare bench polls: room %s, %d waiting visitors, %d client connections\n", res.Room, res.Entered, res.Clients)
	fmt.Fprintf(e.stdout, "  enter   %8.0f/s\n", res.EnterPerSec)
	fmt.Fprintf(e.stdout, "  status  %8.0f polls/s over %v (%d polls, %d failed)\n", res.PollsPerSec, res.Duration.Round(time.Millisecond), res.Polls, res.Failed)
	fmt.Fprintf(e.stdout, "  latency p50 %v  p90 %v  p99 %v  max %v\n", res.P50, res.P90, res.P99, res.Max)
	if p := firstErr.Load(); p != nil && res.Failed > 0 {
		fmt.Fprintf(e.stdout, "  first failure: %s\n", *p)
	}
	return nil
}
