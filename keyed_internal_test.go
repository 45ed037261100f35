package ferry

import (
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeyedSlotsFollowKeysInFlight: a queue carrying 200,000 distinct
// keys keeps about the keys in flight, not every key it saw; a key that
// recurs finds its slot, and a busy key's messages wait in offset order.
func TestKeyedSlotsFollowKeysInFlight(t *testing.T) {
	k := newKeyed()
	const inFlight = 100
	var slots []*keySlot
	for i := range 200_000 {
		k.sort(&EnhancedMessage{Message: Message{Key: "k" + strconv.Itoa(i)}, Offset: int64(i)})
		km := k.ready.pop()
		slots = append(slots, km.slot)
		if len(slots) > inFlight {
			k.release(slots[0])
			slots = slots[1:]
		}
		require.LessOrEqual(t, len(k.slots), 2*k.busy+sweepMin, "at message %d", i)
	}
	assert.Equal(t, inFlight, k.busy)

	// A busy key: its later messages wait behind it, in order, and follow
	// one at a time as each finishes.
	for i := range 3 {
		k.sort(&EnhancedMessage{Message: Message{Key: "hot"}, Offset: int64(i)})
	}
	require.Equal(t, 1, k.ready.len(), "one message of the key ready, two waiting")
	for want := range int64(3) {
		km := k.ready.pop()
		assert.Equal(t, want, km.msg.Offset)
		assert.Equal(t, 0, k.ready.len(), "the next waits until this one finishes")
		k.release(km.slot)
	}
	assert.False(t, k.slots["hot"].busy, "free once its last message finished")
}

// BenchmarkKeyedMemory measures what OrderedByKey holds per key in
// flight (its slot and map entry, beyond the message itself) and per
// message waiting behind a busy key: the heap after sorting 100,000
// messages of distinct keys (each ready, its key busy), then 100,000 more
// of one busy key (each waiting), against the heap before.
func BenchmarkKeyedMemory(b *testing.B) {
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var perKey, perWaiting float64
	for b.Loop() {
		msgs := make([]EnhancedMessage, 2*n)
		for i := range n {
			msgs[i].Key = keys[i]
			msgs[n+i].Key = "hot"
		}
		k := newKeyed()
		before := heap()
		for i := range n {
			k.sort(&msgs[i])
		}
		mid := heap()
		for i := range n {
			k.sort(&msgs[n+i])
		}
		after := heap()
		perKey = float64(mid-before) / n
		perWaiting = float64(after-mid) / n
		runtime.KeepAlive(k)
		runtime.KeepAlive(msgs)
	}
	b.ReportMetric(perKey, "B/key-in-flight")
	b.ReportMetric(perWaiting, "B/waiting-msg")
}
