package ferry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newBroker returns a broker with topic "orders" of queues queues, closed
// at the end of the test.
func newBroker(t testing.TB, queues int, opts ...ferry.BrokerOption) *ferry.Broker {
	t.Helper()
	b, err := ferry.NewBroker(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "orders", Queues: queues}))
	return b
}

func newProducer(t testing.TB, b *ferry.Broker, opts ...ferry.ProducerOption) *ferry.Producer {
	t.Helper()
	p, err := b.NewProducer(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// stored returns the number of messages stored in every queue of topic.
func stored(t testing.TB, b *ferry.Broker, topic string) int64 {
	t.Helper()
	meta, ok := b.Topic(topic)
	require.True(t, ok)
	var n int64
	for i := range meta.Queues {
		q, err := b.Queue(topic, i)
		require.NoError(t, err)
		oldest, next := q.Offsets()
		n += next - oldest
	}
	return n
}

func TestSendStampsRoutesAndStores(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 4)
	p := newProducer(t, b, ferry.WithProducerName("p1"))
	msg := &ferry.Message{Topic: "orders", Key: "customer-42", Tag: "created", Headers: map[string]string{"h": "v"}, Body: []byte("one")}
	res, err := p.Send(ctx, msg)
	require.NoError(t, err)
	want := int(uint32(ferry.Murmur2("customer-42"))&0x7fffffff) % 4
	assert.Equal(t, ferry.QueueID{Topic: "orders", Queue: want}, res.Queue)
	assert.Equal(t, int64(0), res.Offset)
	assert.False(t, res.ID.IsZero())

	res2, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: "customer-42"})
	require.NoError(t, err)
	assert.Equal(t, res.Queue, res2.Queue, "equal keys share a queue")
	assert.Equal(t, int64(1), res2.Offset)

	q, err := b.Queue("orders", want)
	require.NoError(t, err)
	dst := make([]*ferry.EnhancedMessage, 4)
	n, err := q.Read(ctx, 0, dst)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	em := dst[0]
	assert.Equal(t, res.ID, em.ID)
	assert.Equal(t, "p1", em.ProducerName())
	assert.Equal(t, ferry.Hostname(), em.BornHost())
	assert.False(t, em.BornTime().IsZero())
	assert.False(t, em.StoreTime().Before(em.BornTime()))
	assert.Equal(t, want, em.Queue)
	assert.Equal(t, "created", em.Tag)
	assert.Equal(t, "one", string(em.Body))
	assert.Equal(t, "v", em.Headers["h"])
	assert.Less(t, em.ID.String(), dst[1].ID.String(), "later ids sort later")
	assert.Same(t, em.Origin, dst[1].Origin, "one producer, one Origin")
}

func TestSendRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	boom := errors.New("boom")
	cases := []struct {
		name   string
		ctx    context.Context
		opts   []ferry.ProducerOption
		msg    *ferry.Message
		err    error
		inText string
	}{
		{name: "nil message", msg: nil, err: ferry.ErrInvalidMessage},
		{name: "empty topic", msg: &ferry.Message{}, err: ferry.ErrInvalidTopic},
		{name: "dot dot", msg: &ferry.Message{Topic: ".."}, err: ferry.ErrInvalidTopic},
		{name: "slash", msg: &ferry.Message{Topic: "a/b"}, err: ferry.ErrInvalidTopic},
		{name: "NUL", msg: &ferry.Message{Topic: "a\x00"}, err: ferry.ErrInvalidTopic},
		{name: "too long name", msg: &ferry.Message{Topic: strings.Repeat("t", 250)}, err: ferry.ErrInvalidTopic},
		{name: "unknown topic", msg: &ferry.Message{Topic: "nope"}, err: ferry.ErrTopicNotFound},
		{name: "oversize body", opts: []ferry.ProducerOption{ferry.WithMaxMessageBytes(10)}, msg: &ferry.Message{Topic: "orders", Body: make([]byte, 11)}, err: ferry.ErrMessageTooLarge},
		{name: "oversize default", msg: &ferry.Message{Topic: "orders", Body: make([]byte, ferry.DefaultMaxMessageBytes+1)}, err: ferry.ErrMessageTooLarge},
		{name: "router out of range", opts: []ferry.ProducerOption{ferry.WithRouter(ferry.ManualRouter(4))}, msg: &ferry.Message{Topic: "orders"}, err: ferry.ErrInvalidRoute, inText: "ferry.RouterFunc picked queue 4 of 4"},
		{name: "router negative", opts: []ferry.ProducerOption{ferry.WithRouter(ferry.ManualRouter(-1))}, msg: &ferry.Message{Topic: "orders"}, err: ferry.ErrInvalidRoute},
		{name: "router error", opts: []ferry.ProducerOption{ferry.WithRouter(brokenRouter{boom})}, msg: &ferry.Message{Topic: "orders"}, err: boom, inText: "router ferry_test.brokenRouter failed"},
		{name: "cancelled context", ctx: cancelled, msg: &ferry.Message{Topic: "orders"}, err: context.Canceled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBroker(t, 4)
			p := newProducer(t, b, c.opts...)
			cctx := c.ctx
			if cctx == nil {
				cctx = ctx
			}
			_, err := p.Send(cctx, c.msg)
			require.ErrorIs(t, err, c.err)
			assert.True(t, strings.HasPrefix(err.Error(), "ferry: send"), err.Error())
			if c.inText != "" {
				assert.Contains(t, err.Error(), c.inText)
			}
			if errors.Is(err, boom) {
				assert.ErrorIs(t, err, ferry.ErrInvalidRoute)
			}
			_, err = p.SendBatch(cctx, []*ferry.Message{{Topic: "orders"}, c.msg})
			require.ErrorIs(t, err, c.err, "a bad message fails the whole batch")
			assert.Equal(t, int64(0), stored(t, b, "orders"), "nothing written")
		})
	}
}

