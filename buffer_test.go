package ferry_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// msgsAt returns n messages at offsets from, from+1, ... each of body size.
func msgsAt(from int64, n, size int) []*ferry.EnhancedMessage {
	out := make([]*ferry.EnhancedMessage, n)
	for i := range out {
		out[i] = &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Body: make([]byte, size)}, Offset: from + int64(i)}
	}
	return out
}

func TestBufferConfigValidation(t *testing.T) {
	for _, cfg := range []ferry.BufferConfig{
		{MaxMessages: -1},
		{MaxBytes: -5},
		{HighWatermark: 1.5},
		{HighWatermark: 0.5, LowWatermark: 0.5},
		{LowWatermark: -0.1},
		{MaxSpan: -1},
	} {
		_, err := ferry.NewBuffer(cfg)
		require.ErrorIs(t, err, ferry.ErrInvalidOption, "%+v", cfg)
	}
	b, err := ferry.NewBuffer(ferry.BufferConfig{})
	require.NoError(t, err)
	assert.Equal(t, ferry.BufferConfig{
		MaxMessages: ferry.DefaultBufferMessages, MaxBytes: ferry.DefaultBufferBytes,
		HighWatermark: ferry.DefaultHighWatermark, LowWatermark: ferry.DefaultLowWatermark,
		MaxSpan: ferry.DefaultMaxSpan,
	}, b.Config())
}

func TestBufferCommittableIsSmallestUnfinished(t *testing.T) {
	b, err := ferry.NewBuffer(ferry.BufferConfig{})
	require.NoError(t, err)
	b.Reset(10)
	assert.Equal(t, int64(10), b.Committable(), "empty: the next fetched offset")
	in := msgsAt(10, 5, 1)
	n, err := b.Put(context.Background(), in)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	assert.Equal(t, int64(10), b.Committable())

	got := make([]*ferry.EnhancedMessage, 3)
	k, pending := b.Take(got)
	require.Equal(t, 3, k)
	assert.Equal(t, 2, pending)
	assert.Equal(t, in[:3], got)

	// Out of order: 11 and 12 done, 10 still in flight.
	assert.Equal(t, int64(10), b.Done(in[11-10], in[12-10]))
	assert.Equal(t, int64(10), b.Done(in[11-10]), "done twice is ignored")
	assert.Equal(t, int64(13), b.Done(in[0]))
	assert.Equal(t, int64(13), b.Done(in[3]), "a message not taken cannot be done")

	k, pending = b.Take(got)
	require.Equal(t, 2, k)
	assert.Equal(t, 0, pending)
	assert.Equal(t, int64(15), b.Done(got[:2]...))
	st := b.Stats()
	assert.Equal(t, 0, st.Messages)
	assert.Equal(t, int64(15), st.Committable)

	// Filtered messages advance the next offset and the committable one.
	b.Advance(20)
	b.Advance(18)
	assert.Equal(t, int64(20), b.Committable())
	_, err = b.Put(context.Background(), msgsAt(19, 1, 1))
	require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)

	// Gaps in offsets (after filtering) still finish in any order.
	gap := []*ferry.EnhancedMessage{msgsAt(20, 1, 1)[0], msgsAt(25, 1, 1)[0], msgsAt(30, 1, 1)[0]}
	n, err = b.Put(context.Background(), gap)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	k, _ = b.Take(got)
	require.Equal(t, 3, k)
	assert.Equal(t, int64(20), b.Done(gap[2]))
	assert.Equal(t, int64(25), b.Done(gap[0]))
	assert.Equal(t, int64(31), b.Done(gap[1]))
}

func TestBufferWatermarksPauseAndResume(t *testing.T) {
	b, err := ferry.NewBuffer(ferry.BufferConfig{MaxMessages: 10, HighWatermark: 0.8, LowWatermark: 0.3})
	require.NoError(t, err)
	in := msgsAt(0, 20, 1)
	n, err := b.Put(context.Background(), in)
	require.NoError(t, err)
	require.Equal(t, 8, n, "takes up to the high watermark")
	require.True(t, b.Stats().Paused)

	put := make(chan int)
	go func() {
		n, err := b.Put(context.Background(), in[8:])
		assert.NoError(t, err)
		put <- n
	}()

	got := make([]*ferry.EnhancedMessage, 8)
	k, _ := b.Take(got)
	require.Equal(t, 8, k)
	// Down to 4 unfinished: above the low watermark (3), still paused.
	b.Done(got[:4]...)
	select {
	case n := <-put:
		t.Fatalf("Put resumed above the low watermark and took %d", n)
	default:
	}
	assert.True(t, b.Stats().Paused)
	// Down to 3: resumes, and refills to the high watermark.
	b.Done(got[4])
	assert.Equal(t, 5, <-put)
	st := b.Stats()
	assert.Equal(t, 8, st.Messages)
	assert.Equal(t, 8, st.PeakMessages, "never above the high watermark")
}

