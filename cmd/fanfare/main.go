// Command fanfare is the operator CLI: token, migrate, degrade, rooms and
// bench. Run `fanfare help` for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

// env is what every subcommand gets: the process environment and output.
type env struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
}

var commands = map[string]command{}

// secretVar defines a string flag that defaults to the environment
// variable envVar and whose value is never printed: the help shows the
// variable's name, not its content (flag prints a default as it is, and a
// secret must not reach a terminal, a CI log or a bug report).
func secretVar(fs *flag.FlagSet, e *env, p *string, name, envVar, usage string) {
	*p = e.getenv(envVar)
	fs.Var(secretValue{p}, name, usage+" (default: $"+envVar+")")
}

// secretValue is a string flag.Value whose String is always empty, so no
// default is ever printed.
type secretValue struct{ p *string }

func (v secretValue) String() string { return "" }

func (v secretValue) Set(s string) error {
	*v.p = s
	return nil
}

func register(name, summary string, run func(ctx context.Context, env *env, args []string) error) {
	commands[name] = command{summary: summary, run: run}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// run runs the command line args: nil when it succeeded or printed the
// help it was asked for, a *usageError for a mistake in args, any other
// error for a failure (exitCode maps them to 0, 2 and 1).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := &env{getenv: getenv, stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		usage(stderr)
		return &usageError{}
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		usage(stdout)
		return nil
	case "help":
		if len(rest) == 0 {
			usage(stdout)
			return nil
		}
		// fanfare help degrade = fanfare degrade -h; fanfare help bench
		// room = fanfare bench room -h.
		name, rest = rest[0], append(rest[1:len(rest):len(rest)], "-h")
	}
	c, ok := commands[name]
	if !ok {
		return &usageError{msg: fmt.Sprintf("unknown command %q", name)}
	}
	if err := c.run(ctx, e, rest); err != nil && !errors.Is(err, errHelp) {
		return err
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: fanfare <command> [flags]

fanfare is the operator CLI of fanfared: it mints user tokens, applies the
Postgres schema, forces degradation levels, manages waiting rooms and runs
benchmarks. Every command takes -h.

commands:
`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-8s %s\n", "help", "this text; 'fanfare help <command>' is 'fanfare <command> -h'")
	fmt.Fprint(w, `
The flags naming a server or a secret default to the environment: -http
FANFARE_HTTP, -ws FANFARE_WS, -admin-token FANFARE_ADMIN_TOKEN, -jwt-secret
FANFARE_JWT_SECRET, -postgres-url FANFARE_POSTGRES_URL, -postgres-schema
FANFARE_POSTGRES_SCHEMA. Secrets are never printed, defaults included.

`+exitStatus+"\n")
}
