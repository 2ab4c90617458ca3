package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// cli runs fanfare with args as main does and returns the exit status
// and what went to stdout and stderr.
func cli(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, args, func(k string) string { return env[k] }, &out, &errOut)
	code = exitCode(err, &errOut)
	return code, out.String(), errOut.String()
}

// TestHelpEverywhere: -h, help and every command's and benchmark's -h
// exit 0 and print one usage style to stdout: the synopsis, what the
// command does, its flags, the exit status.
func TestHelpEverywhere(t *testing.T) {
	runs := [][]string{{"-h"}, {"--help"}, {"help"}, {"bench", "-h"}, {"help", "bench"},
		{"bench", "broadcast", "-h"}, {"bench", "room", "-h"}, {"help", "bench", "room"}}
	for name := range commands {
		runs = append(runs, []string{name, "-h"}, []string{"help", name})
	}
	for _, args := range runs {
		code, out, errOut := cli(t, nil, args...)
		if code != 0 || errOut != "" {
			t.Errorf("fanfare %s: got exit %d, stderr %q; want 0 and nothing", strings.Join(args, " "), code, errOut)
		}
		prog := "fanfare"
		if cmd := strings.Join(args, " "); args[0] != "-h" && args[0] != "--help" && cmd != "help" {
			cmd = strings.TrimPrefix(strings.TrimSuffix(cmd, " -h"), "help ")
			prog += " " + cmd
		}
		if !strings.HasPrefix(out, "usage: "+prog+" ") || !strings.Contains(out, exitStatus) {
			t.Errorf("fanfare %s: stdout does not start with %q or lacks the exit status:\n%s", strings.Join(args, " "), "usage: "+prog, out)
		}
		if _, isCmd := commands[strings.TrimPrefix(prog, "fanfare ")]; (isCmd && prog != "fanfare bench") || strings.HasPrefix(prog, "fanfare bench ") {
			if !strings.Contains(out, "\n\nflags:\n  -") {
				t.Errorf("fanfare %s: no flags section:\n%s", strings.Join(args, " "), out)
			}
		}
	}
}

// TestUsageErrorsExitTwo: a mistake in the command line exits 2 with a
// message on stderr (and nothing on stdout); nothing is sent anywhere.
func TestUsageErrorsExitTwo(t *testing.T) {
	env := map[string]string{"FANFARE_HTTP": "http://127.0.0.1:1", "FANFARE_ADMIN_TOKEN": "adm"}
	for _, tc := range []struct {
		args []string
		want string // on stderr
	}{
		{nil, "usage: fanfare <command>"},
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"help", "nope"}, `unknown command "nope"`},
		{[]string{"degrade", "-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"degrade", "-level", "9"}, "-level must be 0-4 or clear"},
		{[]string{"degrade", "-rooms", "-level", "3"}, "-level must be 0-2 or clear"},
		{[]string{"degrade", "-rooms", "-gid", "3", "-level", "1"}, "exclude each other"},
		{[]string{"degrade", "-gid", "7"}, "go with -level"},
		{[]string{"degrade", "-level", "1", "extra"}, "unexpected arguments"},
		{[]string{"rooms"}, "-room is required"},
		{[]string{"rooms", "-room", "x", "-state", "ajar"}, "-state must be open or closed"},
		{[]string{"token"}, "-uid is required"},
		{[]string{"token", "-uid", "a"}, "no secret"},
		{[]string{"token", "-uid", "a", "-jwt-secret", "short"}, "-jwt-secret"},
		{[]string{"migrate"}, "no Postgres URL"},
		{[]string{"bench"}, "usage: fanfare bench broadcast|room"},
		{[]string{"bench", "nope"}, `unknown benchmark "nope"`},
		{[]string{"bench", "broadcast", "-jwt-secret", "0123456789abcdef0123456789abcdef", "-rate", "0"}, "-rate must be positive"},
		{[]string{"bench", "room", "-vips", "x"}, "invalid value"},
	} {
		code, out, errOut := cli(t, env, tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("fanfare %s: got exit %d, stdout %q, stderr %q; want 2, nothing, %q",
				strings.Join(tc.args, " "), code, out, errOut, tc.want)
		}
	}
	// Without an admin token, the admin commands refuse before any call.
	code, _, errOut := cli(t, map[string]string{"FANFARE_HTTP": "http://127.0.0.1:1"}, "degrade")
	if code != 2 || !strings.Contains(errOut, "no admin token") {
		t.Errorf("degrade without a token: got exit %d, %q; want 2, no admin token", code, errOut)
	}
}

// TestRuntimeFailureExitsOne: a server that cannot be reached is a
// runtime failure, not a usage error.
func TestRuntimeFailureExitsOne(t *testing.T) {
	env := map[string]string{"FANFARE_HTTP": "http://127.0.0.1:1", "FANFARE_ADMIN_TOKEN": "adm"}
	for _, args := range [][]string{{"degrade"}, {"rooms", "-room", "x", "-show"}} {
		code, out, errOut := cli(t, env, args...)
		if code != 1 || out != "" || !strings.HasPrefix(errOut, "fanfare: ") {
			t.Errorf("fanfare %s: got exit %d, stdout %q, stderr %q; want 1 and the error", strings.Join(args, " "), code, out, errOut)
		}
	}
}

// TestBenchRoomSaysSimulation: bench room's help, text and JSON output
// say it is a simulation, not a measurement of a server.
func TestBenchRoomSaysSimulation(t *testing.T) {
	small := []string{"bench", "room", "-normal", "50", "-vips", "10", "-spread", "5s", "-admit-rate", "20"}
	for _, args := range [][]string{{"bench", "room", "-h"}, small, append(small, "-json")} {
		code, out, _ := cli(t, nil, args...)
		if code != 0 || !strings.Contains(strings.ToLower(out), "simulation") || !strings.Contains(out, "no server") {
			t.Errorf("fanfare %s: exit %d; output does not say it is a simulation with no server:\n%s", strings.Join(args, " "), code, out)
		}
	}
}
