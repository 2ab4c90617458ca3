package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/bus"
	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/local"
	"github.com/fanfare-im/fanfare/store/embedded"
	"github.com/fanfare-im/fanfare/store/retention"
)

// The operator documentation lives in docs/ at the repository root.
const (
	docsDir        = "../../docs"
	dashboardPath  = docsDir + "/grafana-dashboard.json"
	operationsPath = docsDir + "/operations.md"
	protocolPath   = docsDir + "/protocol.md"
	archPath       = docsDir + "/architecture.md"
)

// metricsAfterEvents are the metrics the docs may name although the node
// started by TestDocsMetrics does not expose them after its little traffic,
// each with the reason. Every one must still be declared by the collector
// of the package that owns it (see declaredMetrics), so a misspelt or
// removed name fails anyway.
var metricsAfterEvents = map[string]string{
	"fanfare_hot_group_rate":                  "a series per hot group: exists only while a group is hot",
	"fanfare_hot_group_moves_total":           "counted per destination pool: appears after a group moved",
	"fanfare_group_limited_total":             "appears after a large group's rate limit buffered or refused a send",
	"fanfare_limiter_fallback_active":         "registered only with -redis-addr (cluster mode with Redis)",
	"fanfare_limiter_fallback_switches_total": "registered only with -redis-addr; appears after a switch",
	"fanfare_room_backend_errors_total":       "counted per backend: appears after a failed waiting-room backend call",
	"fanfare_room_webhook_total":              "fanfared configures no session-end webhook",
	"fanfare_bus_member_changes_total":        "the cross-node bus is registered only with -redis-addr (cluster mode)",
	"fanfare_bus_decode_errors_total":         "the cross-node bus is registered only with -redis-addr (cluster mode)",
	"fanfare_bus_tail_hints_total":            "the cross-node bus is registered only with -redis-addr (cluster mode)",
	"fanfare_member_rereads_total":            "counted per result: re-reads happen only with a bus (cluster mode)",
	"fanfare_member_feed_reads_total":         "counted per result: the feed of additions is read only with a bus (cluster mode)",
	"fanfare_hot_set_syncs_total":             "counted per result: rounds run only with -redis-addr (the cluster hot set)",
	"fanfare_at_all_quota_calls_total":        "counted per result: calls made only with -redis-addr, for an @all send",
	"fanfare_messages_expired_total":          "registered only with -retention",
	"fanfare_hook_before_send_seconds":        "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_before_send_total":          "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_appended_total":      "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_delivered_total":     "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_event_retries_total":        "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_dropped_total":       "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_out_of_order_total":  "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_pending":             "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_lag_seconds":         "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_held":                "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_hook_events_async_queue":         "registered only with a -hook-* URL (TestHooksMetrics scrapes them)",
	"fanfare_retention_rounds_total":          "registered only with -retention",

	"fanfare_presence_cluster_flushes_total":       "the Redis presence view is registered only with -redis-addr",
	"fanfare_presence_cluster_writes_total":        "the Redis presence view is registered only with -redis-addr",
	"fanfare_presence_cluster_resyncs_total":       "the Redis presence view is registered only with -redis-addr",
	"fanfare_presence_cluster_written_bytes_total": "the Redis presence view is registered only with -redis-addr",
	"fanfare_presence_cluster_stale":               "the Redis presence view is registered only with -redis-addr",
}

// routesNotServed are endpoints the docs name while saying fanfared does
// not serve them (none at the moment).
var routesNotServed = map[string]string{}

