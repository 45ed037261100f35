package ferry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Abandoning a message twice, or finishing one that was abandoned, must
// not count it out of flight twice: a negative in-flight count would make
// WaitDrained wait forever.
func TestBufferAbandonIsIdempotent(t *testing.T) {
	b := newBuffer(BufferConfig{}.withDefaults())
	msgs := []*EnhancedMessage{{Offset: 0}, {Offset: 1}}
	n, err := b.Put(context.Background(), msgs)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	k, _ := b.Take(make([]*EnhancedMessage, 2))
	require.Equal(t, 2, k)

	b.abandon(msgs[0], msgs[0])
	b.abandon(msgs[0])
	st := b.Stats()
	assert.Equal(t, 1, st.InFlight)
	assert.Equal(t, 2, st.Messages, "abandoned messages stay unfinished")

	assert.Equal(t, int64(1), b.Done(msgs[0]), "an abandoned message can still be done")
	st = b.Stats()
	assert.Equal(t, 1, st.InFlight)
	assert.Equal(t, 1, st.Messages)

	b.Done(msgs[1])
	assert.Zero(t, b.Stats().InFlight)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, b.WaitDrained(ctx))
}
