package ferry_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSendDedupKeyStoresOnce(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 4)
	p := newProducer(t, b)
	first, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: "c", DedupKey: "order-1", Body: []byte("a")})
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	again, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: "c", DedupKey: "order-1", Body: []byte("b")})
	require.NoError(t, err)
	assert.True(t, again.Duplicate)
	assert.Equal(t, first.ID, again.ID, "the first one's ID")
	assert.Equal(t, first.Queue, again.Queue)
	assert.Equal(t, first.Offset, again.Offset)
	other, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: "c", DedupKey: "order-2"})
	require.NoError(t, err)
	assert.False(t, other.Duplicate)
	assert.Equal(t, first.Offset+1, other.Offset)
	none, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: "c"})
	require.NoError(t, err)
	assert.False(t, none.Duplicate)
	assert.EqualValues(t, 3, stored(t, b, "orders"))

	q, err := b.Queue("orders", first.Queue.Queue)
	require.NoError(t, err)
	dst := make([]*ferry.EnhancedMessage, 4)
	n, err := q.Read(ctx, first.Offset, dst)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	assert.Equal(t, "a", string(dst[0].Body), "the first is kept, the duplicate dropped")
	assert.Equal(t, "order-1", dst[0].DedupKey)
}

// Keys are per queue: the same key in another queue (another topic here)
// is another message.
func TestDedupKeyPerQueue(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "other", Queues: 1}))
	p := newProducer(t, b)
	for _, topic := range []string{"orders", "other"} {
		r, err := p.Send(ctx, &ferry.Message{Topic: topic, DedupKey: "k"})
		require.NoError(t, err)
		assert.False(t, r.Duplicate, topic)
	}
}

func TestSendBatchDedupKeys(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 2)
	p := newProducer(t, b, ferry.WithRouter(ferry.ManualRouter(0)))
	r0, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "a"})
	require.NoError(t, err)
	msgs := []*ferry.Message{
		{Topic: "orders", DedupKey: "b", Body: []byte("b1")},
		{Topic: "orders", DedupKey: "a"}, // stored before the batch
		{Topic: "orders", Body: []byte("plain")},
		{Topic: "orders", DedupKey: "b", Body: []byte("b2")}, // earlier in the batch
		{Topic: "orders", DedupKey: "c"},
	}
	res, err := p.SendBatch(ctx, msgs)
	require.NoError(t, err)
	dups := []bool{false, true, false, true, false}
	for i, r := range res {
		assert.Equal(t, dups[i], r.Duplicate, "message %d", i)
	}
	assert.Equal(t, r0.ID, res[1].ID)
	assert.Equal(t, r0.Offset, res[1].Offset)
	assert.Equal(t, res[0].ID, res[3].ID)
	assert.Equal(t, res[0].Offset, res[3].Offset)
	assert.Equal(t, []int64{1, 2, 3}, []int64{res[0].Offset, res[2].Offset, res[4].Offset}, "the stored ones are contiguous")
	assert.EqualValues(t, 4, stored(t, b, "orders"))

	// A batch of duplicates only stores nothing.
	res, err = p.SendBatch(ctx, msgs[:2])
	require.NoError(t, err)
	assert.True(t, res[0].Duplicate)
	assert.True(t, res[1].Duplicate)
	assert.EqualValues(t, 4, stored(t, b, "orders"))

	// Across queues, each queue's share is deduplicated on its own.
	p2 := newProducer(t, b, ferry.WithRouter(ferry.RouterFunc(func(m *ferry.EnhancedMessage, _ ferry.TopicMeta) (int, error) {
		if m.Key == "q1" {
			return 1, nil
		}
		return 0, nil
	})))
	res, err = p2.SendBatch(ctx, []*ferry.Message{
		{Topic: "orders", Key: "q1", DedupKey: "a"},
		{Topic: "orders", DedupKey: "a"},
		{Topic: "orders", Key: "q1", DedupKey: "a"},
	})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true, true}, []bool{res[0].Duplicate, res[1].Duplicate, res[2].Duplicate})
	assert.Equal(t, 1, res[0].Queue.Queue)
	assert.Equal(t, res[0].Offset, res[2].Offset)
}

