package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// mainEnv makes the test binary run as ferry (for TestInterrupt).
const mainEnv = "FERRY_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" {
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	testscript.Main(m, map[string]func(){
		"ferry":      func() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) },
		"ferry-hold": func() { os.Exit(hold(os.Args[1:])) },
	})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Setup: func(e *testscript.Env) error {
			e.Setenv("GORACE", noExitSleep())
			return nil
		},
		UpdateScripts: os.Getenv("FERRY_UPDATE_SCRIPTS") != "",
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"flipbyte": cmdFlipByte,
			"waitfile": cmdWaitFile,
			"exitcode": cmdExitCode,
		},
	})
}

// noExitSleep returns $GORACE without the race detector's second of
// sleep at exit, which would make each command of a script under -race
// take a second.
func noExitSleep() string {
	return strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
}

// hold is the ferry-hold command: ferry-hold DIR READY [TOPIC N] opens
// the store in DIR as its owner, writes the file READY, then sends N
// messages "live-0" to "live-N-1" to queue 0 of TOPIC, one every 10 ms,
// and holds the store until it is killed or interrupted.
func hold(args []string) int {
	if len(args) != 2 && len(args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: ferry-hold DIR READY [TOPIC N]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st, err := filestore.Open(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry-hold:", err)
		return 1
	}
	defer st.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry-hold:", err)
		return 1
	}
	defer b.Close()
	if err := os.WriteFile(args[1], []byte("ready\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "ferry-hold:", err)
		return 1
	}
	if len(args) == 4 {
		n, _ := strconv.Atoi(args[3])
		p, err := b.NewProducer(ferry.WithRouter(ferry.ManualRouter(0)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "ferry-hold:", err)
			return 1
		}
		defer p.Close()
		for i := range n {
			if _, err := p.Send(ctx, &ferry.Message{Topic: args[2], Body: fmt.Appendf(nil, "live-%d", i)}); err != nil {
				fmt.Fprintln(os.Stderr, "ferry-hold:", err)
				return 1
			}
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return 0
			}
		}
	}
	<-ctx.Done()
	return 0
}

// cmdFlipByte is flipbyte FILE OFFSET: it flips the bits of one byte.
func cmdFlipByte(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: flipbyte FILE OFFSET")
	}
	name := ts.MkAbs(args[0])
	off, err := strconv.ParseInt(args[1], 10, 64)
	ts.Check(err)
	b, err := os.ReadFile(name)
	ts.Check(err)
	if off < 0 || off >= int64(len(b)) {
		ts.Fatalf("offset %d outside %s (%d bytes)", off, name, len(b))
	}
	b[off] ^= 0xff
	ts.Check(os.WriteFile(name, b, 0o600))
}

// cmdWaitFile is waitfile FILE: it waits (20 s at most) for FILE.
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitfile FILE")
	}
	name := ts.MkAbs(args[0])
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(name); err == nil {
			return
		}
	}
	ts.Fatalf("%s did not appear", name)
}

// cmdExitCode is exitcode N PROG ARGS...: it runs PROG, as exec does
// (stdout and stderr are then checked as exec's), and checks that it
// exits with status N.
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode N PROG [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		got = ee.ExitCode()
	case err != nil:
		ts.Fatalf("%v", err)
	}
	if got != want {
		ts.Fatalf("exit status %d, want %d", got, want)
	}
}

// TestInterrupt: tail -f stops on SIGINT with status 0.
func TestInterrupt(t *testing.T) {
	dir := t.TempDir()
	send := exec.Command(os.Args[0], "--store", dir, "send", "t", "--create", "one")
	send.Env = append(os.Environ(), mainEnv+"=1", "GORACE="+noExitSleep())
	if out, err := send.CombinedOutput(); err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	cmd := exec.Command(os.Args[0], "--store", dir, "tail", "-f", "t", "--no-times")
	cmd.Env = append(os.Environ(), mainEnv+"=1", "GORACE="+noExitSleep())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	var got []string
	for range 2 { // the message: its line and its body
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.TrimSpace(line))
	}
	if want := []string{"t[0]@0", "one"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("tail printed %q, want %q", got, want)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tail -f after SIGINT: %v (want exit status 0)", err)
	}
}
