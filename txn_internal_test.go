package ferry

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTxnStaleWriterFenced: an owner that has not noticed that a later
// owner took its queue (a take marker with a later token is in the log)
// writes its record after the marker, finds the marker, writes none of
// its outputs and gives the queue up; its record is void, and the
// message's outputs are those of the next call only.
func TestTxnStaleWriterFenced(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 1}))
	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	calls := 0
	c, err := b.NewConsumer("g", "in", HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if err := OutboxFrom(ctx).Send(&Message{Topic: "out", Body: []byte("call " + strconv.Itoa(n))}); err != nil {
			return err
		}
		if n == 1 {
			close(entered)
			<-release
		}
		return nil
	}), Transactional())
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte("x")})
	require.NoError(t, err)
	<-entered

	c.m.mu.Lock()
	r := c.m.runs[0]
	c.m.mu.Unlock()
	token := r.lease.Token()
	name, err := TransactionLog("g", "in")
	require.NoError(t, err)
	lt, err := b.topic(name)
	require.NoError(t, err)
	mark := &EnhancedMessage{Message: Message{Topic: name, Tag: txnMarkerTag + strconv.FormatUint(token+1, 10)}}
	_, err = lt.queues[0].Write(ctx, []*EnhancedMessage{mark})
	require.NoError(t, err)
	close(release)

	out, err := b.topic("out")
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the second call finished: its outputs, and any wrong one, are written
		lag, err := b.Lag(ctx, "g", "in")
		mu.Lock()
		defer mu.Unlock()
		return calls == 2 && err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	dst := make([]*EnhancedMessage, 4)
	n, err := out.queues[0].Read(ctx, 0, dst)
	require.NoError(t, err)
	require.Equal(t, 1, n, "outputs")
	assert.Equal(t, "call 2", string(dst[0].Body), "the stale call's output is never stored")
	mu.Lock()
	assert.Equal(t, 2, calls)
	mu.Unlock()
}

// TestTxnRecordsHaveIDs: the log's take markers and records carry IDs
// of their own, as a producer's messages do: a store that takes a
// message ID seen before for a retried write (natsstore) would otherwise
// store the first record only.
func TestTxnRecordsHaveIDs(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 1}))
	release := make(chan struct{})
	c, err := b.NewConsumer("g", "in", HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if m.Offset == 0 {
			<-release // the cursor stays at 0: the log keeps every record
		}
		return OutboxFrom(ctx).Send(&Message{Topic: "out", Body: m.Body})
	}), Transactional())
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	defer close(release)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	const n = 6
	for i := range n {
		_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	name, err := TransactionLog("g", "in")
	require.NoError(t, err)
	var lq Queue
	require.Eventually(t, func() bool { // the take marker, a record for each message but the first
		lt, err := b.topic(name)
		if err != nil {
			return false
		}
		lq = lt.queues[0]
		_, next := lq.Offsets()
		return next == n
	}, 5*time.Second, time.Millisecond)
	oldest, next := lq.Offsets()
	dst := make([]*EnhancedMessage, n)
	got, err := lq.Read(ctx, oldest, dst)
	require.NoError(t, err)
	require.Equal(t, int(next-oldest), got)
	require.GreaterOrEqual(t, got, n-1, "the records")
	seen := map[MessageID]bool{}
	for _, m := range dst[:got] {
		require.NotZero(t, m.ID, "log offset %d (%s)", m.Offset, m.Tag)
		require.NotZero(t, m.BornUnixNano, "log offset %d (%s)", m.Offset, m.Tag)
		require.False(t, seen[m.ID], "log offset %d (%s): ID seen before", m.Offset, m.Tag)
		seen[m.ID] = true
	}
}

// gatedStorage is a MemoryStorage whose queues are not *MemoryQueue (so
// that a transaction log takes the path of stores that sync), and whose
// writes to topic wait until gate is closed.
type gatedStorage struct {
	*MemoryStorage
	topic string
	gate  chan struct{}
}

func (s *gatedStorage) OpenQueue(ctx context.Context, meta TopicMeta, queue int) (Queue, error) {
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, queue)
	if err != nil {
		return nil, err
	}
	g := &gatedQueue{MemoryQueue: q.(*MemoryQueue)}
	if meta.Name == s.topic {
		g.gate = s.gate
	}
	return g, nil
}

type gatedQueue struct {
	*MemoryQueue
	gate chan struct{}
}

