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
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if errors.Is(err, errUsage) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fanfare:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := &env{getenv: getenv, stdout: stdout, stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return errUsage
		}
		return nil
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "fanfare: unknown command %q\n", args[0])
		usage(stderr)
		return errUsage
	}
	return c.run(ctx, e, args[1:])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fanfare <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nEvery flag also reads FANFARE_<FLAG> from the environment (e.g. -admin-token: FANFARE_ADMIN_TOKEN).")
}
