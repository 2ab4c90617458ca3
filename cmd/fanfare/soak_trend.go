package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Resource series of the soak and the test that fails a run when one of
// them keeps growing.
//
// The workload is stationary: the same number of users online, the same
// rates, joins balanced by removals and departures. Once warmed up (caches
// filled, pools grown, the Go heap at its GC target), a process that does
// not leak holds its resources level; one that leaks per message, per
// connection or per membership change grows with the work done, so with
// time. The test splits the run into thirds: the first is the warm-up and
// is not judged; the median of the last third is compared with the median
// of the second. Medians ignore the spikes a GC cycle, a churn burst or a
// degradation switch causes. A series fails when both
//
//   - median(last third) - median(second third) > tolerance, and
//   - the Theil-Sen slope over the two judged thirds (the median of the
//     slopes between every pair of samples, which a few outliers do not
//     move), times the time between the two thirds' midpoints, also
//     exceeds it,
//
// so one step between the thirds that the slope does not confirm (a pool
// growing once) does not fail the run, and neither does noise. The
// tolerance is max(rel x median(second third), abs) per kind of resource
// (soakMetricKinds): abs absorbs the granularity of small counts (a few
// descriptors of connections in flight), rel the breathing of large ones.

// metricKind is one kind of resource with its tolerance.
type metricKind struct {
	name  string // series suffix: "rss", "heap", ...
	title string
	unit  string  // "B" (bytes) or "" (a count)
	rel   float64 // tolerated growth as a fraction of the baseline median
	abs   float64 // at least this much growth is tolerated
}

// soakMetricKinds are the sampled resources, in report order. The
// tolerances, and why (docs/reliability.md "Soak" repeats them):
//
//   - rss 10% or 16 MiB: the Go runtime returns freed pages to the kernel
//     lazily (the scavenger), so RSS follows the heap's peaks with a delay.
//   - heap 20% or 8 MiB: heap in use swings between GC cycles by up to the
//     GC target (GOGC=100: the live heap again); the medians of a third
//     (dozens of samples) damp that.
//   - goroutines 5% or 25: fanfared's goroutines do not grow with
//     connections (event loops, fixed worker pools); requests in flight at
//     the sample instant move the count by a few.
//   - fds 5% or 25: one descriptor per connection; churn closes and opens
//     a few at any instant.
//   - redis keys 10% or 50 and redis memory 15% or 2 MiB: presence and
//     limiter keys come and go with TTLs; the allocator's fragmentation
//     moves used_memory by a few hundred KB.
//   - postgres connections: growth of 4 (pools grow and shrink by a few).
var soakMetricKinds = []metricKind{
	{name: "rss", title: "RSS", unit: "B", rel: 0.10, abs: 16 << 20},
	{name: "heap", title: "Go heap in use", unit: "B", rel: 0.20, abs: 8 << 20},
	{name: "goroutines", title: "goroutines", rel: 0.05, abs: 25},
	{name: "fds", title: "open descriptors", rel: 0.05, abs: 25},
	{name: "redis_keys", title: "Redis keys (DBSIZE)", rel: 0.10, abs: 50},
	{name: "redis_mem", title: "Redis used_memory", unit: "B", rel: 0.15, abs: 2 << 20},
	{name: "pg_conns", title: "Postgres connections", rel: 0, abs: 4},
}

// sample is every series' value at one moment.
type sample struct {
	T      float64            // seconds since the workload started
	Values map[string]float64 // series name ("node1.rss", "redis.redis_keys") -> value
}

// trend is the test's result for one series.
type trend struct {
	Series    string  `json:"series"`
	Kind      string  `json:"kind"`
	Samples   int     `json:"samples"`
	First     float64 `json:"first"`    // first value after the warm-up
	Baseline  float64 `json:"baseline"` // median of the second third
	Final     float64 `json:"final"`    // median of the last third
	Growth    float64 `json:"growth"`   // Final - Baseline
	SlopePerH float64 `json:"slope_per_h"`
	Projected float64 `json:"projected"` // slope x the time between the thirds' midpoints
	Tolerance float64 `json:"tolerance"`
	Max       float64 `json:"max"`
	Failed    bool    `json:"failed"`
	Judged    bool    `json:"judged"` // false when there were too few samples
}

// minJudgedSamples is the fewest samples per judged third: fewer and the
// medians mean little (a 2-minute run sampled every 2 s has 20).
const minJudgedSamples = 5

// judge applies the test to one series (t in seconds, ascending) and the
// run's length: the thirds are of time, not of samples.
func judge(series string, k metricKind, t, y []float64, runS float64) trend {
	tr := trend{Series: series, Kind: k.name, Samples: len(y)}
	if len(y) == 0 {
		return tr
	}
	tr.Max = slices.Max(y)
	var t2, y2, t3, y3 []float64
	for i := range t {
		switch {
		case t[i] < runS/3:
		case t[i] < 2*runS/3:
			t2, y2 = append(t2, t[i]), append(y2, y[i])
		default:
			t3, y3 = append(t3, t[i]), append(y3, y[i])
		}
	}
	if len(y2) < minJudgedSamples || len(y3) < minJudgedSamples {
		return tr
	}
	tr.Judged = true
	tr.First = y2[0]
	tr.Baseline, tr.Final = median(y2), median(y3)
	tr.Growth = tr.Final - tr.Baseline
	slope := theilSen(append(slices.Clone(t2), t3...), append(slices.Clone(y2), y3...))
	tr.SlopePerH = slope * 3600
	tr.Projected = slope * (median(t3) - median(t2))
	tr.Tolerance = max(k.rel*tr.Baseline, k.abs)
	tr.Failed = tr.Growth > tr.Tolerance && tr.Projected > tr.Tolerance
	return tr
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// theilSen returns the median of the slopes between every pair of points
// with distinct t (O(n^2): a 30-minute run sampled every 5 s has 240
// judged points, 29k pairs).
func theilSen(t, y []float64) float64 {
	var slopes []float64
	for i := range t {
		for j := i + 1; j < len(t); j++ {
			if dt := t[j] - t[i]; dt != 0 {
				slopes = append(slopes, (y[j]-y[i])/dt)
			}
		}
	}
	return median(slopes)
}

// procFDs counts the open descriptors of pid.
func procFDs(pid int) (int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	return len(ents), err
}

// promValues reads the named unlabelled metrics from a Prometheus text
// exposition.
func promValues(r io.Reader, names ...string) (map[string]float64, error) {
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, val, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			continue
		}
		for _, n := range names {
			if string(name) == n {
				f, err := strconv.ParseFloat(string(bytes.Fields(val)[0]), 64)
				if err != nil {
					return nil, fmt.Errorf("metric %s: %w", n, err)
				}
				out[n] = f
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("metric %s not exposed", n)
		}
	}
	return out, nil
}

// scrapeGo reads a node's Go heap in use and goroutines from /metrics.
func scrapeGo(ctx context.Context, base string) (heap, goroutines float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	v, err := promValues(resp.Body, "go_memstats_heap_inuse_bytes", "go_goroutines")
	if err != nil {
		return 0, 0, err
	}
	return v["go_memstats_heap_inuse_bytes"], v["go_goroutines"], nil
}

// redisInfoField returns field of an INFO section's text.
func redisInfoField(info, field string) (float64, error) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("INFO has no %s", field)
}
