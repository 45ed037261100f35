package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for the command: run re-executes
// os.Args[0] as its members and producers.
func TestMain(m *testing.M) {
	if isChild() {
		if err := child(context.Background()); err != nil {
			os.Stderr.WriteString("cluster child: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRun runs the example as `go run ./examples/cluster` does (a 3-node
// cluster, 3 member and 2 producer processes) so that it cannot rot.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a NATS cluster and five processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	var out strings.Builder
	start := time.Now()
	err := run(ctx, &out, os.Args[0])
	t.Logf("in %v:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "nothing lost") {
		t.Fatal("no \"nothing lost\" line")
	}
}
