package ferrytest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// TestConsumers must fail on a backend whose coordinator or cursor store
// breaks what the consumer relies on. As in
// TestSuitesCatchBrokenImplementations, each case runs the suite's
// subtests that catch the defect in a child process, over memory storage
// and cursors and a FakeCoordinator (with Expire), one of them broken;
// the control, unbroken, must pass.

const brokenBackendEnv = "FERRYTEST_BROKEN_BACKEND"

type brokenBackendCase struct {
	subtests string        // a -test.run pattern below the test
	timeout  time.Duration // ConsumerFeatures.Timeout; 0 for the default
	want     string        // in the child's output; "" for the control, which must pass
}

var brokenBackendCases = map[string]brokenBackendCase{
	"control":                {subtests: "(ExactlyOnceStableGroup|LeaseLoss)"},
	"lost-never-closes":      {subtests: "LeaseLoss", timeout: 3 * time.Second, want: "m-old's handler was not cancelled"},
	"tokens-never-grow":      {subtests: "LeaseLoss", want: "not larger than the old owner's"},
	"cursor-ignores-fencing": {subtests: "LeaseLoss", want: "a late commit of the old owner"},
	"spurious-fenced":        {subtests: "ExactlyOnceStableGroup", want: "ErrFenced must follow only a real loss of the lease"},
}

// brokenBackend returns the Backend of a case: memory storage and
// cursors and a FakeCoordinator, one of them broken as mode says.
func brokenBackend(mode string) ferrytest.Backend {
	var cursors ferry.CursorStore = ferry.NewMemoryCursorStore()
	var coord ferry.Coordinator
	var fake *ferrytest.FakeCoordinator
	switch mode {
	case "lost-never-closes":
		bc := newBrokenCoord("lost-never")
		coord, fake = bc, bc.fake
	case "tokens-never-grow":
		bc := newBrokenCoord("token-static")
		coord, fake = bc, bc.fake
	default:
		fake = ferrytest.NewFakeCoordinator()
		coord = fake
	}
	switch mode {
	case "cursor-ignores-fencing":
		cursors = unfencedCursorStore{ferry.NewMemoryCursorStore()}
	case "spurious-fenced":
		cursors = &spuriousFencedStore{MemoryCursorStore: ferry.NewMemoryCursorStore(), n: map[string]int{}}
	}
	return ferrytest.Backend{
		Storage: ferry.NewMemoryStorage(), Cursors: cursors, Coordinator: coord,
		Expire: func(g ferry.GroupKey, member string) { fake.Expire(g, member) },
	}
}

func TestConsumerSuiteCatchesBrokenBackends(t *testing.T) {
	if mode, ok := os.LookupEnv(brokenBackendEnv); ok {
		f := ferrytest.ConsumerFeatures{Timeout: brokenBackendCases[mode].timeout}
		ferrytest.TestConsumers(t, f, func(t *testing.T) ferrytest.Backend { return brokenBackend(mode) })
		return
	}
	for mode, c := range brokenBackendCases {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pattern := "^TestConsumerSuiteCatchesBrokenBackends$/^" + c.subtests + "$"
			cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), brokenBackendEnv+"="+mode)
			out, err := cmd.CombinedOutput()
			if c.want == "" {
				require.NoError(t, err, "the control must pass:\n%s", out)
				require.Contains(t, string(out), "--- PASS: TestConsumerSuiteCatchesBrokenBackends/LeaseLoss")
				return
			}
			require.Error(t, err, "the suite passed a backend broken by %s:\n%s", mode, out)
			require.Contains(t, string(out), c.want)
		})
	}
}

// spuriousFencedStore refuses every fourth fenced commit of each queue
// with ErrFenced, writing nothing, though no lease was lost.
type spuriousFencedStore struct {
	*ferry.MemoryCursorStore
	mu sync.Mutex
	n  map[string]int
}

func (s *spuriousFencedStore) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	s.mu.Lock()
	k := fmt.Sprintf("%s/%s/%d", topic, group, queue)
	s.n[k]++
	refuse := s.n[k]%4 == 0
	s.mu.Unlock()
	if refuse {
		return &ferry.Error{Op: "commit " + k, Err: ferry.ErrFenced}
	}
	return s.MemoryCursorStore.CommitFenced(ctx, topic, group, queue, offset, token)
}