func TestSendAsyncDedupKeys(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1)
	p := newProducer(t, b)
	const n = 200
	var mu sync.Mutex
	results := make([]ferry.SendResult, n)
	for i := range n {
		err := p.SendAsync(ctx, &ferry.Message{Topic: "orders", DedupKey: fmt.Sprint(i % 50)}, func(r ferry.SendResult, err error) {
			assert.NoError(t, err)
			mu.Lock()
			results[i] = r
			mu.Unlock()
		})
		require.NoError(t, err)
	}
	require.NoError(t, p.Flush(ctx))
	dups := 0
	for i, r := range results {
		if r.Duplicate {
			dups++
			assert.Equal(t, results[i%50].Offset, r.Offset)
			assert.Equal(t, results[i%50].ID, r.ID)
		}
	}
	assert.Equal(t, n-50, dups)
	assert.EqualValues(t, 50, stored(t, b, "orders"))
}

// lossyStorage is a memory storage whose queues can lose the
// acknowledgement of a write they stored: Write stores, then reports
// its ctx's deadline as a network store whose reply timed out does.
type lossyStorage struct {
	*ferry.MemoryStorage
	lose atomic.Int32 // writes left to lose the acknowledgement of
}

func (s *lossyStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, i)
	if err != nil {
		return nil, err
	}
	return &lossyQueue{MemoryQueue: q.(*ferry.MemoryQueue), s: s}, nil
}

type lossyQueue struct {
	*ferry.MemoryQueue
	s *lossyStorage
}

func (q *lossyQueue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	first, err := q.MemoryQueue.Write(ctx, msgs)
	if err == nil && q.s.lose.Add(-1) >= 0 {
		return 0, fmt.Errorf("write %s: %w", q.ID(), context.DeadlineExceeded)
	}
	return first, err
}

// A Send whose write was stored but whose acknowledgement was lost (a
// timeout) is retried with the same key: the message is stored once,
// and the retry reports where.
func TestSendRetriedAfterTimeoutStoresOnce(t *testing.T) {
	ctx := context.Background()
	s := &lossyStorage{MemoryStorage: ferry.NewMemoryStorage()}
	b := newBroker(t, 1, ferry.WithStorage(s))
	p := newProducer(t, b)
	for round, key := range []string{"k1", "k2", "k3"} {
		s.lose.Store(2)
		m := &ferry.Message{Topic: "orders", DedupKey: key, Body: []byte(key)}
		var res ferry.SendResult
		var err error
		tries := 0
		for {
			tries++
			res, err = p.Send(ctx, m)
			if err == nil {
				break
			}
			require.ErrorIs(t, err, context.DeadlineExceeded)
		}
		assert.Equal(t, 3, tries)
		assert.True(t, res.Duplicate, "the retry found the first write")
		assert.EqualValues(t, round, res.Offset)
		assert.EqualValues(t, round+1, stored(t, b, "orders"), "stored once")
	}
	// The same, without a key: each try stores the message.
	s.lose.Store(1)
	_, err := p.Send(ctx, &ferry.Message{Topic: "orders"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = p.Send(ctx, &ferry.Message{Topic: "orders"})
	require.NoError(t, err)
	assert.EqualValues(t, 5, stored(t, b, "orders"), "a control: without a key a retry stores twice")
}

func TestDedupKeyRefused(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1)
	p := newProducer(t, b)
	_, err := p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: string(make([]byte, ferry.MaxDedupKeyLen+1))})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	// Keys starting with "%" are the library's, for its own moves.
	_, err = p.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "%move:%DELAY%0:0"})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	_, err = p.SendBatch(ctx, []*ferry.Message{{Topic: "orders"}, {Topic: "orders", DedupKey: "%at:orders:k", DeliverAt: time.Now().Add(time.Hour)}})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	assert.EqualValues(t, 0, stored(t, b, "orders"))

	// A queue that does not deduplicate refuses keys.
	s := &plainStorage{ferry.NewMemoryStorage()}
	b2 := newBroker(t, 1, ferry.WithStorage(s))
	p2 := newProducer(t, b2)
	_, err = p2.Send(ctx, &ferry.Message{Topic: "orders", DedupKey: "k"})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	_, err = p2.Send(ctx, &ferry.Message{Topic: "orders"})
	assert.NoError(t, err)

	err = b.CreateTopic(ctx, ferry.TopicMeta{Name: "bad", Queues: 1, DedupWindow: -time.Second})
	assert.ErrorIs(t, err, ferry.ErrInvalidOption)
	assert.ErrorIs(t, err, ferry.ErrInvalidTopic)
}

