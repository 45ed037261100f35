package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun checks the story the program tells: the failed transfer is
// rolled back and retried, each transfer applied once, nothing applied
// again by the second run, and the money adds up.
func TestRun(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(t.Context(), &out, t.TempDir()))
	require.Equal(t, `offset 0: alice -> bob 30
offset 1: bob -> carol 20
offset 2: carol -> alice 5
offset 3: alice -> carol 40 failed after the debit: rolled back, retried
offset 3: alice -> carol 40
offset 4: bob -> alice 10
run 1 applied 5 transfers
run 2 applied 0 transfers
alice: 45
bob: 50
carol: 55
total: 150
`, out.String())
}
