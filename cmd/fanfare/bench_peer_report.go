package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The report of bench peer: a Markdown table (ratios against the
// coalescing raw server of the same point) and SVG bar charts written by
// hand, as the soak report's plots are, so that no plotting dependency is
// needed.

// floorOf returns the coalescing raw server's run at r's point, or nil.
func (res *peerResult) floorOf(r peerRun) *peerRun {
	for i := range res.Runs {
		f := &res.Runs[i]
		if f.Server == serverRawCoalesce && f.Subs == r.Subs && f.Pinned == r.Pinned && f.Err == "" {
			return f
		}
	}
	return nil
}

func ratio(v, floor float64) string {
	if floor <= 0 || v <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.2fx)", v/floor)
}

// print writes the tables for people (Markdown).
func (res *peerResult) print(w io.Writer) {
	fmt.Fprintf(w, "fanfare bench peer: %.0f msg/s of %d bytes for %.0fs per run; ratios are against raw-coalesced at the same point\n\n",
		res.Rate, res.BodyBytes, res.DurationS)
	for _, s := range res.Skipped {
		fmt.Fprintf(w, "%s\n\n", s)
	}
	fmt.Fprintln(w, "| subscribers | server on | server | msg/s sustained | deliveries per server CPU-s | server CPU µs per delivery | send→receive p50 | p99 | lost | publish errors | disconnects | load |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range res.Runs {
		pin := "any core"
		if r.Pinned {
			pin = "one core"
		}
		if r.Err != "" {
			fmt.Fprintf(w, "| %d | %s | %s | failed: %s ||||||||\n", r.Subs, pin, r.Server, strings.ReplaceAll(r.Err, "|", "/"))
			continue
		}
		var fl peerRun
		if f := res.floorOf(r); f != nil {
			fl = *f
		}
		sat := ""
		if r.Saturated {
			sat = ", gave up"
		}
		if r.Deliveries == 0 {
			// No publish was acknowledged in the window: nothing to divide
			// the CPU by, no latency to show.
			fmt.Fprintf(w, "| %d | %s | %s | %.1f of %.0f%s | n/a | n/a | n/a | n/a | %d | %d | %d | %.1f |\n",
				r.Subs, pin, r.Server, min(r.MsgPerS, res.Rate), res.Rate, sat, r.Lost, r.PublishErrors, r.Disconnects, r.Load)
			continue
		}
		fmt.Fprintf(w, "| %d | %s | %s | %.1f of %.0f%s | %.0fk%s | %.2f%s | %s%s | %s%s | %d | %d | %d | %.1f |\n",
			r.Subs, pin, r.Server, min(r.MsgPerS, res.Rate), res.Rate, sat,
			r.DeliveriesPerCPUS/1000, ratio(r.DeliveriesPerCPUS, fl.DeliveriesPerCPUS),
			r.USPerDelivery, ratio(r.USPerDelivery, fl.USPerDelivery),
			latencyCell(r.LatencyMS.P50), ratio(r.LatencyMS.P50, fl.LatencyMS.P50),
			latencyCell(r.LatencyMS.P99), ratio(r.LatencyMS.P99, fl.LatencyMS.P99),
			r.Lost, r.PublishErrors, r.Disconnects, r.Load)
	}
	if len(res.Idle) == 0 {
		return
	}
	fmt.Fprintln(w, "\n| idle connections | server | RSS before → after | KB per connection | load |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, r := range res.Idle {
		if r.Err != "" {
			fmt.Fprintf(w, "| %d | %s | failed: %s |||\n", r.Idle, r.Server, strings.ReplaceAll(r.Err, "|", "/"))
			continue
		}
		var floor float64
		if f := res.idleFloorOf(r); f != nil {
			floor = f.KBPerConn
		}
		fmt.Fprintf(w, "| %d | %s | %.0f → %.0f MB | %.2f%s | %.1f |\n", r.Connected, r.Server, r.RSSBeforeMB, r.RSSAfterMB, r.KBPerConn, ratio(r.KBPerConn, floor), r.Load)
	}
	if m := res.idleMarginals(); len(m) > 0 {
		fmt.Fprintln(w, "\n| server | idle connections | KB per added connection | fixed part |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, x := range m {
			fmt.Fprintf(w, "| %s | %d → %d | %.2f | %.1f MB |\n", x.server, x.lo, x.hi, x.kbPerConn, x.fixedMB)
		}
	}
}

// idleFloorOf returns the coalescing raw server's idle run at r's count.
func (res *peerResult) idleFloorOf(r peerIdle) *peerIdle {
	for i := range res.Idle {
		f := &res.Idle[i]
		if f.Server == serverRawCoalesce && f.Idle == r.Idle && f.Err == "" {
			return f
		}
	}
	return nil
}

// idleMarginal is a server's RSS cost per connection between its smallest
// and largest idle count: the growth of its RSS growth over the added
// connections, and the part that does not grow with them (the RSS growth
// at the smallest count less that cost times its connections).
type idleMarginal struct {
	server             string
	lo, hi             int
	kbPerConn, fixedMB float64
}

