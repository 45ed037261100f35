package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun checks the story the program tells: the failed write is
// retried, and every order is published exactly once.
func TestRun(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(t.Context(), &out))
	require.Equal(t, `placed A-1 for alice
placed B-1 for bob
placed A-2 for alice
write attempts:
  orders[1] A-1: ok
  orders[0] B-1: failed: ferry: ferrytest: write orders[0] (storage call 2): disk full
  orders[0] B-1: ok
  orders[1] A-2: ok
published:
  orders[0] offset 0: placed B-1 (key bob)
  orders[1] offset 0: placed A-1 (key alice)
  orders[1] offset 1: placed A-2 (key alice)
`, out.String())
}
