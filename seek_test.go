package ferry_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// offsetLog records the offsets a handler sees, in order.
type offsetLog struct {
	mu   sync.Mutex
	seen []int64
}

func (l *offsetLog) add(off int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, off)
}

func (l *offsetLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

func (l *offsetLog) since(i int) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.seen[i:]...)
}

// Consumer.Seek replays from the earliest, skips to the latest or to an
// offset at runtime; the messages in flight finish first, and what comes
// after the seek starts at the new place, in order.
func TestConsumerSeek(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 100, 1)
	log := &offsetLog{}
	block := make(chan struct{})
	blocked := make(chan struct{})
	var once sync.Once
	c := startConsumer(t, b, "g", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		if m.Offset == 50 {
			once.Do(func() { close(blocked); <-block })
		}
		log.add(m.Offset)
		return nil
	}), ferry.WithConcurrency(1))
	waitFor(t, blocked, "offset 50 in the handler")

	sought := make(chan error, 1)
	go func() { sought <- c.Seek(ctx, ferry.ResetToOffsets(map[int]int64{0: 10})) }()
	select {
	case err := <-sought:
		t.Fatalf("Seek returned %v with a message in flight", err)
	case <-time.After(quiet):
	}
	mark := log.len()
	close(block)
	require.NoError(t, <-sought)
	require.Eventually(t, func() bool {
		return slices.Contains(log.since(mark), 99) && log.since(mark)[len(log.since(mark))-1] == 99 && slices.Contains(log.since(mark), 10)
	}, watchdog, time.Millisecond)
	after := log.since(mark)
	at := slices.Index(after, 10)
	for _, off := range after[:at] {
		assert.GreaterOrEqual(t, off, int64(50), "before the seek takes effect, only what was in flight: %v", after)
	}
	for i, off := range after[at:] {
		require.Equal(t, int64(10+i), off, "after the seek, from 10 on in order: %v", after)
	}

	mark = log.len()
	require.NoError(t, c.Seek(ctx, ferry.ResetToEarliest()))
	require.Eventually(t, func() bool { return log.len() >= mark+100 }, watchdog, time.Millisecond)
	assert.Equal(t, int64(0), log.since(mark)[0])

	require.NoError(t, c.Seek(ctx, ferry.ResetToLatest()))
	require.Eventually(t, func() bool { return c.Stats().Queues[0].Committed == 100 }, watchdog, time.Millisecond)

	require.ErrorIs(t, c.Seek(ctx, ferry.ResetToOffsets(map[int]int64{0: 101})), ferry.ErrOffsetOutOfRange)
	require.ErrorIs(t, c.Seek(ctx, ferry.ResetToOffsets(map[int]int64{3: 0})), ferry.ErrInvalidOption)
	require.ErrorIs(t, c.Seek(ctx, ferry.ResetTo{}), ferry.ErrInvalidOption)
}

// A pull consumer seeks too: the next Poll starts at the new place.
func TestPullConsumerSeek(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 20, 1)
	pc, err := b.NewPullConsumer("g", "t")
	require.NoError(t, err)
	defer pc.Close()
	msgs, err := pc.Poll(ctx, 5)
	require.NoError(t, err)
	require.NoError(t, pc.Commit(ctx, msgs...))
	require.NoError(t, pc.Seek(ctx, ferry.ResetToOffsets(map[int]int64{0: 15})))
	msgs, err = pc.Poll(ctx, 5)
	require.NoError(t, err)
	assert.Equal(t, int64(15), msgs[0].Offset)
}