func (res *peerResult) idleMarginals() []idleMarginal {
	var out []idleMarginal
	var servers []string
	for _, r := range res.Idle {
		if !slices.Contains(servers, r.Server) {
			servers = append(servers, r.Server)
		}
	}
	for _, s := range servers {
		var lo, hi *peerIdle
		for i := range res.Idle {
			r := &res.Idle[i]
			if r.Server != s || r.Err != "" || r.Connected == 0 {
				continue
			}
			if lo == nil || r.Connected < lo.Connected {
				lo = r
			}
			if hi == nil || r.Connected > hi.Connected {
				hi = r
			}
		}
		if lo == nil || hi.Connected == lo.Connected {
			continue
		}
		growLo, growHi := lo.RSSAfterMB-lo.RSSBeforeMB, hi.RSSAfterMB-hi.RSSBeforeMB
		perConnMB := (growHi - growLo) / float64(hi.Connected-lo.Connected)
		out = append(out, idleMarginal{server: s, lo: lo.Connected, hi: hi.Connected,
			kbPerConn: perConnMB * 1024, fixedMB: growLo - perConnMB*float64(lo.Connected)})
	}
	return out
}

// latencyCell formats a latency quantile in ms; the histogram's ceiling
// (one minute) means "at least that".
func latencyCell(ms float64) string {
	if ms >= maxLatencyUS/1000 {
		return "≥ 60 s (ceiling)"
	}
	return fmt.Sprintf("%.1f ms", ms)
}

// peerColors are the servers' bar colours.
var peerColors = map[string]string{
	serverFanfare: "#d62728", serverCentrifugo: "#1f77b4", serverRawFrame: "#999999", serverRawCoalesce: "#444444",
}

// writePlots writes cpu.svg (server CPU µs per delivery), p99.svg and,
// with an idle run, idle.svg into dir.
func (res *peerResult) writePlots(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var servers []string
	var groups []string
	for _, r := range res.Runs {
		if !slices.Contains(servers, r.Server) {
			servers = append(servers, r.Server)
		}
		if g := r.group(); !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	value := func(pick func(peerRun) float64) [][]float64 {
		v := make([][]float64, len(groups))
		for gi, g := range groups {
			v[gi] = make([]float64, len(servers))
			for _, r := range res.Runs {
				if r.group() == g && r.Err == "" {
					v[gi][slices.Index(servers, r.Server)] = pick(r)
				}
			}
		}
		return v
	}
	plots := map[string]string{
		"cpu.svg": svgBars("Server CPU per delivery (µs, lower is better)", groups, servers,
			value(func(r peerRun) float64 { return r.USPerDelivery })),
		"p99.svg": svgBars("Send→receive p99 (ms, kernel receive timestamps)", groups, servers,
			value(func(r peerRun) float64 { return r.LatencyMS.P99 })),
	}
	if len(res.Idle) > 0 {
		var names, counts []string
		for _, r := range res.Idle {
			if r.Err != "" {
				continue
			}
			if !slices.Contains(names, r.Server) {
				names = append(names, r.Server)
			}
			if c := fmt.Sprintf("%d connections", r.Idle); !slices.Contains(counts, c) {
				counts = append(counts, c)
			}
		}
		v := make([][]float64, len(counts))
		for ci := range v {
			v[ci] = make([]float64, len(names))
		}
		for _, r := range res.Idle {
			if r.Err == "" {
				v[slices.Index(counts, fmt.Sprintf("%d connections", r.Idle))][slices.Index(names, r.Server)] = r.KBPerConn
			}
		}
		plots["idle.svg"] = svgBars("RSS growth per idle connection (KB)", counts, names, v)
	}
	for name, svg := range plots {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(svg), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// group names r's point on a plot's x axis.
func (r peerRun) group() string {
	pin := "any core"
	if r.Pinned {
		pin = "one core"
	}
	return fmt.Sprintf("%d subs, %s", r.Subs, pin)
}

// svgBars draws grouped bars: one group per groups entry, one bar per
// series within it, values[group][series]; zero values are not drawn.
func svgBars(title string, groups, series []string, values [][]float64) string {
	const width, height, left, right, top, bottom = 760.0, 340.0, 60.0, 150.0, 40.0, 50.0
	var top0 float64
	for _, g := range values {
		for _, v := range g {
			top0 = max(top0, v)
		}
	}
	if top0 <= 0 {
		top0 = 1
	}
	scale := niceCeil(top0)
	plotW, plotH := width-left-right, height-top-bottom
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="14">%s</text>`+"\n", left, html.EscapeString(title))
	for i := 0; i <= 4; i++ {
		v := scale * float64(i) / 4
		y := top + plotH - plotH*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+plotW, y)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, fmtTick(v))
	}
	gw := plotW / float64(max(1, len(groups)))
	bw := gw * 0.8 / float64(max(1, len(series)))
	for gi, g := range groups {
		x0 := left + gw*float64(gi) + gw*0.1
		for si, s := range series {
			v := values[gi][si]
			if v <= 0 {
				continue
			}
			h := plotH * v / scale
			x := x0 + bw*float64(si)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				x, top+plotH-h, bw*0.9, h, peerColor(s, si), html.EscapeString(s), html.EscapeString(g), fmtTick(v))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>`+"\n", x+bw*0.45, top+plotH-h-3, fmtTick(v))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x0+gw*0.4, top+plotH+18, html.EscapeString(g))
	}
	for si, s := range series {
		y := top + 10 + 18*float64(si)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			left+plotW+16, y-10, peerColor(s, si), left+plotW+34, y, html.EscapeString(s))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func peerColor(s string, i int) string {
	if c, ok := peerColors[s]; ok {
		return c
	}
	return []string{"#2ca02c", "#ff7f0e", "#9467bd"}[i%3]
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func fmtTick(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