func (q *gatedQueue) Write(ctx context.Context, msgs []*EnhancedMessage) (int64, error) {
	if q.gate != nil {
		select {
		case <-q.gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return q.MemoryQueue.Write(ctx, msgs)
}

// TestTxnOutputsAfterFinish: outside memory, a call's outputs are
// written after its input finished (its record is in the log), so that
// the call waits for one write to stable storage, not two. Until they
// are, the log's floor stays at or below their record, which a next
// owner would apply again; then it moves past.
func TestTxnOutputsAfterFinish(t *testing.T) {
	ctx := context.Background()
	gate := make(chan struct{})
	st := &gatedStorage{MemoryStorage: NewMemoryStorage(), topic: "out", gate: gate}
	b, err := NewBroker(WithStorage(st))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 1}))
	c, err := b.NewConsumer("g", "in", HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		return OutboxFrom(ctx).Send(&Message{Topic: "out", Body: m.Body})
	}), Transactional(), Ordered()) // records, and so outputs, in the inputs' order
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	const n = 5
	for i := range n {
		_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { // finished, and committed, with no output written
		lag, err := b.Lag(ctx, "g", "in")
		return err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	out, err := b.topic("out")
	require.NoError(t, err)
	_, next := out.queues[0].Offsets()
	require.Zero(t, next, "outputs written")

	name, err := TransactionLog("g", "in")
	require.NoError(t, err)
	floor := func() int64 {
		offs, err := b.cursors.Load(ctx, name, "g", 1)
		require.NoError(t, err)
		return offs[0]
	}
	c.m.mu.Lock()
	r := c.m.runs[0]
	c.m.mu.Unlock()
	r.commitFloor() // as the committer and an idle applier do, at once
	assert.LessOrEqual(t, floor(), int64(1), "the floor passed records whose outputs are not written (the take marker is at 0, the records from 1)")

	close(gate)
	require.Eventually(t, func() bool {
		_, next := out.queues[0].Offsets()
		return next == n
	}, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return floor() >= n }, 5*time.Second, time.Millisecond, "the floor follows once they are written")
	dst := make([]*EnhancedMessage, n+1)
	got, err := out.queues[0].Read(ctx, 0, dst)
	require.NoError(t, err)
	require.Equal(t, n, got)
	for i, m := range dst[:got] {
		assert.Equal(t, strconv.Itoa(i), string(m.Body), "outputs in the order of their inputs")
	}
}

// forgetfulCursors is a cursor store that drops the commits of topic
// while forget is set, as a crash would before they were made durable.
type forgetfulCursors struct {
	*MemoryCursorStore
	topic  string
	forget sync.Mutex // guards on
	on     bool       // commits of topic are dropped
}

func (s *forgetfulCursors) drops(topic string) bool {
	s.forget.Lock()
	defer s.forget.Unlock()
	return s.on && topic == s.topic
}

func (s *forgetfulCursors) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if s.drops(topic) {
		return nil
	}
	return s.MemoryCursorStore.Commit(ctx, topic, group, queue, offset)
}

func (s *forgetfulCursors) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if s.drops(topic) {
		return nil
	}
	return s.MemoryCursorStore.CommitFenced(ctx, topic, group, queue, offset, token)
}

func (s *forgetfulCursors) CommitFinished(ctx context.Context, topic, group string, queue int, offset int64, finished []int64, token uint64) error {
	if s.drops(topic) {
		return nil
	}
	return s.MemoryCursorStore.CommitFinished(ctx, topic, group, queue, offset, finished, token)
}

func (s *forgetfulCursors) set(on bool) {
	s.forget.Lock()
	s.on = on
	s.forget.Unlock()
}

