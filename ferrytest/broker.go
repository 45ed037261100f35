package ferrytest

import (
	"slices"
	"testing"

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