// dashboardMustShow are metrics the dashboard must keep a panel for
// (the panels asked for in issue 8).
var dashboardMustShow = []string{
	"fanfare_ws_connections", "fanfare_ws_upgrades_total", "fanfare_ws_handshakes_rejected_total",
	"fanfare_sends_total", "fanfare_sends_overloaded_total",
	"fanfare_queue_wait_seconds_bucket", "fanfare_batch_process_seconds_bucket",
	"fanfare_deliveries_total", "fanfare_push_frames_total",
	"fanfare_ws_pushes_dropped_total", "fanfare_ws_resyncs_total",
	"fanfare_node_degradation_level", "fanfare_group_degradation_level",
	"fanfare_hot_groups", "fanfare_limiter_decisions_total", "fanfare_limiter_fallback_active",
	"fanfare_presence_users", "fanfare_presence_groups",
	"fanfare_room_waiting", "fanfare_room_active", "fanfare_room_tail_eta_seconds", "fanfare_room_admission_rate",
	"go_goroutines", "go_memstats_heap_inuse_bytes", "go_gc_duration_seconds_count",
	"process_cpu_seconds_total", "process_resident_memory_bytes",
}

var metricNameRE = regexp.MustCompile(`\b(?:fanfare|go|process)_[a-zA-Z0-9_]*`)

// notMetrics are names of the docs that look like metrics but are not.
var notMetrics = map[string]string{
	"fanfare_access": "the default query parameter and cookie of a waiting room's access token (docs/protocol.md §9.16)",
}

// TestDocsMetrics keeps docs/grafana-dashboard.json and the metric names of
// docs/operations.md honest: every name must be exposed by a running node
// after a little traffic (or be a listed exception that its package
// declares), and every endpoint the docs name must be routed.
func TestDocsMetrics(t *testing.T) {
	dash := readDashboard(t)
	ops := readDoc(t, operationsPath)
	proto := readDoc(t, protocolPath)
	arch := readDoc(t, archPath)

	ts := startServer(t, "embedded", "-limits-file", writeFile(t, "limits.json", `{}`))
	traffic(t, ts)

	declared := declaredMetrics(t)
	for name := range metricsAfterEvents {
		if !declared[name] {
			t.Errorf("exception %s is declared by no collector: remove it from metricsAfterEvents", name)
		}
	}
	var want []string // names that must appear without an exception
	for _, n := range append(slices.Clone(dash.metrics), docMetrics(ops)...) {
		if _, ok := metricsAfterEvents[baseName(n)]; !ok && !strings.HasSuffix(n, "*") {
			want = append(want, n)
		}
	}
	exposed := scrapeUntil(t, ts, want, 3*time.Second)

	check := func(where, name string) {
		if prefix, ok := strings.CutSuffix(name, "*"); ok {
			for n := range exposed {
				if strings.HasPrefix(n, prefix) {
					return
				}
			}
			for n := range declared {
				if strings.HasPrefix(n, prefix) {
					return
				}
			}
			t.Errorf("%s: no metric starts with %s", where, prefix)
			return
		}
		if exposed[name] {
			return
		}
		if reason, ok := metricsAfterEvents[baseName(name)]; ok {
			if !declared[baseName(name)] {
				t.Errorf("%s: %s (%s) is declared by no collector", where, name, reason)
			}
			return
		}
		t.Errorf("%s: metric %s is not exposed by a running node (and is not a listed exception)", where, name)
	}
	for _, n := range dash.metrics {
		check("grafana-dashboard.json", n)
	}
	for _, n := range docMetrics(ops) {
		check("operations.md", n)
	}
	for _, n := range docMetrics(proto) {
		check("protocol.md", n)
	}
	for _, n := range docMetrics(arch) {
		check("architecture.md", n)
	}
	for _, n := range dashboardMustShow {
		if !slices.Contains(dash.metrics, n) {
			t.Errorf("grafana-dashboard.json: no panel shows %s", n)
		}
	}
	for name := range metricsAfterEvents {
		if exposed[name] {
			t.Logf("note: %s is exposed now; its exception (%s) may be stale", name, metricsAfterEvents[name])
		}
	}

	for _, doc := range []struct{ name, text string }{{"operations.md", ops}, {"protocol.md", proto}, {"architecture.md", arch}} {
		for _, r := range docRoutes(doc.text) {
			checkRoute(t, ts, doc.name, r)
		}
	}
}

