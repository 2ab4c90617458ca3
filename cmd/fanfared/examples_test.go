package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/limiter/local"
)

// The deployment examples of docs/examples.
const (
	examplesDir       = docsDir + "/examples"
	exampleConfig     = examplesDir + "/fanfared.json"
	exampleEnv        = examplesDir + "/fanfared.env"
	exampleUnit       = examplesDir + "/fanfared.service"
	exampleLimits     = examplesDir + "/limits.json"
	exampleUnlimited  = examplesDir + "/limits-unlimited.json"
	examplesReadme    = examplesDir + "/README.md"
	benchmarksDocPath = docsDir + "/benchmarks.md"
)

// noEnv is an empty environment, so that the machine's FANFARE_* variables
// do not leak into what the examples load.
func noEnv(string) string { return "" }

// TestExampleConfig loads docs/examples/fanfared.json with the server's own
// loader (flags > environment > file > default), checks that its values
// arrive (a large integer written as a JSON number included), and that
// docs/examples/README.md comments every key it sets.
func TestExampleConfig(t *testing.T) {
	cfg, err := loadConfig([]string{"-config", exampleConfig}, noEnv, io.Discard)
	if err != nil {
		t.Fatalf("loadConfig(%s): %v", exampleConfig, err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"ws-addr", cfg.WSAddr, "0.0.0.0:8081"},
		{"outbound-bytes", cfg.OutboundBytes, 1 << 20},
		{"egress-bandwidth", cfg.EgressBandwidth, int64(1_250_000_000)},
		{"shards", cfg.Shards, 8},
		{"merge-window", cfg.MergeWindow, 200 * time.Millisecond},
		{"retention", cfg.Retention, time.Duration(0)},
		{"limits-file", cfg.LimitsFile, "/etc/fanfare/limits.json"},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}

	// The environment overrides the file, a flag overrides both.
	env := func(k string) string {
		if k == "FANFARE_SHARDS" {
			return "6"
		}
		return ""
	}
	if cfg, err := loadConfig([]string{"-config", exampleConfig}, env, io.Discard); err != nil || cfg.Shards != 6 {
		t.Errorf("with FANFARE_SHARDS=6: shards %v, err %v; want 6", cfg.Shards, err)
	}
	if cfg, err := loadConfig([]string{"-config", exampleConfig, "-shards", "3"}, env, io.Discard); err != nil || cfg.Shards != 3 {
		t.Errorf("with -shards 3: shards %v, err %v; want 3", cfg.Shards, err)
	}

	var keys map[string]any
	if err := json.Unmarshal(readFileT(t, exampleConfig), &keys); err != nil {
		t.Fatal(err)
	}
	readme := string(readFileT(t, examplesReadme))
	for k := range keys {
		if !strings.Contains(readme, "| `"+k+"` |") {
			t.Errorf("%s: key %q has no row in %s", exampleConfig, k, examplesReadme)
		}
	}
}

// TestExampleLimits loads both limits documents with the loader of
// -limits-file, decodes them strictly (as PUT /admin/v1/limits does: a
// misspelt field fails), checks that limits.json is exactly the defaults
// and that limits-unlimited.json switches off the rules docs/benchmarks.md
// says it does, and that a limiter running on it admits a flood.
func TestExampleLimits(t *testing.T) {
	for _, path := range []string{exampleLimits, exampleUnlimited} {
		dec := json.NewDecoder(bytes.NewReader(readFileT(t, path)))
		dec.DisallowUnknownFields()
		var l limiter.Limits
		if err := dec.Decode(&l); err != nil {
			t.Errorf("%s: strict decode: %v", path, err)
		}
	}

	def, err := loadLimits(exampleLimits)
	if err != nil {
		t.Fatalf("loadLimits(%s): %v", exampleLimits, err)
	}
	var raw struct {
		Rules map[string]json.RawMessage `json:"rules"`
	}
	if err := json.Unmarshal(readFileT(t, exampleLimits), &raw); err != nil {
		t.Fatal(err)
	}
	for name := range limiter.DefaultRules() {
		if _, ok := raw.Rules[name]; !ok {
			t.Errorf("%s: rule %s is missing (the file spells out every rule)", exampleLimits, name)
		}
	}
	if want := limiter.Default(); !reflect.DeepEqual(def, want) {
		got, _ := json.Marshal(def)
		w, _ := json.Marshal(want)
		t.Errorf("%s is not the default limits document:\n got %s\nwant %s", exampleLimits, got, w)
	}

	off, err := loadLimits(exampleUnlimited)
	if err != nil {
		t.Fatalf("loadLimits(%s): %v", exampleUnlimited, err)
	}
	wantOff := []string{"connect", "pull", "user_all", "user_group"}
	for _, name := range wantOff {
		if r := off.Rules[name]; r.Limit != 0 {
			t.Errorf("%s: rule %s has limit %d, want 0 (off)", exampleUnlimited, name, r.Limit)
		}
	}
	bench := string(readFileT(t, benchmarksDocPath))
	if !strings.Contains(bench, "docs/examples/limits-unlimited.json") {
		t.Errorf("%s does not name docs/examples/limits-unlimited.json", benchmarksDocPath)
	}
	for _, name := range wantOff {
		if !strings.Contains(bench, "`"+name+"`") {
			t.Errorf("%s: the rules the unlimited file turns off should be named; %s is not", benchmarksDocPath, name)
		}
	}

	lim, err := local.New(local.Config{Limits: off})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 5000 {
		d, err := lim.Allow(ctx,
			limiter.Check{Rule: limiter.UserGroup, Key: "bench", ID: 1},
			limiter.Check{Rule: limiter.UserAll, Key: "bench"},
			limiter.Check{Rule: limiter.Pull, User: "bench"},
			limiter.Check{Rule: limiter.Connect, Key: "node", User: "bench"})
		if err != nil || !d.Allowed {
			t.Fatalf("request %d under the unlimited document: %+v, %v; want admitted", i, d, err)
		}
	}
	// The same flood under the defaults is refused early: the check above
	// can fail.
	lim, err = local.New(local.Config{Limits: def})
	if err != nil {
		t.Fatal(err)
	}
	denied := false
	for range 50 {
		d, err := lim.Allow(ctx, limiter.Check{Rule: limiter.UserGroup, Key: "bench", ID: 1})
		if err != nil {
			t.Fatal(err)
		}
		denied = denied || !d.Allowed
	}
	if !denied {
		t.Error("50 sends at once under the default limits were all admitted; want user_group to refuse some")
	}
}

