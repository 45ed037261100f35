package ferryotel_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// watchdog bounds every wait of a test on an event: a hang fails.
const watchdog = 10 * time.Second

// wait receives from ch, or fails the test after the watchdog.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(watchdog):
		t.Fatalf("watchdog: no %s", what)
		panic("unreachable")
	}
}
