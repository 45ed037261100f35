// Command ferry inspects and operates a Ferry store: its topics, queues,
// consumer groups and messages.
//
// Inspection (topics, topic, groups, lag, cat, tail, verify, stat) opens
// the store read-only, without its lock, so it works while the process
// that owns the store runs. Commands that write (send, reset) open the
// store as its owner and are refused while another process holds it.
//
// Exit status: 0 success, 1 error, 2 usage error, 3 damage found (by
// verify, or by any command that met it: an error wrapping
// [ferry.ErrCorrupt]).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ferrymq/ferry"
)

// Exit statuses.
const (
	exitOK     = 0
	exitError  = 1
	exitUsage  = 2
	exitDamage = 3
)

// exitError carries the status a command ends with.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitErr{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// run runs the command line args and returns the exit status. SIGINT and
// SIGTERM cancel the command's context: tail -f stops and exits 0.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitErr
	code := exitError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case errors.Is(err, ferry.ErrCorrupt):
		code = exitDamage
	}
	if !errors.Is(err, errSilent) {
		fmt.Fprintln(stderr, "ferry:", strings.TrimPrefix(err.Error(), "ferry: "))
	}
	return code
}

// errSilent marks an error the command reported itself.
var errSilent = errors.New("reported")
