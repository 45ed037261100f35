package ferrytest

import (
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// NewBroker returns a broker made with opts for the test t, closed when
// the test ends (a Close error fails the test). A failure to make it
// fails the test at once.
func NewBroker(t testing.TB, opts ...ferry.BrokerOption) *ferry.Broker {
	t.Helper()
	b, err := ferry.NewBroker(opts...)
	if err != nil {
		t.Fatalf("ferrytest: new broker: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("ferrytest: close broker: %v", err)
		}
	})
	return b
}

// NewFakeBroker returns a broker over a new [FakeStorage], both closed when
// the test ends, and the storage, to inject faults into and inspect the
// queues of the topics the test creates. opts may set anything but the
// storage.
func NewFakeBroker(t testing.TB, opts ...ferry.BrokerOption) (*ferry.Broker, *FakeStorage) {
	t.Helper()
	fs := NewFakeStorage()
	t.Cleanup(func() { _ = fs.Close() }) // after the broker's: cleanups run last first
	b := NewBroker(t, append(slices.Clip(opts), ferry.WithStorage(fs))...)
	return b, fs
}

// WaitFor waits until cond holds, checking it every millisecond and
// whenever wake delivers (nil: no such signal), and fails t with what if
// it has not held after timeout (0: [DefaultTimeout]). It is for
// tests that wait for a consumer to get somewhere, instead of a sleep.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool, wake <-chan struct{}) {
	t.Helper()
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-wake:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("ferrytest: %s: not after %v", what, timeout)
			return
		}
	}
}
