package ferrytest

import (
	"os"
	"os/exec"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/require"
)

// The ChurnModel subtest must fail when its own cursor wrapper drops
// fencing, as it once did: in a child process, ChurnModel runs over a
// memory backend (a FencedCursorStore) with newTrackedCursors replaced by
// a wrapper that hides CommitFenced, and must report unfenced commits.
// The control, the real wrapper, must pass.
const unfencedWrapperEnv = "FERRYTEST_CHURN_WRAPPER"

func TestChurnModelCatchesAWrapperDroppingFencing(t *testing.T) {
	if mode, ok := os.LookupEnv(unfencedWrapperEnv); ok {
		if mode == "drops-fencing" {
			tracked := newTrackedCursors
			newTrackedCursors = func(s ferry.CursorStore, tr *tracker) ferry.CursorStore {
				return struct{ ferry.CursorStore }{tracked(s, tr)} // CommitFenced hidden
			}
		}
		TestConsumers(t, ConsumerFeatures{Scale: 0.4}, func(t *testing.T) Backend {
			return Backend{Storage: ferry.NewMemoryStorage(), Cursors: ferry.NewMemoryCursorStore(), Coordinator: ferry.NewMemoryCoordinator()}
		})
		return
	}
	for _, mode := range []string{"control", "drops-fencing"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestChurnModelCatchesAWrapperDroppingFencing$/^ChurnModel$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), unfencedWrapperEnv+"="+mode, "FERRY_CHURN_ROUNDS=1")
			out, err := cmd.CombinedOutput()
			if mode == "control" {
				require.NoError(t, err, "the control must pass:\n%s", out)
				require.Contains(t, string(out), "--- PASS: TestChurnModelCatchesAWrapperDroppingFencing/ChurnModel")
				return
			}
			require.Error(t, err, "ChurnModel passed with a cursor wrapper that drops CommitFenced:\n%s", out)
			require.Contains(t, string(out), "[unfenced-commit]")
		})
	}
}
