package main

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// soakResult is a run's outcome: what report.json holds and report.md
// shows.
type soakResult struct {
	Mode      string            `json:"mode"`
	Nodes     int               `json:"nodes"`
	Started   string            `json:"started"`
	DurationS float64           `json:"duration_s"`
	Flags     map[string]string `json:"workload"`
	Outcome   string            `json:"outcome"` // PASS or FAIL
	Failures  []string          `json:"failures,omitempty"`

	Ledger   *verdict         `json:"ledger,omitempty"`
	DrainS   float64          `json:"drain_s"`
	Shutdown []float64        `json:"shutdown_s,omitempty"`
	Counters map[string]int64 `json:"counters"`
	// CPUPercent is each node's CPU use over the workload, then the load
	// generator's (this process), in percent of one core.
	CPUPercent []float64    `json:"cpu_percent"`
	Room       roomReport   `json:"waiting_room"`
	Levels     []levelEvent `json:"levels"`
	Trends     []trend      `json:"trends"`
	Samples    []sample     `json:"-"` // in samples.csv

	WorkloadErrors      int      `json:"workload_errors"`
	WorkloadErrorsFirst []string `json:"workload_errors_first,omitempty"`
}

// roomReport sums up the waiting room.
type roomReport struct {
	Surges        int            `json:"surges"`
	Entered       int            `json:"entered"`
	Granted       int            `json:"granted"`
	Rejected      map[string]int `json:"rejected,omitempty"`
	Stuck         int            `json:"stuck"`
	NormalWaitP50 float64        `json:"normal_wait_p50_s"`
	NormalWaitMax float64        `json:"normal_wait_max_s"`
	VIPWaitP50    float64        `json:"vip_wait_p50_s"`
	VIPWaitMax    float64        `json:"vip_wait_max_s"`
	VIPNotices    int            `json:"vip_ahead_notices"`
}

// Failed reports a failed run.
func (r *soakResult) Failed() bool { return len(r.Failures) > 0 }

// finish gathers the run's counters and judges the resource series.
func (r *soakResult) finish(s *soak) {
	s.mu.Lock()
	r.Samples = s.samples
	r.Levels = s.levels
	r.WorkloadErrors, r.WorkloadErrorsFirst = s.nerrs, s.errs
	s.mu.Unlock()
	s.led.mu.Lock()
	r.Counters = maps.Clone(s.led.events)
	s.led.mu.Unlock()
	s.room.mu.Lock()
	r.Room = roomReport{Surges: s.room.surges, Entered: s.room.entered, Granted: s.room.granted, Rejected: s.room.rejected,
		Stuck: s.room.stuck, VIPNotices: s.room.vipNotices,
		NormalWaitP50: median(s.room.waitNormal), VIPWaitP50: median(s.room.waitVIP)}
	if len(s.room.waitNormal) > 0 {
		r.Room.NormalWaitMax = slices.Max(s.room.waitNormal)
	}
	if len(s.room.waitVIP) > 0 {
		r.Room.VIPWaitMax = slices.Max(s.room.waitVIP)
	}
	s.room.mu.Unlock()
	if r.WorkloadErrors > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d workload requests failed (first: %s)", r.WorkloadErrors, r.WorkloadErrorsFirst[0]))
	}
	r.Trends = judgeAll(r.Samples, r.DurationS)
	for _, t := range r.Trends {
		if t.Failed {
			r.Failures = append(r.Failures, fmt.Sprintf("%s grows: median %s -> %s (+%s, tolerance %s), Theil-Sen %s/h",
				t.Series, fmtValue(t.Baseline, t.Kind), fmtValue(t.Final, t.Kind), fmtValue(t.Growth, t.Kind),
				fmtValue(t.Tolerance, t.Kind), fmtValue(t.SlopePerH, t.Kind)))
		}
	}
	r.Outcome = "PASS"
	if r.Failed() {
		r.Outcome = "FAIL"
	}
}

