package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/gateway/wire"
)

// TestTuningFlags: every reloadable engine setting has a flag named after
// its JSON name, and config.tuning maps each flag to its own field.
func TestTuningFlags(t *testing.T) {
	var args []string
	want := map[string]any{}
	for i, name := range fanout.TuningNames() {
		flagName := strings.ReplaceAll(name, "_", "-")
		if !tuningFlags[flagName] {
			t.Errorf("%s: no reloadable flag -%s", name, flagName)
		}
		// A distinct valid value per field, by its JSON kind.
		var v string
		var j any
		switch name {
		case "tier2_off":
			v, j = "true", true
		case "merge_window", "queue_target_wait", "trigger_clear_after", "hot_baseline_tau", "hot_clear_after",
			"store_latency_alarm", "active_window", "active_refresh":
			d := time.Duration(i+1) * 100 * time.Millisecond
			v, j = d.String(), d.String()
		case "queue_safety", "group_rate", "downlink_rate", "downlink_fraction", "trigger_clear_fraction", "hot_factor",
			"hot_min_rate", "hot_baseline_floor", "hot_group_rate", "egress_fraction", "tier2_min_active_share":
			f := float64(i+1) / 100
			v, j = strconv.FormatFloat(f, 'f', -1, 64), f
		default:
			v, j = strconv.Itoa(i+2), float64(i+2)
		}
		args = append(args, "-"+flagName+"="+v)
		want[name] = j
	}
	c, err := loadConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(c.tuning())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("-%s: tuning %s got %v, want %v", strings.ReplaceAll(name, "_", "-"), name, got[name], w)
		}
	}
}