// traffic makes the node expose what a working node exposes: a group, a
// connected member, a message sent over HTTP and pushed, a pull, a group
// whose level is forced, and a waiting room that admits a user, ends its
// session and refuses an entrant once closed.
func traffic(t *testing.T, ts *testServer) {
	t.Helper()
	gid := ts.createGroup("alice", "bob")
	bob := ts.dialRaw("bob")
	var sent wire.SendResponse
	if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), ts.token("alice", 0),
		wire.SendRequest{ID: "docs-1", Body: json.RawMessage(`{"text":"hi"}`)}, &sent); st != http.StatusOK {
		t.Fatalf("send: status %d", st)
	}
	if m, _ := readUntil[*wire.Msg](bob, 5*time.Second); m.Seq != sent.Seq {
		t.Fatalf("push: got seq %d, want %d", m.Seq, sent.Seq)
	}
	if st := ts.do("GET", fmt.Sprintf("/v1/groups/%d/messages?from_seq=1", gid), ts.token("bob", 0), nil, nil); st != http.StatusOK {
		t.Fatalf("pull: status %d", st)
	}
	// The forced level stays (the node stops with the test): a group back
	// at L0 leaves fanfare_group_degradation_level.
	body := fmt.Sprintf(`{"scope":"group","gid":%d,"level":1,"ttl_s":600}`, gid)
	if st := ts.do("PUT", "/admin/v1/degrade", ts.admin, body, nil); st != http.StatusOK {
		t.Fatalf("force a level: status %d", st)
	}

	if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"docs","max_active":1,"admit_rate":20}`, nil); st != http.StatusOK {
		t.Fatalf("create room: status %d", st)
	}
	carol := ts.dialRoom("docs", "carol", 1)
	readUntil[*wire.Granted](carol, 5*time.Second)
	carol.c.Close() // ends the session
	if st := ts.do("POST", "/admin/v1/rooms", ts.admin, `{"room":"docs","state":"closed"}`, nil); st != http.StatusOK {
		t.Fatalf("close room: status %d", st)
	}
	if r, _ := readUntil[*wire.Rejected](ts.dialRoom("docs", "dave", 0), 5*time.Second); r.Code != wire.CodeRoomClosed {
		t.Fatalf("entrant of a closed room: got %q, want %q", r.Code, wire.CodeRoomClosed)
	}
}

// scrapeUntil scrapes /metrics until every name in want is exposed or d
// passed (tier 2 reports one merge window after a commit), and returns the
// exposed family and sample names.
func scrapeUntil(t *testing.T, ts *testServer, want []string, d time.Duration) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := scrape(t, ts)
		missing := slices.IndexFunc(want, func(n string) bool { return !got[n] })
		if missing < 0 || time.Now().After(deadline) {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func scrape(t *testing.T, ts *testServer) map[string]bool {
	t.Helper()
	resp, err := http.Get(ts.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: status %d", resp.StatusCode)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			names[strings.Fields(rest)[0]] = true
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// baseName strips the sample suffixes of histograms and summaries.
func baseName(n string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, s); ok {
			return b
		}
	}
	return n
}

// descNames is a prometheus.Registerer that records the fully-qualified
// names its collectors describe.
type descNames map[string]bool

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d descNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for desc := range ch {
		if m := fqNameRE.FindStringSubmatch(desc.String()); m != nil {
			d[m[1]] = true
		}
	}
	return nil
}

func (d descNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d descNames) Unregister(prometheus.Collector) bool { return false }

// pingLimiter is a limiter.Pinger for building a Failover's collectors.
type pingLimiter struct{ limiter.Limiter }

func (pingLimiter) Ping(context.Context) error { return nil }

// declaredMetrics returns the names declared by the collectors of the
// packages whose metrics may be absent from a node's /metrics: the engine,
// the limiter and its Redis failover, the waiting room, the bus and the
// cluster presence view.
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	d := descNames{}
	fanout.NewMetrics(d)
	hooks.NewMetrics(d)
	if _, err := limiter.NewMetrics(d); err != nil {
		t.Fatal(err)
	}
	primary, err := local.New(local.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fallback, err := local.New(local.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := limiter.NewFailover(pingLimiter{primary}, fallback, limiter.FailoverConfig{Registerer: d}); err != nil {
		t.Fatal(err)
	}
	if _, err := waitroom.New(waitroom.Config{Registerer: d}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.NewLocal().NewNode(bus.Config{Handler: func(*bus.Batch) {}, Registerer: d}); err != nil {
		t.Fatal(err)
	}
	st, err := embedded.Open(embedded.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := retention.New(retention.Config{Store: st, Keep: time.Hour, Registerer: d}); err != nil {
		t.Fatal(err)
	}
	d.MustRegister(gateway.ClusterPresenceCollector(func() gateway.ClusterPresenceStats { return gateway.ClusterPresenceStats{} }, func() bool { return false }))
	return d
}

type dashboard struct {
	metrics []string // metric names in expr fields, sorted, unique
}

// readDashboard parses the dashboard, checks its structure and collects
// the metric names of every expr.
func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatalf("grafana-dashboard.json is not valid JSON: %v", err)
	}
	if v, _ := root["schemaVersion"].(float64); v < 36 || v > 41 {
		t.Errorf("schemaVersion: got %v, want about 39", root["schemaVersion"])
	}
	hasInput := false
	if inputs, _ := root["__inputs"].([]any); inputs != nil {
		for _, in := range inputs {
			if m, _ := in.(map[string]any); m["name"] == "DS_PROMETHEUS" && m["pluginId"] == "prometheus" {
				hasInput = true
			}
		}
	}
	if !hasInput {
		t.Error("grafana-dashboard.json: no DS_PROMETHEUS datasource input")
	}
	panels, _ := root["panels"].([]any)
	if len(panels) == 0 {
		t.Fatal("grafana-dashboard.json: no panels")
	}
	ids := map[float64]bool{}
	names := map[string]bool{}
	var exprs int
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ds, ok := v["datasource"].(map[string]any); ok && ds["type"] == "prometheus" && ds["uid"] != "${DS_PROMETHEUS}" {
				t.Errorf("%s: datasource uid %v, want ${DS_PROMETHEUS}", where, ds["uid"])
			}
			for k, x := range v {
				if k != "expr" {
					walk(where, x)
					continue
				}
				e, _ := x.(string)
				exprs++
				if err := balanced(e); err != nil {
					t.Errorf("%s: expr %q: %v", where, e, err)
				}
				ms := metricNameRE.FindAllString(e, -1)
				if len(ms) == 0 {
					t.Errorf("%s: expr %q names no fanfare, go or process metric", where, e)
				}
				for _, m := range ms {
					names[m] = true
				}
			}
		case []any:
			for _, x := range v {
				walk(where, x)
			}
		}
	}
	for _, p := range panels {
		m, _ := p.(map[string]any)
		title, _ := m["title"].(string)
		id, _ := m["id"].(float64)
		if ids[id] {
			t.Errorf("panel %q: duplicate id %v", title, id)
		}
		ids[id] = true
		if m["type"] != "row" {
			if targets, _ := m["targets"].([]any); len(targets) == 0 {
				t.Errorf("panel %q has no targets", title)
			}
		}
		walk("panel "+strconv.Quote(title), m)
	}
	if exprs == 0 {
		t.Fatal("grafana-dashboard.json: no expr")
	}
	var d dashboard
	for n := range names {
		d.metrics = append(d.metrics, n)
	}
	slices.Sort(d.metrics)
	return d
}

// balanced reports unbalanced (), {}, [] or quotes in a PromQL expression.
func balanced(e string) error {
	var stack []rune
	inQuote := false
	for i, r := range e {
		if inQuote {
			if r == '"' && (i == 0 || e[i-1] != '\\') {
				inQuote = false
			}
			continue
		}
		switch r {
		case '"':
			inQuote = true
		case '(', '{', '[':
			stack = append(stack, r)
		case ')', '}', ']':
			open := map[rune]rune{')': '(', '}': '{', ']': '['}[r]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				return fmt.Errorf("unbalanced %q at %d", r, i)
			}
			stack = stack[:len(stack)-1]
		}
	}
	if inQuote || len(stack) > 0 {
		return fmt.Errorf("unclosed %q", append(stack, '"')[0])
	}
	return nil
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docMetrics returns the metric names a document mentions; a name
// followed by "*" (fanfare_room_*) is returned with the "*" as a prefix.
func docMetrics(doc string) []string {
	var out []string
	for _, loc := range metricNameRE.FindAllStringIndex(doc, -1) {
		n := doc[loc[0]:loc[1]]
		if loc[1] < len(doc) && doc[loc[1]] == '*' {
			n += "*"
		} else if strings.HasSuffix(n, "_") {
			continue // prose such as "go_" before a wildcard handled above
		}
		if _, ok := notMetrics[n]; ok {
			continue
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

var routeRE = regexp.MustCompile(`\b(GET|PUT|POST|PATCH|DELETE) (/(?:v1|admin|healthz|readyz|metrics)[A-Za-z0-9/{}_.-]*)`)

// docRoutes returns "METHOD /path" for every endpoint a document names.
func docRoutes(doc string) []string {
	var out []string
	for _, m := range routeRE.FindAllStringSubmatch(doc, -1) {
		r := m[1] + " " + strings.TrimRight(m[2], ".")
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// checkRoute sends route to the node with placeholders filled in and an
// empty body, as the admin, and fails when no route matched (the API's 404
// "no such endpoint" or 405). Empty bodies are refused before any change.
func checkRoute(t *testing.T, ts *testServer, doc, route string) {
	t.Helper()
	method, path, _ := strings.Cut(route, " ")
	path = strings.NewReplacer("{gid}", "987654321", "{uid}", "docs-nobody", "{room}", "docs-room").Replace(path)
	req, err := http.NewRequest(method, ts.http+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+ts.admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	unmatched := resp.StatusCode == http.StatusMethodNotAllowed ||
		resp.StatusCode == http.StatusNotFound && strings.Contains(string(body), "no such endpoint")
	reason, listed := routesNotServed[route]
	switch {
	case unmatched && !listed:
		t.Errorf("%s names %s, which fanfared does not route (%d %s)", doc, route, resp.StatusCode, strings.TrimSpace(string(body)))
	case !unmatched && listed:
		t.Logf("note: %s is routed now; routesNotServed says %q: update the docs", route, reason)
	}
}

// TestDocsFlags: every -flag and FANFARE_* variable in docs/operations.md,
// docs/protocol.md and docs/architecture.md exists. Flags after "fanfared"
// on a line, and keys with a dash in JSON, must be fanfared's flags
// ((*config).flags); flags after "fanfare
// <command>" must be flags of the operator CLI (read from cmd/fanfare's
// source); an inline code span that starts with a flag may be either.
// FANFARE_* names must be the environment names of fanfared's flags or
// names the CLI reads.
func TestDocsFlags(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("fanfared", flag.ContinueOnError)
	c.flags(fs)
	server := map[string]bool{"h": true, "help": true}
	envs := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		server[f.Name] = true
		envs[envName(f.Name)] = true
	})
	cli, cliEnvs := cliFlags(t)
	for e := range cliEnvs {
		envs[e] = true
	}
	if len(cli) < 10 || !cli["gid"] || !cli["room"] {
		t.Fatalf("read %d CLI flags from cmd/fanfare, want the degrade and rooms flags among them: %v", len(cli), cli)
	}

	for _, path := range []string{operationsPath, protocolPath, archPath} {
		doc := readDoc(t, path)
		name := filepath.Base(path)
		for _, e := range regexp.MustCompile(`FANFARE_[A-Z0-9][A-Z0-9_]*`).FindAllString(doc, -1) {
			if !envs[e] {
				t.Errorf("%s: %s is neither a fanfared flag's variable nor read by the CLI", name, e)
			}
		}
		for _, piece := range codePieces(doc) {
			checkFlagsIn(t, name, piece, server, cli)
		}
	}
}

var (
	flagRE      = regexp.MustCompile(`(?:^|[\s(\[])(-{1,2}[a-z][a-z0-9]*(?:-[a-z0-9]+)*)\b`)
	jsonFlagRE  = regexp.MustCompile(`"([a-z0-9]+(?:-[a-z0-9]+)+)"\s*:`)
	cliInvokeRE = regexp.MustCompile(`\bfanfare (token|migrate|degrade|rooms|bench)\b`)
)

// checkFlagsIn checks the flags of one code line or inline code span.
func checkFlagsIn(t *testing.T, doc, piece string, server, cli map[string]bool) {
	t.Helper()
	for _, m := range jsonFlagRE.FindAllStringSubmatch(piece, -1) {
		if !server[m[1]] {
			t.Errorf("%s: config key %q is not a fanfared flag (in %q)", doc, m[1], piece)
		}
	}
	var set map[string]bool
	var what, rest string
	if i := strings.Index(piece, "fanfared"); i >= 0 {
		set, what, rest = server, "fanfared", piece[i+len("fanfared"):]
	} else if loc := cliInvokeRE.FindStringIndex(piece); loc != nil {
		set, what, rest = cli, "fanfare", piece[loc[1]:]
	} else if strings.HasPrefix(piece, "-") {
		rest = " " + piece
	} else {
		return // other commands (curl, kill, ...) have their own flags
	}
	for _, m := range flagRE.FindAllStringSubmatch(rest, -1) {
		f := strings.TrimLeft(m[1], "-")
		switch {
		case set != nil && !set[f]:
			t.Errorf("%s: -%s is not a %s flag (in %q)", doc, f, what, piece)
		case set == nil && !server[f] && !cli[f]:
			t.Errorf("%s: -%s is neither a fanfared nor a fanfare flag (in %q)", doc, f, piece)
		}
	}
}

// codePieces returns the lines of fenced code blocks and the inline code
// spans of a markdown document.
func codePieces(doc string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			out = append(out, line)
			continue
		}
		parts := strings.Split(line, "`")
		for i := 1; i < len(parts); i += 2 {
			out = append(out, parts[i])
		}
	}
	return out
}

