package ferry_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
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

// produce sends n messages with bodies "<prefix><i>", keyed by i % keys,
// in batches.
func produce(t *testing.T, b *ferry.Broker, topic, prefix string, n, keys int) {
	t.Helper()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	const batch = 500
	for lo := 0; lo < n; lo += batch {
		msgs := make([]*ferry.Message, 0, batch)
		for i := lo; i < min(n, lo+batch); i++ {
			msgs = append(msgs, &ferry.Message{Topic: topic, Key: "k" + strconv.Itoa(i%keys), Body: []byte(prefix + strconv.Itoa(i))})
		}
		_, err := p.SendBatch(context.Background(), msgs)
		require.NoError(t, err)
	}
}

// tally counts handled messages by body and signals when a number of
// distinct bodies has been seen.
type tally struct {
	mu     sync.Mutex
	seen   map[string]int
	want   int
	all    chan struct{}
	closed bool
}

func newTally(want int) *tally {
	return &tally{seen: map[string]int{}, want: want, all: make(chan struct{})}
}

func (c *tally) add(body string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[body]++
	if !c.closed && len(c.seen) >= c.want {
		c.closed = true
		close(c.all)
	}
}

func (c *tally) handler() ferry.Handler {
	return ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		c.add(string(m.Body))
		return nil
	})
}

func (c *tally) duplicates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := 0
	for _, n := range c.seen {
		d += n - 1
	}
	return d
}

func (c *tally) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// waitAll waits for every wanted body, failing after a generous watchdog.
func (c *tally) waitAll(t *testing.T) {
	t.Helper()
	select {
	case <-c.all:
	case <-time.After(60 * time.Second):
		t.Fatalf("watchdog: %d of %d messages handled", c.distinct(), c.want)
	}
}

func startConsumer(t *testing.T, b *ferry.Broker, group string, h ferry.Handler, opts ...ferry.ConsumerOption) *ferry.Consumer {
	t.Helper()
	c, err := b.NewConsumer(group, "t", h, opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// union returns every member's assignment and fails on a queue held twice.
func union(t *testing.T, cs ...*ferry.Consumer) map[ferry.QueueID]string {
	owners := map[ferry.QueueID]string{}
	for _, c := range cs {
		for _, q := range c.Assigned() {
			if o, ok := owners[q]; ok {
				t.Errorf("queue %s held by %s and %s", q, o, c.MemberID())
			}
			owners[q] = c.MemberID()
		}
	}
	return owners
}

func TestConsumerExactlyOnceStableGroup(t *testing.T) {
	n := 12000
	if testing.Short() {
		n = 3000
	}
	b := newTopic(t, 8)
	c := newTally(n)
	var cs []*ferry.Consumer
	for i := range 3 {
		cs = append(cs, startConsumer(t, b, "g", c.handler(), ferry.WithMemberID("m"+strconv.Itoa(i))))
	}
	// AllocateAveragely over m0, m1, m2: {0,1,2}, {3,4,5}, {6,7}.
	want := [][]ferry.QueueID{{{"t", 0}, {"t", 1}, {"t", 2}}, {{"t", 3}, {"t", 4}, {"t", 5}}, {{"t", 6}, {"t", 7}}}
	require.Eventually(t, func() bool {
		union(t, cs...) // never a queue held twice, even mid-rebalance
		for i, c := range cs {
			if !slices.Equal(want[i], c.Assigned()) {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)

	produce(t, b, "t", "m", n, 1000)
	c.waitAll(t)
	for _, cn := range cs {
		require.NoError(t, cn.Close())
	}
	assert.Equal(t, n, c.distinct())
	assert.Zero(t, c.duplicates(), "a stable group handles each message once")
}

func TestConsumerResumesFromCommittedCursor(t *testing.T) {
	b := newTopic(t, 2)
	produce(t, b, "t", "a", 100, 10)
	first := newTally(100)
	c1 := startConsumer(t, b, "g", first.handler())
	first.waitAll(t)
	require.NoError(t, c1.Close())
	require.ErrorIs(t, c1.Start(context.Background()), ferry.ErrClosed)
	require.NoError(t, c1.Close(), "Close is idempotent")

	produce(t, b, "t", "b", 50, 10)
	second := newTally(50)
	startConsumer(t, b, "g", second.handler())
	second.waitAll(t)
	for body := range second.seen {
		assert.Equal(t, byte('b'), body[0], "a resumed group sees only new messages, got %q", body)
	}
}

func TestConsumerStartFromOnNewGroup(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "old", 10, 1)

	latest := newTally(5)
	startConsumer(t, b, "late", latest.handler(), ferry.WithStartFrom(ferry.Latest))
	earliest := newTally(15)
	startConsumer(t, b, "early", earliest.handler()) // Earliest is the default
	produce(t, b, "t", "new", 5, 1)
	latest.waitAll(t)
	earliest.waitAll(t)
	for body := range latest.seen {
		assert.Contains(t, body, "new")
	}
	assert.Len(t, earliest.seen, 15)
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
		"autocommit":  {ferry.WithAutoCommit()},
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
	assert.Contains(t, err.Error(), "ferry_test.emptyReadQueue read 0 messages")
	produce(t, b, "t", "x", n, 1)
	c.waitAll(t) // the fetch loop went on after the bad read
	assert.Equal(t, n, c.distinct())
}