// TestConfigChangedFlags: a reload sorts what changed into engine tuning
// (applied) and the rest (restart).
func TestConfigChangedFlags(t *testing.T) {
	getenv := func(string) string { return "" }
	a, err := loadConfig([]string{"-merge-window", "100ms", "-shards", "4"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadConfig([]string{"-merge-window", "300ms", "-shards", "8", "-group-rate", "5", "-log-level", "warn"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tuning, restart := a.changedFlags(b)
	if want := []string{"group-rate", "merge-window"}; !slices.Equal(tuning, want) {
		t.Errorf("tuning: got %v, want %v", tuning, want)
	}
	if want := []string{"log-level", "shards"}; !slices.Equal(restart, want) {
		t.Errorf("restart: got %v, want %v", restart, want)
	}
	if tn, rs := a.changedFlags(a); len(tn)+len(rs) != 0 {
		t.Errorf("same config: got %v %v, want nothing", tn, rs)
	}
}

// tuningDoc reads GET /admin/v1/tuning as a JSON object.
func (ts *testServer) tuningDoc() map[string]any {
	ts.t.Helper()
	var doc map[string]any
	if st := ts.do("GET", "/admin/v1/tuning", ts.admin, nil, &doc); st != http.StatusOK {
		ts.t.Fatalf("GET /admin/v1/tuning: status %d", st)
	}
	return doc
}

// TestTuningAdminAPI: GET answers the whole document; a PUT of the edited
// document is in force at once (GET shows it); an incomplete or invalid
// document is 400 and changes nothing; users may not read or change it.
// The shard queue and send latency metrics are exported.
func TestTuningAdminAPI(t *testing.T) {
	ts := startServer(t, "embedded", "-merge-window", "150ms")
	doc := ts.tuningDoc()
	if len(doc) != len(fanout.TuningNames()) {
		t.Fatalf("GET: got %d fields, want %d: %v", len(doc), len(fanout.TuningNames()), doc)
	}
	if doc["merge_window"] != "150ms" || doc["group_rate"] != 20.0 {
		t.Errorf("GET: merge_window %v, group_rate %v; want 150ms (flag), 20 (default)", doc["merge_window"], doc["group_rate"])
	}

	doc["merge_window"] = "400ms"
	doc["group_rate"] = 55.0
	doc["tier2_off"] = true
	var put map[string]any
	if st := ts.do("PUT", "/admin/v1/tuning", ts.admin, doc, &put); st != http.StatusOK {
		t.Fatalf("PUT: status %d (%v)", st, put)
	}
	got := ts.tuningDoc()
	for k, want := range map[string]any{"merge_window": "400ms", "group_rate": 55.0, "tier2_off": true} {
		if got[k] != want || put[k] != want {
			t.Errorf("after PUT: %s GET %v, PUT answered %v, want %v", k, got[k], put[k], want)
		}
	}
	if got := ts.srv.eng.Tuning().MergeWindow; got != 400*time.Millisecond {
		t.Errorf("engine merge window: got %v, want 400ms", got)
	}

	bad := []struct {
		name string
		mod  func(map[string]any)
		want string
	}{
		{"missing field", func(d map[string]any) { delete(d, "max_merge") }, "missing max_merge"},
		{"unknown field", func(d map[string]any) { d["merge_windw"] = "1s" }, "unknown field"},
		{"invalid value", func(d map[string]any) { d["merge_window"] = "1m" }, "merge_window"},
		{"two invalid values", func(d map[string]any) { d["queue_safety"] = 3.0; d["group_buffer"] = -1.0 }, "group_buffer"},
		{"duration as number", func(d map[string]any) { d["trigger_clear_after"] = 5.0 }, "trigger_clear_after"},
	}
	for _, tt := range bad {
		d := ts.tuningDoc()
		tt.mod(d)
		var e wire.ErrorResponse
		if st := ts.do("PUT", "/admin/v1/tuning", ts.admin, d, &e); st != http.StatusBadRequest {
			t.Errorf("%s: got status %d, want 400", tt.name, st)
		}
		if e.Error.Code != wire.CodeBadRequest || !strings.Contains(e.Error.Message, tt.want) {
			t.Errorf("%s: got %+v, want bad_request naming %q", tt.name, e.Error, tt.want)
		}
	}
	if after := ts.tuningDoc(); after["merge_window"] != "400ms" || after["queue_safety"] != 0.6 {
		t.Errorf("refused PUTs changed the tuning: %v", after)
	}
	if st := ts.do("GET", "/admin/v1/tuning", ts.token("alice", 0), nil, nil); st != http.StatusUnauthorized && st != http.StatusForbidden {
		t.Errorf("GET as a user: got %d, want 401 or 403", st)
	}
	if st := ts.do("PUT", "/admin/v1/tuning", "", doc, nil); st != http.StatusUnauthorized {
		t.Errorf("PUT without a token: got %d, want 401", st)
	}

	// Metrics: queue depth and bound per shard, and the latency of acks.
	gid := ts.createGroup("alice")
	var sr wire.SendResponse
	if st := ts.do("POST", fmt.Sprintf("/v1/groups/%d/messages", gid), ts.admin, wire.SendRequest{ID: "m1", Body: json.RawMessage(`"hi"`)}, &sr); st != http.StatusOK {
		t.Fatalf("send: status %d", st)
	}
	body := metricsText(t, ts)
	for _, want := range []string{
		`fanfare_shard_queue_depth{pool="normal",shard="0"} `, `fanfare_shard_queue_bound{pool="normal",shard="3"} `,
		`fanfare_shard_queue_bound{pool="hot",shard="1"} `, "fanfare_send_latency_seconds_bucket{",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if m := regexp.MustCompile(`(?m)^fanfare_send_latency_seconds_count (\d+)$`).FindStringSubmatch(body); m == nil || m[1] != "1" {
		t.Errorf("fanfare_send_latency_seconds_count: got %v, want 1", m)
	}
}

func metricsText(t *testing.T, ts *testServer) string {
	t.Helper()
	resp, err := http.Get(ts.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReloadConfigTuning: SIGHUP's reload re-reads the -config file with
// the precedence of the start (a flag still beats the file) and puts a new
// merge window in force on the running node: a message held by a 10 s
// window reaches the same, still open connection within the new one. A
// bad file changes nothing.
func TestReloadConfigTuning(t *testing.T) {
	path := writeFile(t, "fanfare.json", `{"merge-window":"10s","group-rate":50,"downlink-fraction":0.7}`)
	ts := startServer(t, "embedded", "-config", path, "-group-rate", "7")
	if doc := ts.tuningDoc(); doc["merge_window"] != "10s" || doc["group_rate"] != 7.0 || doc["downlink_fraction"] != 0.7 {
		t.Fatalf("at start: merge_window %v, group_rate %v, downlink_fraction %v; want 10s (file), 7 (flag), 0.7 (file)",
			doc["merge_window"], doc["group_rate"], doc["downlink_fraction"])
	}
	gid := ts.createGroup("alice")
	rc := ts.dialRaw("alice")
	ts.degrade(wire.ScopeGroup, gid, lv(1), 0)
	if d, _ := readUntil[*wire.Degraded](rc, 5*time.Second); d.GID != gid || d.Level != 1 {
		t.Fatalf("L1 notice: got %+v", d)
	}
	rc.send(fmt.Sprintf(`{"type":"send","id":"a1","gid":%d,"body":"one"}`, gid))
	if a, _ := readUntil[*wire.Ack](rc, 5*time.Second); a.Seq != 1 {
		t.Fatalf("ack: got %+v, want seq 1", a)
	}
	if fs := quietFramesFor(rc, 300*time.Millisecond); len(fs) != 0 {
		t.Fatalf("inside a 10 s window: got frames %v, want none", fs)
	}

	// The file changes the window, the group rate (the flag still wins),
	// drops downlink-fraction (back to its default) and changes a setting
	// that needs a restart (warned about, not applied).
	if err := os.WriteFile(path, []byte(`{"merge-window":"20ms","group-rate":60,"shards":8}`), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := ts.srv.reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	b, _ := readUntil[*wire.Batch](rc, 3*time.Second)
	if len(b.Messages) != 1 || b.Messages[0].Seq != 1 {
		t.Fatalf("batch after reload: got %+v, want seq 1", b)
	}
	t.Logf("held message pushed %v after the reload", time.Since(start))
	doc := ts.tuningDoc()
	if doc["merge_window"] != "20ms" || doc["group_rate"] != 7.0 || doc["downlink_fraction"] != 0.8 {
		t.Errorf("after reload: merge_window %v, group_rate %v, downlink_fraction %v; want 20ms, 7 (flag), 0.8 (default)",
			doc["merge_window"], doc["group_rate"], doc["downlink_fraction"])
	}
	if ts.srv.cfg.Shards != 4 {
		t.Errorf("shards changed by a reload: %d", ts.srv.cfg.Shards)
	}

	// The same connection keeps working with the new window.
	rc.send(fmt.Sprintf(`{"type":"send","id":"a2","gid":%d,"body":"two"}`, gid))
	if a, _ := readUntil[*wire.Ack](rc, 5*time.Second); a.Seq != 2 {
		t.Fatalf("ack after reload: got %+v, want seq 2", a)
	}
	if b, _ := readUntil[*wire.Batch](rc, 3*time.Second); len(b.Messages) != 1 || b.Messages[0].Seq != 2 {
		t.Fatalf("batch after reload: got %+v, want seq 2", b)
	}

	// A bad file: reload fails, the tuning in force stays.
	if err := os.WriteFile(path, []byte(`{"merge-window":"1h"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ts.srv.reload(); err == nil || !strings.Contains(err.Error(), "merge_window") {
		t.Errorf("reload of an invalid file: got %v, want an error naming merge_window", err)
	}
	if doc := ts.tuningDoc(); doc["merge_window"] != "20ms" {
		t.Errorf("after a failed reload: merge_window %v, want 20ms", doc["merge_window"])
	}
}

// TestReloadWithoutConfigKeepsAPITuning: without -config a reload has no
// engine settings to re-read; what the admin API set stays.
func TestReloadWithoutConfigKeepsAPITuning(t *testing.T) {
	ts := startServer(t, "embedded")
	doc := ts.tuningDoc()
	doc["merge_window"] = "333ms"
	if st := ts.do("PUT", "/admin/v1/tuning", ts.admin, doc, nil); st != http.StatusOK {
		t.Fatalf("PUT: status %d", st)
	}
	if err := ts.srv.reload(); err != nil {
		t.Fatal(err)
	}
	if got := ts.tuningDoc()["merge_window"]; got != "333ms" {
		t.Errorf("after reload: merge_window %v, want 333ms (set through the API)", got)
	}
}

// TestTuningFlagsFromSettings: each fanout.Tuning setting's flag is
// derived from its tags: help text, zero default (the engine's default is
// what the help says zero means), -h group; a negative value where the
// setting has no negative meaning, and a value past its bound, are refused
// naming the setting.
func TestTuningFlagsFromSettings(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("fanfared", flag.ContinueOnError)
	c.flags(fs)
	group := map[string]string{}
	for _, g := range flagGroups {
		for _, n := range g.flags {
			group[n] = g.name
		}
	}
	for _, s := range fanout.TuningSettings() {
		name := strings.ReplaceAll(s.Name, "_", "-")
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("%s: no flag -%s", s.Name, name)
			continue
		}
		if f.Usage != s.Usage {
			t.Errorf("-%s: usage %q, want the setting's %q", name, f.Usage, s.Usage)
		}
		if f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
			t.Errorf("-%s: flag default %q, want zero (the engine's default)", name, f.DefValue)
		}
		if group[name] != s.Group {
			t.Errorf("-%s: in -h group %q, want %q", name, group[name], s.Group)
		}
		if name == "tier2-off" {
			continue
		}
		neg := "-1"
		if strings.Contains(f.Usage, "negative = ") {
			neg = ""
		}
		for _, bad := range []string{neg, "11s", "1.5", "not-a-number"} {
			switch {
			case bad == "":
				continue
			case bad == "11s" && name != "merge-window":
				continue
			case bad == "1.5" && !slices.Contains([]string{"queue-safety", "downlink-fraction", "egress-fraction", "trigger-clear-fraction", "tier2-min-active-share"}, name):
				continue
			}
			_, err := loadConfig([]string{"-" + name + "=" + bad}, func(string) string { return "" }, io.Discard)
			var ue *usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), name) && !strings.Contains(err.Error(), s.Name) {
				t.Errorf("-%s=%s: got %v, want a usage error naming it", name, bad, err)
			}
		}
	}
}