// TestTxnMemoryOneWrite: in memory a batch's calls commit together:
// one record for their inputs, whose body says its outputs were written
// with it, and the outputs are one atomic write; the outputs carry no
// keys of their own, and a next owner that finds the records of inputs
// its cursor does not pass finishes them as they are: it neither
// handles them again nor writes their outputs again.
func TestTxnMemoryOneWrite(t *testing.T) {
	ctx := context.Background()
	cs := &forgetfulCursors{MemoryCursorStore: NewMemoryCursorStore(), topic: "in", on: true}
	b, err := NewBroker(WithCursorStore(cs))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 2}))
	const n = 40 // within one batch
	var mu sync.Mutex
	calls := 0
	var c1 *Consumer
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first { // the rest wait in the buffer, for one batch
			waitBuffered(t, c1, n)
		}
		ob := OutboxFrom(ctx)
		for i := range 2 { // to both queues of out
			if err := ob.Send(&Message{Topic: "out", Key: strconv.Itoa(i), Body: append(m.Body, byte('a'+i))}); err != nil {
				return err
			}
		}
		return nil
	})
	out, err := b.topic("out")
	require.NoError(t, err)
	stored := func() (n int64) {
		for _, q := range out.queues {
			_, next := q.Offsets()
			n += next
		}
		return n
	}
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for i := range n {
		_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	c1, err = b.NewConsumer("g", "in", h, Transactional(), WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c1.Start(ctx))
	require.Eventually(t, func() bool { return stored() == 2*n }, 5*time.Second, time.Millisecond)
	require.NoError(t, c1.Close())
	offs, err := cs.Load(ctx, "in", "g", 1)
	require.NoError(t, err)
	require.Less(t, offs[0], int64(1), "the input's cursor was committed: nothing left to take")

	name, err := TransactionLog("g", "in")
	require.NoError(t, err)
	lt, err := b.topic(name)
	require.NoError(t, err)
	oldest, next := lt.queues[0].Offsets()
	dst := make([]*EnhancedMessage, next-oldest)
	got, err := lt.queues[0].Read(ctx, oldest, dst)
	require.NoError(t, err)
	records, inputs := 0, map[int64]int{}
	for _, m := range dst[:got] {
		marker, off, _, err := parseTxnTag(m.Tag)
		if err != nil || marker {
			continue
		}
		records++
		ins, err := recordInputs(off, m.Body)
		require.NoError(t, err)
		if len(ins) == 1 {
			assert.Equal(t, txnWrittenBody, m.Body, "record at %d", m.Offset)
		} else {
			assert.Equal(t, byte(txnWrittenManyVersion), m.Body[0], "record at %d", m.Offset)
		}
		outs, err := decodeTxnRecord(m.Body)
		require.NoError(t, err)
		assert.Empty(t, outs, "record at %d: outputs written with it", m.Offset)
		for _, in := range ins {
			inputs[in]++
		}
	}
	for i := range int64(n) {
		assert.Equal(t, 1, inputs[i], "records of input %d", i)
	}
	assert.Len(t, inputs, n)
	assert.Less(t, records, n, "a record for a batch's calls, not for each")
	for _, q := range out.queues {
		_, next := q.Offsets()
		dst := make([]*EnhancedMessage, next)
		got, err := q.Read(ctx, 0, dst)
		require.NoError(t, err)
		for _, m := range dst[:got] {
			assert.Empty(t, m.DedupKey, "output %s", m.Body)
		}
	}

	cs.set(false)
	c2, err := b.NewConsumer("g", "in", h, Transactional())
	require.NoError(t, err)
	require.NoError(t, c2.Start(ctx))
	defer c2.Close()
	_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte("last")})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		lag, err := b.Lag(ctx, "g", "in")
		return err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	mu.Lock()
	assert.Equal(t, n+1, calls, "handled once each: the next owner finished the first n from their records")
	mu.Unlock()
	assert.Equal(t, int64(2*n+2), stored(), "outputs stored once each")
}

