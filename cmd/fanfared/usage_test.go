package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFlagGroups: every flag of fanfared is in exactly one group of its
// usage text, and every name there is a flag; the groups the usage
// promises are there.
func TestFlagGroups(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("fanfared", flag.ContinueOnError)
	c.flags(fs)
	in := map[string]string{}
	var groups []string
	for _, g := range flagGroups {
		groups = append(groups, g.name)
		for _, n := range g.flags {
			if prev, dup := in[n]; dup {
				t.Errorf("-%s is in groups %s and %s", n, prev, g.name)
			}
			in[n] = g.name
			if fs.Lookup(n) == nil {
				t.Errorf("group %s names -%s, which is not a flag", g.name, n)
			}
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if in[f.Name] == "" {
			t.Errorf("-%s is in no group of flagGroups", f.Name)
		}
	})
	for _, want := range []string{"network", "auth", "store", "limits", "levels", "rooms", "cluster", "observability"} {
		if !strings.Contains(" "+strings.Join(groups, " ")+" ", " "+want+" ") {
			t.Errorf("no group %q in %v", want, groups)
		}
	}
}

// TestHelp: fanfared -h exits 0 and prints to stdout every flag once,
// under its group, with its variable, and no secret from the environment.
func TestHelp(t *testing.T) {
	const secret = "env-jwt-secret-0123456789abcdef-0123456789"
	env := map[string]string{"FANFARE_JWT_SECRET": secret, "FANFARE_ADMIN_TOKEN": secret + "-admin",
		"FANFARE_POSTGRES_URL": "postgres://u:" + secret + "@127.0.0.1:1/x"}
	for _, arg := range []string{"-h", "-help", "--help"} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{arg}, func(k string) string { return env[k] }, &out, &errOut)
		if code := exitCode(err, &errOut); code != 0 || errOut.Len() != 0 {
			t.Fatalf("fanfared %s: exit %d, stderr %q; want 0 and nothing", arg, code, errOut.String())
		}
		help := out.String()
		if !strings.HasPrefix(help, "usage: fanfared [flags]\n") || !strings.HasSuffix(help, exitStatus+"\n") {
			t.Errorf("fanfared %s: no synopsis or exit status:\n%s", arg, help)
		}
		if strings.Contains(help, secret) {
			t.Errorf("fanfared %s prints a secret from the environment", arg)
		}
		pos := 0
		for _, g := range flagGroups {
			i := strings.Index(help, "\n"+g.name+" (")
			if i < pos {
				t.Errorf("fanfared %s: group %s missing or out of order", arg, g.name)
				continue
			}
			pos = i
			for _, n := range g.flags {
				line := "\n  -" + n + " "
				j := strings.Index(help, line)
				if j < pos || strings.Count(help, line) != 1 {
					t.Errorf("fanfared %s: -%s not once under %s", arg, n, g.name)
					continue
				}
				if first, _, _ := strings.Cut(help[j+1:], "\n"); !strings.Contains(first, "$"+envName(n)) {
					t.Errorf("fanfared %s: -%s without $%s", arg, n, envName(n))
				}
			}
		}
	}
}

// TestExitStatus: a bad setting from a flag, the environment or the
// config file exits 2 with the problem and a pointer to -h on stderr; a
// listener that cannot open is a runtime failure (1).
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-bogus"}, nil, "flag provided but not defined: -bogus"},
		{[]string{"-shards", "x"}, nil, "invalid value"},
		{[]string{"-shards", "0"}, nil, "shards must be in 1..1024"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{nil, map[string]string{"FANFARE_SHARDS": "x"}, "FANFARE_SHARDS"},
		{[]string{"-config", filepath.Join(dir, "missing.json")}, nil, "config file"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, func(k string) string { return tc.env[k] }, &out, &errOut)
		code := exitCode(err, &errOut)
		if code != 2 || out.Len() != 0 || !strings.Contains(errOut.String(), tc.want) || !strings.Contains(errOut.String(), "fanfared -h") {
			t.Errorf("fanfared %v %v: got exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, tc.env, code, out.String(), errOut.String(), tc.want)
		}
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errOut bytes.Buffer
	err = run(ctx, []string{"-http-addr", taken.Addr().String(), "-ws-addr", "127.0.0.1:0", "-data-dir", filepath.Join(dir, "data"), "-log-level", "error"},
		func(string) string { return "" }, &bytes.Buffer{}, &errOut)
	if code := exitCode(err, &errOut); code != 1 || !strings.Contains(errOut.String(), "address already in use") {
		t.Errorf("fanfared on a taken port: got exit %d, %q; want 1 and the listen error", code, errOut.String())
	}
}
