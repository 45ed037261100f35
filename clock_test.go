package ferry

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStampTime(t *testing.T) {
	before := time.Now()
	a := stampTime()
	b := stampTime()
	after := time.Now()
	require.False(t, a.After(b), "stamps do not go backwards")
	assert.False(t, a.Before(before), "monotonic readings order stamps with time.Now")
	assert.False(t, b.After(after))
	assert.InDelta(t, float64(after.UnixNano()), float64(b.UnixNano()), float64(clockResync), "wall time within a resync of time.Now")

	// A stale base is replaced by a full reading.
	old := time.Now().Add(-2 * clockResync)
	clockBase.Store(&old)
	c := stampTime()
	assert.False(t, c.Before(after))
	assert.InDelta(t, float64(time.Now().UnixNano()), float64(c.UnixNano()), float64(clockResync))
	assert.NotSame(t, &old, clockBase.Load())
}

func BenchmarkStampTime(b *testing.B) {
	for b.Loop() {
		_ = stampTime()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		_ = time.Now()
	}
}
