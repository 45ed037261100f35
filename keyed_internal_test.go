package ferry

import (
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