// seriesNames returns the series of the samples, sorted by kind then name.
func seriesNames(samples []sample) []string {
	set := map[string]bool{}
	for _, s := range samples {
		for k := range s.Values {
			set[k] = true
		}
	}
	names := slices.Collect(maps.Keys(set))
	order := func(n string) int {
		_, kind, _ := strings.Cut(n, ".")
		for i, k := range soakMetricKinds {
			if k.name == kind {
				return i
			}
		}
		return len(soakMetricKinds)
	}
	slices.SortFunc(names, func(a, b string) int {
		if d := order(a) - order(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return names
}

func kindOf(series string) metricKind {
	_, kind, _ := strings.Cut(series, ".")
	for _, k := range soakMetricKinds {
		if k.name == kind {
			return k
		}
	}
	return metricKind{name: kind, title: kind}
}

// seriesOf returns one series' points.
func seriesOf(samples []sample, name string) (t, y []float64) {
	for _, s := range samples {
		if v, ok := s.Values[name]; ok {
			t, y = append(t, s.T), append(y, v)
		}
	}
	return t, y
}

func judgeAll(samples []sample, runS float64) []trend {
	var out []trend
	for _, name := range seriesNames(samples) {
		t, y := seriesOf(samples, name)
		out = append(out, judge(name, kindOf(name), t, y, runS))
	}
	return out
}

// fmtValue prints v in the unit of the kind named.
func fmtValue(v float64, kind string) string {
	k := kindOf("x." + kind)
	if k.unit == "B" {
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	}
	if math.Abs(v) >= 100 || v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// writeSoakReport writes report.md, report.json, samples.csv and one SVG
// per kind of resource into dir.
func writeSoakReport(dir string, r *soakResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	names := seriesNames(r.Samples)
	var csv strings.Builder
	csv.WriteString("t_s," + strings.Join(names, ",") + "\n")
	for _, s := range r.Samples {
		csv.WriteString(strconv.FormatFloat(s.T, 'f', 1, 64))
		for _, n := range names {
			csv.WriteByte(',')
			if v, ok := s.Values[n]; ok {
				csv.WriteString(strconv.FormatFloat(v, 'f', -1, 64))
			}
		}
		csv.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "samples.csv"), []byte(csv.String()), 0o644); err != nil {
		return err
	}
	var plots []string
	for _, k := range soakMetricKinds {
		var lines []plotLine
		for _, n := range names {
			if kindOf(n).name != k.name {
				continue
			}
			t, y := seriesOf(r.Samples, n)
			node, _, _ := strings.Cut(n, ".")
			l := plotLine{label: node, t: t, y: y}
			for _, tr := range r.Trends {
				if tr.Series == n && tr.Judged {
					l.judged, l.baseline, l.final = true, tr.Baseline, tr.Final
				}
			}
			lines = append(lines, l)
		}
		if len(lines) == 0 {
			continue
		}
		file := "soak-" + r.Mode + "-" + k.name + ".svg"
		svg := svgPlot(fmt.Sprintf("%s, %s mode", k.title, r.Mode), k, lines, r.DurationS, r.Levels)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(svg), 0o644); err != nil {
			return err
		}
		plots = append(plots, file)
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	r.markdown(f, plots)
	return f.Close()
}

// markdown writes the report for people: outcome, ledger, resources and
// their plots.
func (r *soakResult) markdown(w io.Writer, plots []string) {
	fmt.Fprintf(w, "# Soak, %s mode: %s\n\n", r.Mode, r.Outcome)
	fmt.Fprintf(w, "Started %s, %.0f s of workload, %d fanfared node(s).\n\n", r.Started, r.DurationS, r.Nodes)
	keys := slices.Sorted(maps.Keys(r.Flags))
	var wl []string
	for _, k := range keys {
		wl = append(wl, k+" "+r.Flags[k])
	}
	fmt.Fprintf(w, "Workload: %s.\n\n", strings.Join(wl, ", "))
	if n := len(r.CPUPercent); n > 0 {
		var cpu []string
		for i, c := range r.CPUPercent[:n-1] {
			cpu = append(cpu, fmt.Sprintf("node %d %.0f%%", i+1, c))
		}
		fmt.Fprintf(w, "CPU over the workload, in percent of one core: %s; the load generator %.0f%%.\n\n", strings.Join(cpu, ", "), r.CPUPercent[n-1])
	}
	if len(r.Failures) > 0 {
		fmt.Fprintf(w, "Failures:\n\n")
		for _, f := range r.Failures {
			fmt.Fprintf(w, "- %s\n", f)
		}
		fmt.Fprintln(w)
	}
	if v := r.Ledger; v != nil {
		fmt.Fprintf(w, "## Ledger\n\n| check | count |\n|---|---|\n")
		rows := []struct {
			name string
			n    int64
		}{
			{"groups", int64(v.Groups)}, {"messages stored", v.Stored}, {"sends acked", v.Acked},
			{"sends without an ack (errors)", v.Unacked}, {"... of which stored (allowed)", v.UnackedStored},
			{"**acked and lost**", v.Lost}, {"**stored twice**", v.Duplicated}, {"**stored, never sent**", v.Foreign},
			{"**holes in a group's seqs**", v.Holes},
			{"memberships (joins)", v.Joins}, {"removals", v.Removals},
			{"**delivered below join_seq**", v.BeforeJoin}, {"**delivered after removal**", v.AfterRemoval},
			{"**delivered to a non-member**", v.NotMember},
			{"deliveries (distinct user, group, seq)", v.Deliveries},
			{"**delivered twice**", v.DeliveryDups}, {"**delivered out of order**", v.Reorders},
			{"**sampled deliveries with the wrong body**", v.WrongContent},
			{"users online at the end", int64(v.OnlineChecked)},
			{"**(user, group) incomplete at the end**", v.Incomplete}, {"**messages they miss**", v.MissingMessages},
		}
		for _, row := range rows {
			fmt.Fprintf(w, "| %s | %d |\n", row.name, row.n)
		}
		fmt.Fprintf(w, "\nBold rows must be 0. Online clients were complete %.1f s after the workload ended", r.DrainS)
		if len(r.Shutdown) > 0 {
			var sh []string
			for _, d := range r.Shutdown {
				sh = append(sh, fmt.Sprintf("%.1f s", d))
			}
			fmt.Fprintf(w, "; graceful shutdown took %s", strings.Join(sh, ", "))
		}
		fmt.Fprintf(w, ".\n\n")
		for _, p := range v.Problems {
			fmt.Fprintf(w, "- %s\n", p)
		}
	}
	fmt.Fprintf(w, "## Workload counters\n\n| counter | count |\n|---|---|\n")
	for _, k := range slices.Sorted(maps.Keys(r.Counters)) {
		fmt.Fprintf(w, "| %s | %d |\n", k, r.Counters[k])
	}
	rm := r.Room
	rej := "none"
	if len(rm.Rejected) > 0 {
		b, _ := json.Marshal(rm.Rejected)
		rej = string(b)
	}
	fmt.Fprintf(w, "\nWaiting room: %d surges, %d entered, %d granted, rejected %s, %d stuck; wait p50/max normal %.1f/%.1f s, VIP %.1f/%.1f s; %d VIP-ahead notices. %d levels forced and cleared.\n\n",
		rm.Surges, rm.Entered, rm.Granted, rej, rm.Stuck, rm.NormalWaitP50, rm.NormalWaitMax, rm.VIPWaitP50, rm.VIPWaitMax, rm.VIPNotices, len(r.Levels))
	fmt.Fprintf(w, "## Resources\n\n")
	fmt.Fprintf(w, "Sampled every %s; the first third is the warm-up; baseline and final are the medians of the second and last thirds; a series fails when both the growth and the Theil-Sen slope projected between the thirds exceed the tolerance.\n\n", r.Flags["sample_every"])
	r.trendTable(w)
	fmt.Fprintln(w)
	for _, p := range plots {
		fmt.Fprintf(w, "![%s](%s)\n", strings.TrimSuffix(p, ".svg"), p)
	}
}

// trendTable writes the resource table.
func (r *soakResult) trendTable(w io.Writer) {
	fmt.Fprintf(w, "| series | samples | baseline | final | growth | Theil-Sen per hour | tolerance | max | verdict |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range r.Trends {
		verdict := "flat"
		switch {
		case !t.Judged:
			verdict = "too few samples"
		case t.Failed:
			verdict = "**grows**"
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", t.Series, t.Samples,
			fmtValue(t.Baseline, t.Kind), fmtValue(t.Final, t.Kind), fmtValue(t.Growth, t.Kind),
			fmtValue(t.SlopePerH, t.Kind), fmtValue(t.Tolerance, t.Kind), fmtValue(t.Max, t.Kind), verdict)
	}
}

// plotLine is one series of a plot.
type plotLine struct {
	label string
	t, y  []float64
	// judged lines get their medians drawn dashed over the second and
	// last thirds.
	judged          bool
	baseline, final float64
}

// svgPlot draws a line plot by hand: a few dozen lines of SVG text, where
// a plotting library (gonum/plot and its font and image dependencies)
// would be the module's largest dependency for a handful of line charts.
// The warm-up third is shaded, the medians of the judged thirds are
// dashed, the forced degradation levels are marked on the time axis.
func svgPlot(title string, k metricKind, lines []plotLine, runS float64, levels []levelEvent) string {
	const W, H, left, right, top, bottom = 720.0, 260.0, 70.0, 110.0, 30.0, 40.0
	pw, ph := W-left-right, H-top-bottom
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		for _, v := range l.y {
			ymin, ymax = min(ymin, v), max(ymax, v)
		}
	}
	if math.IsInf(ymin, 0) {
		ymin, ymax = 0, 1
	}
	// Start the axis at 0 unless that squashes the line, and leave room
	// above.
	if ymin > 0 && ymin < 0.5*ymax {
		ymin = 0
	}
	span := ymax - ymin
	if span <= 0 {
		span = math.Max(math.Abs(ymax)*0.1, 1)
	}
	ymin = math.Max(0, ymin-0.1*span)
	ymax += 0.1 * span
	x := func(t float64) float64 { return left + pw*t/runS }
	y := func(v float64) float64 { return top + ph*(1-(v-ymin)/(ymax-ymin)) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="13" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#eeeeee"/>`+"\n", left, top, pw/3, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#888888">warm-up</text>`+"\n", left+4, top+12)
	for _, lv := range levels {
		x0, x1 := x(lv.T), x(math.Min(lv.T+lv.For, runS))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="4" fill="#f4a261"><title>node %d %s %d L%d</title></rect>`+"\n",
			x0, top+ph-4, math.Max(x1-x0, 1), lv.Node, lv.Scope, lv.GID, lv.Level)
	}
	for i := range 5 {
		v := ymin + (ymax-ymin)*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", left, y(v), left+pw, y(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, html.EscapeString(fmtAxis(v, k)))
	}
	for i := range 7 {
		t := runS * float64(i) / 6
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(t), top+ph+16, fmtDuration(t))
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444444"/>`+"\n", left, top, pw, ph)
	colors := []string{"#1d3557", "#e63946", "#2a9d8f", "#8338ec", "#fb8500", "#6a994e"}
	for i, l := range lines {
		c := colors[i%len(colors)]
		var pts []string
		for j := range l.t {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(l.t[j]), y(l.y[j])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		if l.judged {
			for k, v := range []float64{l.baseline, l.final} {
				x0, x1 := x(runS*float64(k+1)/3), x(runS*float64(k+2)/3)
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1" stroke-dasharray="4 3"/>`+"\n", x0, y(v), x1, y(v), c)
			}
		}
		ly := top + 14 + 16*float64(i)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", left+pw+10, ly-4, left+pw+28, ly-4, c)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", left+pw+32, ly, html.EscapeString(l.label))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#888888">forced levels</text>`+"\n", left+pw+10, top+ph)
	b.WriteString("</svg>\n")
	return b.String()
}

func fmtAxis(v float64, k metricKind) string {
	if k.unit == "B" {
		return fmt.Sprintf("%.0f MiB", v/(1<<20))
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func fmtDuration(s float64) string {
	if s >= 120 {
		return fmt.Sprintf("%.0fm", s/60)
	}
	return fmt.Sprintf("%.0fs", s)
}

// replotSoak redraws a finished run's report from its report.json and
// samples.csv (the resource test is judged again, with this binary's
// tolerances).
func replotSoak(from, out string) error {
	b, err := os.ReadFile(filepath.Join(from, "report.json"))
	if err != nil {
		return err
	}
	var r soakResult
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s/report.json: %w", from, err)
	}
	c, err := os.ReadFile(filepath.Join(from, "samples.csv"))
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(c)), "\n")
	if len(lines) < 2 {
		return fmt.Errorf("%s/samples.csv: no samples", from)
	}
	names := strings.Split(lines[0], ",")
	for i, line := range lines[1:] {
		cells := strings.Split(line, ",")
		if len(cells) != len(names) {
			return fmt.Errorf("%s/samples.csv:%d: %d cells, want %d", from, i+2, len(cells), len(names))
		}
		sm := sample{Values: map[string]float64{}}
		if sm.T, err = strconv.ParseFloat(cells[0], 64); err != nil {
			return fmt.Errorf("%s/samples.csv:%d: %w", from, i+2, err)
		}
		for j, cell := range cells[1:] {
			if cell == "" {
				continue
			}
			v, err := strconv.ParseFloat(cell, 64)
			if err != nil {
				return fmt.Errorf("%s/samples.csv:%d: %w", from, i+2, err)
			}
			sm.Values[names[j+1]] = v
		}
		r.Samples = append(r.Samples, sm)
	}
	r.Trends = judgeAll(r.Samples, r.DurationS)
	return writeSoakReport(out, &r)
}