func TestBufferBytesBound(t *testing.T) {
	b, err := ferry.NewBuffer(ferry.BufferConfig{MaxBytes: 100})
	require.NoError(t, err)
	n, err := b.Put(context.Background(), msgsAt(0, 5, 30))
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.True(t, b.Stats().Paused)
	assert.Equal(t, int64(90), b.Stats().Bytes)

	// A message larger than the buffer still goes into an empty buffer.
	big, err := ferry.NewBuffer(ferry.BufferConfig{MaxBytes: 10})
	require.NoError(t, err)
	n, err = big.Put(context.Background(), msgsAt(0, 2, 50))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

func TestBufferMaxSpan(t *testing.T) {
	b, err := ferry.NewBuffer(ferry.BufferConfig{MaxSpan: 4})
	require.NoError(t, err)
	in := msgsAt(0, 10, 1)
	n, err := b.Put(context.Background(), in)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	got := make([]*ferry.EnhancedMessage, 4)
	k, _ := b.Take(got)
	require.Equal(t, 4, k)
	// Finishing 1..3 leaves 0 pinning the span: still paused.
	b.Done(got[1:]...)
	assert.True(t, b.Stats().Paused, "a slow oldest message holds the span")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = b.Put(ctx, in[4:])
	require.ErrorIs(t, err, context.Canceled)
	b.Done(got[0])
	assert.False(t, b.Stats().Paused)
	n, err = b.Put(context.Background(), in[4:])
	require.NoError(t, err)
	assert.Equal(t, 4, n)
}

func TestBufferDrainLockClose(t *testing.T) {
	b, err := ferry.NewBuffer(ferry.BufferConfig{MaxMessages: 2})
	require.NoError(t, err)
	in := msgsAt(0, 3, 1)
	_, err = b.Put(context.Background(), in)
	require.NoError(t, err)
	got := make([]*ferry.EnhancedMessage, 2)
	b.Take(got)

	drained := make(chan error)
	go func() { drained <- b.WaitDrained(context.Background()) }()
	b.Done(got[0])
	select {
	case <-drained:
		t.Fatal("drained with a message in flight")
	default:
	}
	b.Done(got[1])
	require.NoError(t, <-drained)

	require.NoError(t, b.Lock(context.Background()))
	assert.False(t, b.TryLock())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, b.Lock(ctx), context.Canceled)
	b.Unlock()
	assert.True(t, b.TryLock())
	b.Unlock()
	b.Unlock() // no-op

	// Close wakes a paused Put.
	_, err = b.Put(context.Background(), msgsAt(2, 2, 1))
	require.NoError(t, err)
	waiting := make(chan error)
	go func() {
		_, err := b.Put(context.Background(), msgsAt(4, 1, 1))
		waiting <- err
	}()
	b.Close()
	require.ErrorIs(t, <-waiting, ferry.ErrClosed)
	b.Close()
	k, pending := b.Take(got)
	assert.Zero(t, k, "a closed buffer hands out nothing")
	assert.Zero(t, pending)
}

func TestBufferNilMessage(t *testing.T) {
	b, err := ferry.NewBuffer(ferry.BufferConfig{})
	require.NoError(t, err)
	msgs := msgsAt(0, 2, 1)
	n, err := b.Put(context.Background(), []*ferry.EnhancedMessage{msgs[0], nil, msgs[1]})
	require.ErrorIs(t, err, ferry.ErrInvalidMessage)
	assert.Equal(t, 1, n, "the message before the nil one stays taken")
	dst := make([]*ferry.EnhancedMessage, 2)
	got, _ := b.Take(dst)
	require.Equal(t, 1, got)
	assert.Equal(t, int64(0), b.Done(nil), "a nil message is ignored")
	assert.Equal(t, int64(1), b.Done(nil, msgs[0]))
}