type brokenRouter struct{ err error }

func (r brokenRouter) Select(*ferry.EnhancedMessage, ferry.TopicMeta) (int, error) { return 0, r.err }

func TestProducerAndBrokerAfterClose(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 2)
	p := newProducer(t, b)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")
	_, err := p.Send(ctx, &ferry.Message{Topic: "orders"})
	assert.ErrorIs(t, err, ferry.ErrClosed)
	_, err = p.SendBatch(ctx, []*ferry.Message{{Topic: "orders"}})
	assert.ErrorIs(t, err, ferry.ErrClosed)
	_, err = p.SendBatch(ctx, nil)
	assert.ErrorIs(t, err, ferry.ErrClosed)
	_, err = p.TrySend(&ferry.Message{Topic: "orders"})
	assert.ErrorIs(t, err, ferry.ErrClosed)

	p2 := newProducer(t, b)
	require.NoError(t, b.Close())
	_, err = p2.Send(ctx, &ferry.Message{Topic: "orders"})
	assert.ErrorIs(t, err, ferry.ErrClosed, "send after the broker closed")
	_, err = b.NewProducer()
	assert.ErrorIs(t, err, ferry.ErrClosed)
	assert.ErrorIs(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "x", Queues: 1}), ferry.ErrClosed)
	_, err = b.Queue("orders", 0)
	assert.ErrorIs(t, err, ferry.ErrClosed)
}

func TestNewProducerRejectsBadOptions(t *testing.T) {
	b := newBroker(t, 1)
	_, err := b.NewProducer(ferry.WithMaxMessageBytes(0))
	assert.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewProducer(nil) // a nil option is ignored
	assert.NoError(t, err)
	p := newProducer(t, b)
	assert.NotEmpty(t, p.Name())
}

// countingStorage counts the Write calls of the queues it opens.
type countingStorage struct {
	*ferry.MemoryStorage
	mu     sync.Mutex
	writes map[ferry.QueueID]int
	failOn ferry.QueueID
}

type countingQueue struct {
	ferry.Queue
	s *countingStorage
}

func (s *countingStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, i)
	if err != nil {
		return nil, err
	}
	return &countingQueue{Queue: q, s: s}, nil
}

func (q *countingQueue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	q.s.mu.Lock()
	q.s.writes[q.ID()]++
	fail := q.ID() == q.s.failOn
	q.s.mu.Unlock()
	if fail {
		return 0, errors.New("disk on fire")
	}
	return q.Queue.Write(ctx, msgs)
}

