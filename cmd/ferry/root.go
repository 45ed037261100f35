package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"time"

	"github.com/spf13/cobra"
)

// app holds the global flags and the streams every command uses.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	store          string
	json           bool
	noTimes        bool
	now            func() time.Time
}

func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, now: time.Now}
	root := &cobra.Command{
		Use:   "ferry",
		Short: "Inspect and operate a Ferry store",
		Long: `ferry inspects and operates a Ferry store: topics, queues, consumer groups
and messages.

The inspection commands (topics, topic, groups, lag, cat, tail, stat,
verify) open the store read-only and take no lock, so they work while the
process that owns the store runs. The commands that write (send, reset)
open the store as its owner and are refused while another process holds it.

The store is a directory, given with --store DIR or --store file:///DIR,
or in the environment variable FERRY_STORE.

Exit status: 0 success, 1 error, 2 usage error, 3 damage found (by verify,
or by any command that met it: the owner's next Open refuses the store).`,
		Example: `  ferry --store /var/lib/app/ferry topics
  ferry --store /var/lib/app/ferry lag billing orders
  ferry --store /var/lib/app/ferry tail -f orders --tag urgent
  echo '{"id":1}' | ferry --store ./data send orders --create --queues 4`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&a.store, "store", os.Getenv(storeEnv), "the store: a directory, DIR or file:///DIR (default $"+storeEnv+")")
	pf.BoolVar(&a.json, "json", false, "print JSON for scripts instead of tables")
	pf.BoolVar(&a.noTimes, "no-times", false, "leave out times and message IDs (which embed a time): for stable output")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &exitErr{code: exitUsage, err: fmt.Errorf("%w (see 'ferry %s --help')", err, c.Name())}
	})
	root.AddCommand(
		a.topicsCmd(), a.topicCmd(), a.groupsCmd(), a.lagCmd(),
		a.catCmd(), a.tailCmd(), a.sendCmd(), a.resetCmd(),
		a.verifyCmd(), a.statCmd(),
	)
	// An unknown command is a usage error too.
	root.Args = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageErrorf("unknown command %q (see 'ferry --help')", args[0])
		}
		return nil
	}
	root.RunE = func(c *cobra.Command, args []string) error {
		_ = c.Help()
		return usageErrorf("no command given")
	}
	return root
}

// nArgs checks the count of positional arguments as a usage error.
func nArgs(min, max int) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			return usageErrorf("%s: wrong number of arguments (usage: %s)", c.Name(), c.UseLine())
		}
		return nil
	}
}

// location parses --store.
func (a *app) location() (location, error) { return parseLocation(a.store) }

// openRead opens --store read-only.
func (a *app) openRead() (readStore, error) {
	loc, err := a.location()
	if err != nil {
		return nil, err
	}
	return openRead(loc)
}

// ctx returns the command's context.
func ctxOf(c *cobra.Command) context.Context {
	if ctx := c.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
