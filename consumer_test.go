package ferry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newTopic returns a broker holding topic "t" with n queues.
func newTopic(t *testing.T, n int, opts ...ferry.BrokerOption) *ferry.Broker {
	t.Helper()
	b, err := ferry.NewBroker(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "t", Queues: n}))
	return b
}

// The helpers below are those of the consumer suite of package
// ferrytest (TestConsumers, run in consumers_suite_test.go), shared by
// the tests that stay here.

// produce sends n messages with bodies "<prefix><i>", keyed by i % keys,
// in batches.
func produce(t *testing.T, b *ferry.Broker, topic, prefix string, n, keys int) {
	t.Helper()
	ferrytest.Produce(t, b, topic, prefix, n, keys)
}

// tally counts handled messages by body: a [ferrytest.Tally].
type tally struct{ *ferrytest.Tally }

func newTally(want int) *tally          { return &tally{ferrytest.NewTally(want)} }
func (c *tally) add(body string)        { c.Add(body) }
func (c *tally) handler() ferry.Handler { return c.Handler() }
func (c *tally) duplicates() int        { return c.Duplicates() }
func (c *tally) distinct() int          { return c.Distinct() }
func (c *tally) waitAll(t *testing.T)   { t.Helper(); c.WaitAll(t, time.Minute) }

func startConsumer(t *testing.T, b *ferry.Broker, group string, h ferry.Handler, opts ...ferry.ConsumerOption) *ferry.Consumer {
	t.Helper()
	return ferrytest.StartConsumer(t, b, group, h, opts...)
}

// union returns every member's assignment and fails on a queue held twice.
func union(t *testing.T, cs ...*ferry.Consumer) map[ferry.QueueID]string {
	t.Helper()
	return ferrytest.Owners(t, cs...)
}

func TestConsumerOptionsValidation(t *testing.T) {
	b := newTopic(t, 1)
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })
	bad := map[string][]ferry.ConsumerOption{
		"concurrency": {ferry.WithConcurrency(0)},
		"buffer":      {ferry.WithBuffer(0, 10)},
		"watermarks":  {ferry.WithWatermarks(0.5, 0.6)},
		"span":        {ferry.WithMaxSpan(0)},
		"retry":       {ferry.WithRetry(0, time.Second)},
		"backoff":     {ferry.WithRetry(2, -time.Second)},
		"max backoff": {ferry.WithMaxRetryBackoff(-time.Second)},
		"drain":       {ferry.WithDrainTimeout(-1)},
		"member @":    {ferry.WithMemberID("a@b")},
		"start":       {ferry.WithStartFrom(7)},
		"tags":        {ferry.WithTags("")},
		"allocator":   {ferry.WithAllocator(nil)},
		"dlq":         {ferry.WithDeadLetter("bad name")},
	}
	for name, opts := range bad {
		_, err := b.NewConsumer("g", "t", h, opts...)
		require.ErrorIs(t, err, ferry.ErrInvalidOption, name)
	}
	_, err := b.NewConsumer("", "t", h)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewConsumer("a@b", "t", h) // '@' is reserved for broadcast cursors
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewPullConsumer("a@b", "t")
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewConsumer("g", "t", nil)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewConsumer("g", "bad topic", h)
	require.ErrorIs(t, err, ferry.ErrInvalidTopic)

	c, err := b.NewConsumer("g", "missing", h)
	require.NoError(t, err)
	require.ErrorIs(t, c.Start(context.Background()), ferry.ErrTopicNotFound)
	require.NoError(t, c.Close())

	startConsumer(t, b, "g", h, ferry.WithMemberID("same"))
	dup, err := b.NewConsumer("g", "t", h, ferry.WithMemberID("same"))
	require.NoError(t, err)
	require.ErrorIs(t, dup.Start(context.Background()), ferry.ErrInvalidOption)
	require.NoError(t, dup.Close())
}

// everything gives every queue to every member: a broken split.
type everything struct{}

func (everything) Allocate(_, _ string, queues []ferry.QueueID, _ []string) []ferry.QueueID {
	return queues
}

func TestConsumerBrokenAllocatorIsReportedAndLocksHold(t *testing.T) {
	b := newTopic(t, 4)
	errs := make(chan error, 16)
	onErr := ferry.WithOnError(func(err error) {
		select {
		case errs <- err:
		default:
		}
	})
	n := 2000
	c := newTally(n)
	a := startConsumer(t, b, "g", c.handler(), ferry.WithAllocator(everything{}), ferry.WithMemberID("a"), onErr)
	bb, err := b.NewConsumer("g", "t", c.handler(), ferry.WithAllocator(everything{}), ferry.WithMemberID("b"), onErr)
	require.NoError(t, err)
	require.NoError(t, bb.Start(context.Background()), "a broken split does not block Start")
	t.Cleanup(func() { require.NoError(t, bb.Close()) })

	err = <-errs
	require.ErrorIs(t, err, ferry.ErrInvalidAllocation)
	assert.Contains(t, err.Error(), "ferry_test.everything")
	assert.Contains(t, err.Error(), "to 2 members")

	produce(t, b, "t", "x", n, 100)
	c.waitAll(t)
	require.NoError(t, a.Close())
	require.NoError(t, bb.Close())
	assert.Zero(t, c.duplicates(), "the queue locks keep one owner per queue")
	assert.Equal(t, n, c.distinct())
}

// ExampleBroker_NewConsumer shows a push consumer handling every message
// of a topic.
func ExampleBroker_NewConsumer() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 2})
	p, _ := b.NewProducer()
	for i := range 3 {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "orders", Key: "alice", Body: fmt.Appendf(nil, "order %d", i)})
	}

	got := make(chan string)
	c, err := b.NewConsumer("billing", "orders", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		got <- fmt.Sprintf("%s: %s (attempt %d)", d.Group, m.Body, d.Attempt)
		return nil
	}), ferry.Ordered())
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	defer c.Close()
	for range 3 {
		fmt.Println(<-got)
	}
	// Output:
	// billing: order 0 (attempt 1)
	// billing: order 1 (attempt 1)
	// billing: order 2 (attempt 1)
}

// emptyReadStorage hands out memory queues whose first Read breaks the
// contract: it returns no message and no error.
type emptyReadStorage struct{ *ferry.MemoryStorage }

func (s emptyReadStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, i)
	if err != nil {
		return nil, err
	}
	return &emptyReadQueue{Queue: q}, nil
}

type emptyReadQueue struct {
	ferry.Queue
	once sync.Once
}

func (q *emptyReadQueue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (n int, err error) {
	empty := false
	q.once.Do(func() { empty = true })
	if empty {
		return 0, nil
	}
	return q.Queue.Read(ctx, offset, dst)
}

func TestConsumerReportsQueueReadingNothing(t *testing.T) {
	st := emptyReadStorage{ferry.NewMemoryStorage()}
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	b := newTopic(t, 1, ferry.WithStorage(st))
	errs := make(chan error, 1)
	onErr := ferry.WithOnError(func(err error) {
		select {
		case errs <- err:
		default:
		}
	})
	n := 10
	c := newTally(n)
	startConsumer(t, b, "g", c.handler(), onErr)
	err := <-errs
	assert.Contains(t, err.Error(), "ferry: fetch t[0]: queue *ferry_test.emptyReadQueue read: invalid message: 0 messages into 16")
	produce(t, b, "t", "x", n, 1)
	c.waitAll(t) // the fetch loop went on after the bad read
	assert.Equal(t, n, c.distinct())
}
