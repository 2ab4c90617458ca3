package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// exitStatus ends every usage text: the same three codes for every
// command (and for fanfared).
const exitStatus = "exit status: 0 ok (-h included), 1 runtime failure (server unreachable,\n" +
	"request refused, benchmark failed), 2 usage error (unknown flag, bad value,\n" +
	"missing setting)."

// errHelp is returned by a command whose -h printed its usage: run
// answers nil (exit 0).
var errHelp = errors.New("help requested")

// usageError is a mistake in the command line: exit status 2. An empty
// msg means the usage was printed already.
type usageError struct {
	cmd string // "degrade", "bench room"; empty = fanfare itself
	msg string
}

func (e *usageError) Error() string { return e.msg }

func (e *usageError) prog() string {
	if e.cmd == "" {
		return "fanfare"
	}
	return "fanfare " + e.cmd
}

// cmdFlags is a command's flag set with the usage text every command
// shares: its synopsis, what it does, its flags and the exit status.
// Parse errors are returned, not printed (exitCode reports them once);
// -h prints the usage to stdout.
type cmdFlags struct {
	*flag.FlagSet
	name, synopsis, about string
}

// newFlags returns the flag set of "fanfare name". about is a few lines
// of text, already wrapped.
func newFlags(name, synopsis, about string) *cmdFlags {
	fs := flag.NewFlagSet("fanfare "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := &cmdFlags{FlagSet: fs, name: name, synopsis: synopsis, about: strings.TrimSpace(about)}
	fs.Usage = func() {} // parse prints the usage for -h; errors go to exitCode
	return c
}

// printUsage writes the command's usage text to w.
func (c *cmdFlags) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: fanfare %s %s\n\n%s\n\nflags:\n", c.name, c.synopsis, c.about)
	c.SetOutput(w)
	c.PrintDefaults()
	c.SetOutput(io.Discard)
	fmt.Fprintf(w, "\n%s\n", exitStatus)
}

// parse parses args: -h prints the usage to e.stdout and returns errHelp;
// a bad flag or a stray argument is a usageError.
func (c *cmdFlags) parse(e *env, args []string) error {
	err := c.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		c.printUsage(e.stdout)
		return errHelp
	case err != nil:
		return c.usageErr("%v", err)
	case c.NArg() > 0:
		return c.usageErr("unexpected arguments %q", c.Args())
	}
	return nil
}

// usageErr returns a usageError of this command.
func (c *cmdFlags) usageErr(format string, a ...any) error {
	return &usageError{cmd: c.name, msg: fmt.Sprintf(format, a...)}
}

// exitCode reports err on stderr and returns the exit status: 0 ok (help
// included), 1 runtime failure, 2 usage error.
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil || errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		if ue.msg != "" {
			fmt.Fprintf(stderr, "%s: %s\nrun '%s -h' for usage\n", ue.prog(), ue.msg, ue.prog())
		}
		return 2
	default:
		fmt.Fprintln(stderr, "fanfare:", err)
		return 1
	}
}