var (
	unitFlagRE = regexp.MustCompile(`\s-([a-z][a-z0-9-]*)`)
	envNameRE  = regexp.MustCompile(`^(FANFARE_[A-Z0-9_]+)=`)
)

// TestExampleUnit checks the systemd unit and its environment file against
// the server: every flag on ExecStart and every FANFARE_* variable is one
// of fanfared's, the config file it names is the example's, and
// TimeoutStopSec leaves the drain (-shutdown-timeout) time to finish.
func TestExampleUnit(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("fanfared", flag.ContinueOnError)
	c.flags(fs)
	flags, envs := map[string]bool{}, map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		flags[f.Name] = true
		envs[envName(f.Name)] = true
	})

	unit := readFileT(t, exampleUnit)
	var execStart string
	var stop time.Duration
	sawEnvFile := false
	sc := bufio.NewScanner(bytes.NewReader(unit))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		key, val, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		switch key {
		case "ExecStart":
			execStart = val
		case "Environment":
			if m := envNameRE.FindStringSubmatch(val); m == nil || !envs[m[1]] {
				t.Errorf("%s: %s sets no fanfared variable", exampleUnit, line)
			}
		case "EnvironmentFile":
			sawEnvFile = val == "/etc/fanfare/fanfared.env"
		case "TimeoutStopSec":
			d, err := time.ParseDuration(val + "s")
			if err != nil {
				t.Fatalf("%s: %s: %v", exampleUnit, line, err)
			}
			stop = d
		}
	}
	if !strings.HasPrefix(execStart, "/usr/local/bin/fanfared ") || !strings.Contains(execStart, "-config /etc/fanfare/fanfared.json") {
		t.Errorf("%s: ExecStart %q: want /usr/local/bin/fanfared -config /etc/fanfare/fanfared.json", exampleUnit, execStart)
	}
	for _, m := range unitFlagRE.FindAllStringSubmatch(execStart, -1) {
		if !flags[m[1]] {
			t.Errorf("%s: ExecStart: -%s is not a fanfared flag", exampleUnit, m[1])
		}
	}
	if !sawEnvFile {
		t.Errorf("%s: want EnvironmentFile=/etc/fanfare/fanfared.env", exampleUnit)
	}
	cfg, err := loadConfig([]string{"-config", exampleConfig}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if stop <= cfg.ShutdownTimeout {
		t.Errorf("%s: TimeoutStopSec %v does not exceed the example's shutdown-timeout %v", exampleUnit, stop, cfg.ShutdownTimeout)
	}

	// The environment file: every variable is fanfared's, the secrets are
	// long enough for the validation they meet, and with it the example
	// configuration still loads.
	vars := map[string]string{}
	sc = bufio.NewScanner(bytes.NewReader(readFileT(t, exampleEnv)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := envNameRE.FindStringSubmatch(line)
		if m == nil || !envs[m[1]] {
			t.Errorf("%s: %q sets no fanfared variable", exampleEnv, line)
			continue
		}
		vars[m[1]] = strings.TrimPrefix(line, m[0])
	}
	for _, v := range []string{"FANFARE_JWT_SECRET", "FANFARE_ADMIN_TOKEN", "FANFARE_ROOM_TOKEN_SECRET", "FANFARE_POSTGRES_URL", "FANFARE_REDIS_ADDR"} {
		if _, ok := vars[v]; !ok {
			t.Errorf("%s: %s is missing", exampleEnv, v)
		}
	}
	getenv := func(k string) string { return vars[k] }
	if cfg, err := loadConfig([]string{"-config", exampleConfig}, getenv, io.Discard); err != nil {
		t.Errorf("the example config with %s: %v", exampleEnv, err)
	} else if cfg.PostgresURL == "" || cfg.RedisAddr == "" {
		t.Errorf("the example config with %s: postgres %q, redis %q; want cluster mode", exampleEnv, cfg.PostgresURL, cfg.RedisAddr)
	}
}

func readFileT(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