func TestSendBatchWritesOncePerQueueInOrder(t *testing.T) {
	ctx := context.Background()
	st := &countingStorage{MemoryStorage: ferry.NewMemoryStorage(), writes: map[ferry.QueueID]int{}, failOn: ferry.QueueID{Topic: "none"}}
	defer st.Close()
	b := newBroker(t, 4, ferry.WithStorage(st))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "audit", Queues: 2}))
	p := newProducer(t, b)

	var msgs []*ferry.Message
	for i := range 100 {
		topic := "orders"
		if i%5 == 0 {
			topic = "audit"
		}
		msgs = append(msgs, &ferry.Message{Topic: topic, Key: fmt.Sprint("key-", i%23), Body: fmt.Append(nil, i)})
	}
	results, err := p.SendBatch(ctx, msgs)
	require.NoError(t, err)
	require.Len(t, results, 100)
	for id, n := range st.writes {
		assert.Equal(t, 1, n, "one Write for %s", id)
	}
	assert.Len(t, st.writes, 6, "4 orders queues and 2 audit queues")

	// Results line up with the input, and each queue holds its share in
	// input order.
	last := map[ferry.QueueID]int64{}
	for i, r := range results {
		assert.Equal(t, msgs[i].Topic, r.Queue.Topic)
		if prev, ok := last[r.Queue]; ok {
			assert.Equal(t, prev+1, r.Offset)
		}
		last[r.Queue] = r.Offset
		q, err := b.Queue(r.Queue.Topic, r.Queue.Queue)
		require.NoError(t, err)
		dst := make([]*ferry.EnhancedMessage, 1)
		_, err = q.Read(ctx, r.Offset, dst)
		require.NoError(t, err)
		assert.Equal(t, r.ID, dst[0].ID)
		assert.Equal(t, string(msgs[i].Body), string(dst[0].Body))
		if msgs[i].Key != "" && r.Queue.Topic == "orders" {
			assert.Equal(t, int(uint32(ferry.Murmur2(msgs[i].Key))&0x7fffffff)%4, r.Queue.Queue)
		}
	}
	empty, err := p.SendBatch(ctx, nil)
	assert.NoError(t, err)
	assert.Empty(t, empty)
}

func TestSendBatchReportsPartialFailure(t *testing.T) {
	ctx := context.Background()
	st := &countingStorage{MemoryStorage: ferry.NewMemoryStorage(), writes: map[ferry.QueueID]int{}, failOn: ferry.QueueID{Topic: "orders", Queue: 1}}
	defer st.Close()
	b := newBroker(t, 2, ferry.WithStorage(st))
	p := newProducer(t, b, ferry.WithRouter(ferry.RoundRobinRouter()))
	results, err := p.SendBatch(ctx, []*ferry.Message{{Topic: "orders"}, {Topic: "orders"}, {Topic: "orders"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "orders[1]")
	require.Len(t, results, 3)
	assert.Equal(t, int64(0), results[0].Offset)
	assert.Equal(t, int64(-1), results[1].Offset, "queue 1 failed")
	assert.Equal(t, int64(1), results[2].Offset)
}

func TestConcurrentSendsKeepPerQueueOffsetsContiguous(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 3)
	p := newProducer(t, b)
	var wg sync.WaitGroup
	var sent atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				_, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: fmt.Sprint(g, "-", i)})
				if assert.NoError(t, err) {
					sent.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, sent.Load(), stored(t, b, "orders"))
	for i := range 3 {
		q, _ := b.Queue("orders", i)
		_, next := q.Offsets()
		dst := make([]*ferry.EnhancedMessage, next)
		n, err := q.Read(ctx, 0, dst)
		require.NoError(t, err)
		for j := range dst[:n] {
			require.Equal(t, int64(j), dst[j].Offset)
		}
	}
}

func TestBackPressureBlocksAndTrySendRefuses(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "bp", Queues: 1, Retention: ferry.Retention{MaxMessages: 2, Overflow: ferry.Block}}))
	p := newProducer(t, b)
	for range 2 {
		_, err := p.TrySend(&ferry.Message{Topic: "bp"})
		require.NoError(t, err)
	}
	_, err := p.TrySend(&ferry.Message{Topic: "bp"})
	require.ErrorIs(t, err, ferry.ErrQueueFull)

	short, cancel := context.WithCancel(ctx)
	cancel()
	_, err = p.Send(short, &ferry.Message{Topic: "bp"})
	require.ErrorIs(t, err, context.Canceled)

	done := make(chan error, 1)
	go func() {
		_, err := p.Send(ctx, &ferry.Message{Topic: "bp", Body: []byte("third")})
		done <- err
	}()
	q, err := b.Queue("bp", 0)
	require.NoError(t, err)
	q.(ferry.Releaser).Release(1) // consumers are done with offset 0
	require.NoError(t, <-done)
	oldest, next := q.Offsets()
	assert.Equal(t, int64(1), oldest, "the released message made room")
	assert.Equal(t, int64(3), next)
}