// cliFlags reads the flag names and FANFARE_* names of the operator CLI
// from cmd/fanfare's source: the string literal naming the flag in every
// fs.StringVar / fs.Int / ... and secretVar call, and every "FANFARE_..."
// literal.
func cliFlags(t *testing.T) (flags, envs map[string]bool) {
	t.Helper()
	files, err := filepath.Glob("../fanfare/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("cmd/fanfare sources: %v (%d files)", err, len(files))
	}
	flags, envs = map[string]bool{}, map[string]bool{}
	nameArg := map[string]int{
		"String": 0, "Int": 0, "Int64": 0, "Uint": 0, "Uint64": 0, "Float64": 0, "Bool": 0, "Duration": 0,
		"StringVar": 1, "IntVar": 1, "Int64Var": 1, "UintVar": 1, "Uint64Var": 1, "Float64Var": 1, "BoolVar": 1,
		"DurationVar": 1, "Var": 1, "Func": 0, "BoolFunc": 0, "TextVar": 1,
	}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if s, err := strconv.Unquote(n.Value); err == nil && strings.HasPrefix(s, "FANFARE_") {
					envs[s] = true
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "secretVar" && len(n.Args) > 3 {
					// secretVar(fs, e, p, name, envVar, usage): a flag never printed.
					if lit, ok := n.Args[3].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if s, err := strconv.Unquote(lit.Value); err == nil {
							flags[s] = true
						}
					}
					return true
				}
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "fs" {
					return true
				}
				i, ok := nameArg[sel.Sel.Name]
				if !ok || i >= len(n.Args) {
					return true
				}
				if lit, ok := n.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						flags[s] = true
					}
				}
			}
			return true
		})
	}
	return flags, envs
}