// plainStorage hands out queues that are not Deduplicators.
type plainStorage struct{ *ferry.MemoryStorage }

type plainQueue struct{ ferry.Queue }

func (s *plainStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, i)
	if err != nil {
		return nil, err
	}
	return plainQueue{q}, nil
}

func TestDedupOffStoresEveryMessage(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "off", Queues: 1, DedupWindow: ferry.DedupOff}))
	p := newProducer(t, b)
	for range 3 {
		r, err := p.Send(ctx, &ferry.Message{Topic: "off", DedupKey: "k"})
		require.NoError(t, err)
		assert.False(t, r.Duplicate)
	}
	assert.EqualValues(t, 3, stored(t, b, "off"))
}

func TestMemoryQueueDedupWindow(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{})
	defer q.Close()
	assert.Equal(t, ferry.DefaultDedupWindow, q.DedupWindow())
	assert.ErrorIs(t, q.SetDedupWindow(-5), ferry.ErrInvalidOption)
	assert.Equal(t, ferry.DefaultDedupWindow, q.DedupWindow())
	const window = 20 * time.Millisecond
	require.NoError(t, q.SetDedupWindow(window))
	a := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", DedupKey: "k"}, ID: ferry.NewMessageID(time.Now())}
	first, err := q.Write(ctx, []*ferry.EnhancedMessage{a})
	require.NoError(t, err)
	// Once the window has passed (by the store times), the key is new:
	// written again until stored, it is stored no sooner.
	var b *ferry.EnhancedMessage
	var second int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		b = &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", DedupKey: "k"}, ID: ferry.NewMessageID(time.Now())}
		second, err = q.Write(ctx, []*ferry.EnhancedMessage{b})
		require.NoError(t, err)
		if b.Offset == second {
			break
		}
		assert.Equal(t, a.ID, b.ID)
		require.True(t, time.Now().Before(deadline), "never stored again")
		time.Sleep(window / 4)
	}
	assert.Equal(t, first+1, second)
	assert.GreaterOrEqual(t, b.StoreUnixNano-a.StoreUnixNano, int64(window), "not before the window passed")

	require.NoError(t, q.SetDedupWindow(ferry.DedupOff))
	assert.Zero(t, q.DedupWindow())
	c := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", DedupKey: "k"}}
	third, err := q.Write(ctx, []*ferry.EnhancedMessage{c})
	require.NoError(t, err)
	assert.Equal(t, second+1, third)
}

// A duplicate needs no room: on a full Block queue a write of duplicates
// only succeeds at once.
func TestMemoryQueueDuplicateNeedsNoRoom(t *testing.T) {
	ctx := context.Background()
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{MaxMessages: 1, Overflow: ferry.Block})
	defer q.Close()
	a := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", DedupKey: "k"}, ID: ferry.NewMessageID(time.Now())}
	_, err := q.Write(ctx, []*ferry.EnhancedMessage{a})
	require.NoError(t, err)
	d := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", DedupKey: "k"}}
	first, err := q.TryWrite([]*ferry.EnhancedMessage{d})
	require.NoError(t, err)
	assert.EqualValues(t, 1, first)
	assert.Equal(t, a.ID, d.ID)
	assert.EqualValues(t, 0, d.Offset)
	_, err = q.TryWrite([]*ferry.EnhancedMessage{{Message: ferry.Message{Topic: "t", DedupKey: "new"}}})
	assert.ErrorIs(t, err, ferry.ErrQueueFull)
	// The refused write left no key behind.
	q.Release(1)
	n := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", DedupKey: "new"}}
	first, err = q.TryWrite([]*ferry.EnhancedMessage{n})
	require.NoError(t, err)
	assert.Equal(t, first, n.Offset, "stored: the key of the refused write was rolled back")
}