// A queue other than a MemoryQueue takes the TryWriter path: TrySend
// refuses on a full Block queue where Send waits for room.
func TestTrySendUsesTryWriterOfOtherQueues(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t, 1, ferry.WithStorage(ferrytest.NewFakeStorage()))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "bp", Queues: 1, Retention: ferry.Retention{MaxMessages: 1, Overflow: ferry.Block}}))
	p := newProducer(t, b)
	res, err := p.TrySend(&ferry.Message{Topic: "bp", Body: []byte("first")})
	require.NoError(t, err)
	assert.Equal(t, ferry.QueueID{Topic: "bp"}, res.Queue)
	assert.Equal(t, int64(0), res.Offset)
	_, err = p.TrySend(&ferry.Message{Topic: "bp"})
	require.ErrorIs(t, err, ferry.ErrQueueFull)

	short, cancel := context.WithCancel(ctx)
	cancel()
	_, err = p.Send(short, &ferry.Message{Topic: "bp"})
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, int64(1), stored(t, b, "bp"))
}

// A batch whose messages all go to one queue is one Write in input order,
// with consecutive offsets and IDs that grow with the input; if that
// Write fails every result has Offset -1.
func TestSendBatchToOneQueue(t *testing.T) {
	ctx := context.Background()
	st := &countingStorage{MemoryStorage: ferry.NewMemoryStorage(), writes: map[ferry.QueueID]int{}, failOn: ferry.QueueID{Topic: "orders", Queue: 1}}
	defer st.Close()
	b := newBroker(t, 2, ferry.WithStorage(st))
	p := newProducer(t, b, ferry.WithRouter(ferry.ManualRouter(0)))
	msgs := make([]*ferry.Message, 50)
	for i := range msgs {
		msgs[i] = &ferry.Message{Topic: "orders", Body: fmt.Append(nil, i)}
	}
	results, err := p.SendBatch(ctx, msgs)
	require.NoError(t, err)
	require.Len(t, results, 50)
	assert.Equal(t, 1, st.writes[ferry.QueueID{Topic: "orders", Queue: 0}])
	q, err := b.Queue("orders", 0)
	require.NoError(t, err)
	dst := make([]*ferry.EnhancedMessage, 50)
	n, err := q.Read(ctx, 0, dst)
	require.NoError(t, err)
	require.Equal(t, 50, n)
	for i, r := range results {
		assert.Equal(t, ferry.QueueID{Topic: "orders", Queue: 0}, r.Queue)
		assert.Equal(t, int64(i), r.Offset)
		assert.Equal(t, r.ID, dst[i].ID)
		assert.Equal(t, string(msgs[i].Body), string(dst[i].Body))
		if i > 0 {
			assert.Positive(t, bytes.Compare(r.ID[:], results[i-1].ID[:]), "IDs grow with the input")
		}
	}

	p1 := newProducer(t, b, ferry.WithRouter(ferry.ManualRouter(1)))
	results, err = p1.SendBatch(ctx, msgs[:3])
	require.Error(t, err)
	assert.Contains(t, err.Error(), "orders[1]")
	require.Len(t, results, 3)
	for _, r := range results {
		assert.Equal(t, int64(-1), r.Offset)
	}
}

// Concurrent Sends of one producer share its envelope slabs: each
// message still gets an envelope of its own, holding what was sent.
func TestConcurrentSendsGetOwnEnvelopes(t *testing.T) {
	ctx := context.Background()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	const senders, each = 8, 500
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				_, err := p.Send(ctx, &ferry.Message{Topic: "t", Key: strconv.Itoa(s), Body: []byte(strconv.Itoa(s*each + i))})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	q, err := b.Queue("t", 0)
	require.NoError(t, err)
	got := make([]*ferry.EnhancedMessage, senders*each)
	for n := 0; n < len(got); {
		k, err := q.Read(ctx, int64(n), got[n:])
		require.NoError(t, err)
		n += k
	}
	seen := map[*ferry.EnhancedMessage]bool{}
	bodies := map[string]bool{}
	for i, m := range got {
		require.False(t, seen[m], "envelope of message %d shared", i)
		seen[m] = true
		require.Equal(t, int64(i), m.Offset)
		v, err := strconv.Atoi(string(m.Body))
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(v/each), m.Key, "key and body of one Send")
		bodies[string(m.Body)] = true
	}
	require.Len(t, bodies, senders*each)
}