// TestTxnMemoryBatchOverRetention: a batch's calls whose outputs
// together are more than a target's retention takes in one write (each
// call's alone fits) commit one by one: none fails, none is handled
// twice, every output is stored once.
func TestTxnMemoryBatchOverRetention(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 1, Retention: Retention{MaxMessages: 3, Overflow: DropOldest}}))
	const n = 40
	var calls atomic.Int64
	var c *Consumer
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if calls.Add(1) == 1 { // the rest wait in the buffer, for one batch
			waitBuffered(t, c, n)
		}
		return OutboxFrom(ctx).Send(&Message{Topic: "out", Body: m.Body})
	})
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for i := range n {
		_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	c, err = b.NewConsumer("g", "in", h, Transactional(), WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	require.Eventually(t, func() bool {
		lag, err := b.Lag(ctx, "g", "in")
		return err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	st := c.Stats()
	assert.Equal(t, uint64(n), st.Handled)
	assert.Zero(t, st.Failed)
	assert.Zero(t, st.Retried)
	assert.Equal(t, int64(n), calls.Load(), "handled once each")
	q, err := b.Queue("out", 0)
	require.NoError(t, err)
	_, next := q.Offsets()
	assert.Equal(t, int64(n), next, "each output stored once")
}

// TestTxnMemorySlowCallsWaitForNone: a call slower than txnHold commits
// as it returns, though its batch's other calls are still to run: each
// call finds the output of the call before it visible.
func TestTxnMemorySlowCallsWaitForNone(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 1}))
	out, err := b.Queue("out", 0)
	require.NoError(t, err)
	const n = 8
	var mu sync.Mutex
	var seen []int64 // the outputs visible as each call starts
	var c *Consumer
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if m.Offset == 0 { // the rest wait in the buffer, for one batch
			waitBuffered(t, c, n)
		}
		_, next := out.Offsets()
		mu.Lock()
		seen = append(seen, next)
		mu.Unlock()
		time.Sleep(3 * txnHold) // the call's work
		return OutboxFrom(ctx).Send(&Message{Topic: "out", Body: m.Body})
	})
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for i := range n {
		_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	c, err = b.NewConsumer("g", "in", h, Transactional(), WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	require.Eventually(t, func() bool {
		lag, err := b.Lag(ctx, "g", "in")
		return err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, want, seen, "outputs visible as each call started")
}

// TestTxnMemoryBatchFenced: a batch's calls held while a later owner
// writes to the log are fenced together when they commit: none of
// their outputs is stored, and each of their inputs is handled again,
// its outputs stored once.
func TestTxnMemoryBatchFenced(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 1}))
	const n = 6
	first, entered, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	calls := 0
	var c *Consumer
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		mu.Lock()
		calls++
		call := calls
		mu.Unlock()
		switch call {
		case 1: // alone in its batch; the rest wait in the buffer, for the next one
			close(first)
			waitBuffered(t, c, n)
		case 2:
			close(entered)
			<-release
		}
		return OutboxFrom(ctx).Send(&Message{Topic: "out", Body: fmt.Appendf(nil, "%s/%d", m.Body, call)})
	})
	c, err = b.NewConsumer("g", "in", h, Transactional(), WithConcurrency(1))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	send := func(i int) {
		_, err := p.Send(ctx, &Message{Topic: "in", Body: []byte("m" + strconv.Itoa(i))})
		require.NoError(t, err)
	}
	send(0)
	<-first
	for i := 1; i < n; i++ {
		send(i)
	}
	<-entered
	c.m.mu.Lock()
	r := c.m.runs[0]
	c.m.mu.Unlock()
	name, err := TransactionLog("g", "in")
	require.NoError(t, err)
	lt, err := b.topic(name)
	require.NoError(t, err)
	mark := &EnhancedMessage{Message: Message{Topic: name, Tag: txnMarkerTag + strconv.FormatUint(r.lease.Token()+1, 10)}}
	_, err = lt.queues[0].Write(ctx, []*EnhancedMessage{mark})
	require.NoError(t, err)
	close(release)

	require.Eventually(t, func() bool {
		lag, err := b.Lag(ctx, "g", "in")
		return err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	out, err := b.Queue("out", 0)
	require.NoError(t, err)
	dst := make([]*EnhancedMessage, 2*n)
	got, err := out.Read(ctx, 0, dst)
	require.NoError(t, err)
	stored := map[string]int{}
	for _, m := range dst[:got] {
		var in, call int
		_, err := fmt.Sscanf(string(m.Body), "m%d/%d", &in, &call)
		require.NoError(t, err)
		stored["m"+strconv.Itoa(in)]++
		if in > 0 {
			assert.Greater(t, call, n, "output %s: of a call of the fenced batch", m.Body)
		}
	}
	for i := range n {
		assert.Equal(t, 1, stored["m"+strconv.Itoa(i)], "outputs of m%d", i)
	}
	mu.Lock()
	assert.Equal(t, 1+2*(n-1), calls, "the fenced batch's calls all ran, and each input ran again")
	mu.Unlock()
}

// waitBuffered waits, in a handler, until c buffers n messages, so that
// they are taken as one batch; after 5 s it reports an error and returns.
func waitBuffered(t *testing.T, c *Consumer, n int) {
	assert.Eventually(t, func() bool { return c.Stats().Buffered >= n }, 5*time.Second, time.Millisecond, "the consumer buffers %d messages", n)
}