// A Put that cannot take its first message waits, signalled, until it can:
// it never returns 0 with nothing paused (the fetch loop's spin).
func TestBufferPutWaitsForRoomForALargeMessage(t *testing.T) {
	const kib = 1 << 10
	b, err := ferry.NewBuffer(ferry.BufferConfig{MaxMessages: 1000, MaxBytes: 1 << 20})
	require.NoError(t, err)
	small, large := msgsAt(0, 1, 100*kib)[0], msgsAt(1, 1, 1000*kib)[0]
	n, err := b.Put(context.Background(), []*ferry.EnhancedMessage{small, large})
	require.NoError(t, err)
	require.Equal(t, 1, n, "the large message does not fit beside the small one")
	assert.True(t, b.Stats().Paused, "under the low watermark, yet Put would wait for the large message")

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = b.Put(cancelled, []*ferry.EnhancedMessage{large})
	require.ErrorIs(t, err, context.Canceled, "Put waits rather than return 0")

	got := make([]*ferry.EnhancedMessage, 1)
	k, _ := b.Take(got)
	require.Equal(t, 1, k)
	put := putAsync(b, large)
	requireStillWaiting(t, put)
	b.Done(small)
	res := <-put
	require.NoError(t, res.err)
	assert.Equal(t, 1, res.n)

	// A message larger than the whole buffer waits for an empty buffer,
	// then goes in alone.
	huge := msgsAt(2, 2, 2<<20)
	k, _ = b.Take(got)
	require.Equal(t, 1, k)
	put = putAsync(b, huge...)
	requireStillWaiting(t, put)
	b.Done(large)
	res = <-put
	require.NoError(t, res.err)
	assert.Equal(t, 1, res.n, "alone")
	assert.True(t, b.Stats().Paused)
}

// Integer rounding can put the low watermark's count on the high one's:
// Put must still wait, not return 0 with nothing paused.
func TestBufferPutWaitsWhenWatermarksRoundTogether(t *testing.T) {
	for name, cfg := range map[string]ferry.BufferConfig{
		"messages": {MaxMessages: 10, HighWatermark: 0.55, LowWatermark: 0.51},
		"bytes":    {MaxBytes: 10, HighWatermark: 0.55, LowWatermark: 0.51},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := ferry.NewBuffer(cfg)
			require.NoError(t, err)
			in := msgsAt(0, 10, 1)
			n, err := b.Put(context.Background(), in)
			require.NoError(t, err)
			require.Equal(t, 5, n)
			assert.True(t, b.Stats().Paused)
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			_, err = b.Put(cancelled, in[n:])
			require.ErrorIs(t, err, context.Canceled, "Put waits rather than return 0")

			got := make([]*ferry.EnhancedMessage, 10)
			k, _ := b.Take(got)
			require.Equal(t, 5, k)
			put := putAsync(b, in[n:]...)
			requireStillWaiting(t, put)
			b.Done(got[0]) // 4 left: under both watermarks
			res := <-put
			require.NoError(t, res.err)
			assert.Equal(t, 1, res.n, "refills to the high watermark")
		})
	}
}

type putResult struct {
	n   int
	err error
}

// putAsync runs b.Put of msgs in a goroutine and returns its result.
func putAsync(b *ferry.Buffer, msgs ...*ferry.EnhancedMessage) <-chan putResult {
	ch := make(chan putResult, 1)
	go func() {
		n, err := b.Put(context.Background(), msgs)
		ch <- putResult{n, err}
	}()
	return ch
}

// requireStillWaiting fails if put has returned. The bound only gives a
// wrong early return the chance to show: a correct Put never returns here.
func requireStillWaiting(t *testing.T, put <-chan putResult) {
	t.Helper()
	select {
	case res := <-put:
		t.Fatalf("Put returned %d, %v without room", res.n, res.err)
	case <-time.After(20 * time.Millisecond):
	}
}

func TestBufferPeaksCountAPutThatStopsAtABadMessage(t *testing.T) {
	b, err := ferry.NewBuffer(ferry.BufferConfig{})
	require.NoError(t, err)
	msgs := msgsAt(0, 2, 10)
	n, err := b.Put(context.Background(), []*ferry.EnhancedMessage{msgs[0], msgs[1], nil})
	require.ErrorIs(t, err, ferry.ErrInvalidMessage)
	require.Equal(t, 2, n)
	st := b.Stats()
	assert.Equal(t, 2, st.PeakMessages)
	assert.Equal(t, int64(20), st.PeakBytes)
}
