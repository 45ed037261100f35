package ferry

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func msgs(bodies ...string) []*EnhancedMessage {
	ems := make([]*EnhancedMessage, len(bodies))
	for i, b := range bodies {
		ems[i] = &EnhancedMessage{Message: Message{Topic: "t", Body: []byte(b)}}
	}
	return ems
}

func nextOffset(q *MemoryQueue) int64 {
	_, next := q.Offsets()
	return next
}

// TestWriteAtomicWaitsWithNothingWritten: when one queue of an atomic
// write has no room, the write waits with nothing written to any queue
// (and gives up with nothing written when its context ends); once there
// is room it writes everything.
func TestWriteAtomicWaitsWithNothingWritten(t *testing.T) {
	ctx := context.Background()
	a := NewMemoryQueue(QueueID{Topic: "a"}, Retention{})
	full := NewMemoryQueue(QueueID{Topic: "full"}, Retention{MaxMessages: 1, Overflow: Block})
	_, err := full.Write(ctx, msgs("old"))
	require.NoError(t, err)

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	err = writeAtomic(short, []*MemoryQueue{a, full}, []memPart{{msgs: msgs("r1")}, {msgs: msgs("o1")}}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, nextOffset(a), "written to a while waiting for room in full")
	assert.Equal(t, int64(1), nextOffset(full))

	parts := []memPart{{msgs: msgs("r2")}, {msgs: msgs("o2")}}
	done := make(chan error)
	go func() { done <- writeAtomic(ctx, []*MemoryQueue{a, full}, parts, nil) }()
	select {
	case err := <-done:
		t.Fatalf("wrote to a full queue: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	assert.Zero(t, nextOffset(a), "written to a while waiting for room in full")
	full.Release(1)
	require.NoError(t, <-done)
	assert.Equal(t, int64(0), parts[0].first)
	assert.Equal(t, int64(1), parts[1].first)
	assert.Equal(t, int64(1), nextOffset(a))
	assert.Equal(t, int64(2), nextOffset(full))
}

// TestWriteAtomicCheck: a check that fails writes nothing, and the keys
// the write had added to a window leave it (the same key is stored
// later); a check that passes sees nothing written yet. A duplicate is
// not stored and gets where its first copy went.
func TestWriteAtomicCheck(t *testing.T) {
	ctx := context.Background()
	a := NewMemoryQueue(QueueID{Topic: "a"}, Retention{})
	b := NewMemoryQueue(QueueID{Topic: "b"}, Retention{})
	keyed := func(key, body string) []*EnhancedMessage {
		ems := msgs(body)
		ems[0].DedupKey = key
		return ems
	}
	refused := errors.New("refused")
	err := writeAtomic(ctx, []*MemoryQueue{a, b}, []memPart{{msgs: msgs("r")}, {msgs: keyed("k", "o")}}, func() error { return refused })
	require.ErrorIs(t, err, refused)
	assert.Zero(t, nextOffset(a))
	assert.Zero(t, nextOffset(b))

	var seen [2]int64
	parts := []memPart{{msgs: msgs("r")}, {msgs: keyed("k", "o")}}
	require.NoError(t, writeAtomic(ctx, []*MemoryQueue{a, b}, parts, func() error {
		seen = [2]int64{a.base + int64(len(a.msgs)-a.head), b.base + int64(len(b.msgs)-b.head)}
		return nil
	}))
	assert.Equal(t, [2]int64{0, 0}, seen, "written before the check")
	assert.Equal(t, int64(1), nextOffset(b), "the key refused with the first write was stored")

	dup := keyed("k", "again")
	parts = []memPart{{msgs: msgs("r")}, {msgs: dup}}
	require.NoError(t, writeAtomic(ctx, []*MemoryQueue{a, b}, parts, nil))
	assert.Equal(t, int64(1), nextOffset(b), "a duplicate was stored")
	assert.Equal(t, int64(0), dup[0].Offset, "a duplicate gets its first copy's offset")
	assert.Equal(t, int64(2), nextOffset(a))
}

// TestWriteAtomicClosed: a closed first queue fails the write (nothing
// written); another closed queue is skipped.
func TestWriteAtomicClosed(t *testing.T) {
	ctx := context.Background()
	a := NewMemoryQueue(QueueID{Topic: "a"}, Retention{})
	b := NewMemoryQueue(QueueID{Topic: "b"}, Retention{})
	require.NoError(t, b.Close())
	parts := []memPart{{msgs: msgs("r")}, {msgs: msgs("o")}}
	require.NoError(t, writeAtomic(ctx, []*MemoryQueue{a, b}, parts, nil))
	assert.False(t, parts[0].closed)
	assert.True(t, parts[1].closed)
	assert.Equal(t, int64(1), nextOffset(a))

	c := NewMemoryQueue(QueueID{Topic: "c"}, Retention{})
	require.ErrorIs(t, writeAtomic(ctx, []*MemoryQueue{b, c}, []memPart{{msgs: msgs("r")}, {msgs: msgs("o")}}, nil), ErrClosed)
	assert.Zero(t, nextOffset(c))

	err := writeAtomic(ctx, []*MemoryQueue{a}, []memPart{{msgs: []*EnhancedMessage{nil}}}, nil)
	require.ErrorIs(t, err, ErrInvalidMessage)
	assert.Equal(t, int64(1), nextOffset(a))
}

// TestWriteAtomicLockOrder: atomic writes over the same queues listed in
// opposite orders do not deadlock (the queues are locked in the order
// they were made).
func TestWriteAtomicLockOrder(t *testing.T) {
	ctx := context.Background()
	x := NewMemoryQueue(QueueID{Topic: "x"}, Retention{})
	y := NewMemoryQueue(QueueID{Topic: "y"}, Retention{})
	const n = 20000
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, qs := range [][]*MemoryQueue{{x, y}, {y, x}} {
		wg.Go(func() {
			<-start
			for range n {
				if err := writeAtomic(ctx, qs, []memPart{{msgs: msgs("1")}, {msgs: msgs("2")}}, nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("deadlock")
	}
	assert.Equal(t, int64(2*n), nextOffset(x))
	assert.Equal(t, int64(2*n), nextOffset(y))
}
