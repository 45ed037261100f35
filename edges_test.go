package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests of the delivery guarantees at the edges: hand-over,
// lifecycle, dead letters, Block after a restart.

// watchdog is how long a test waits for something that must happen.
const watchdog = 30 * time.Second

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(watchdog):
		t.Fatalf("watchdog: %s", what)
	}
}

// orderLog records, in the order they happen, the offsets a group's
// handlers finished, and checks that none finished before a lower one.
type orderLog struct {
	mu   sync.Mutex
	done map[int64]bool
	bad  []string
	next int64 // the lowest offset not finished
}

func newOrderLog() *orderLog { return &orderLog{done: map[int64]bool{}} }

func (l *orderLog) finish(who string, off int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if off > l.next {
		l.bad = append(l.bad, who+" finished "+strconv.FormatInt(off, 10)+" before "+strconv.FormatInt(l.next, 10))
	}
	l.done[off] = true
	for l.done[l.next] {
		l.next++
	}
}

func (l *orderLog) upTo() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// Ordered: a message that failed and waits for its retry when its queue
// is released (Close, or a member joining that takes the queue) is not
// overtaken by later offsets, on this member or the next owner.
func TestOrderedReleaseKeepsFailedMessageFirst(t *testing.T) {
	for i := range 20 { // the race this guards against is a narrow one
		for _, how := range []string{"close", "join"} {
			t.Run(how+"/"+strconv.Itoa(i), func(t *testing.T) { testOrderedRelease(t, how) })
		}
	}
}

func testOrderedRelease(t *testing.T, how string) {
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 200, 1)
	// Producers go on writing meanwhile.
	p := newProducer(t, b)
	stopSending := make(chan struct{})
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		for i := 0; ; i++ {
			select {
			case <-stopSending:
				return
			default:
			}
			_, _ = p.Send(context.Background(), &ferry.Message{Topic: "t", Body: []byte("more" + strconv.Itoa(i))})
		}
	}()
	stopped := sync.OnceFunc(func() { close(stopSending); <-sending })
	defer stopped()
	log := newOrderLog()
	failed := make(chan struct{})
	var once sync.Once
	handler := func(who string) ferry.Handler {
		return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
			d, _ := ferry.DeliveryFrom(ctx)
			if m.Offset == 100 && d.Attempt == 1 && who == "first" {
				once.Do(func() { close(failed) })
				return errors.New("first attempt fails")
			}
			log.finish(who, m.Offset)
			return nil
		})
	}
	opts := []ferry.ConsumerOption{ferry.Ordered(), ferry.WithRetry(3, time.Hour), ferry.WithConcurrency(4)}
	first, err := b.NewConsumer("g", "t", handler("first"), append(opts, ferry.WithMemberID("m2"))...)
	require.NoError(t, err)
	require.NoError(t, first.Start(context.Background()))
	waitFor(t, failed, "offset 100 fails")
	var second *ferry.Consumer
	if how == "close" {
		require.NoError(t, first.Close())
		second = startConsumer(t, b, "g", handler("second"), append(opts, ferry.WithMemberID("m1"))...)
	} else {
		// m1 sorts first: it takes the one queue from m2.
		second = startConsumer(t, b, "g", handler("second"), append(opts, ferry.WithMemberID("m1"))...)
	}
	assert.Equal(t, []ferry.QueueID{{Topic: "t", Queue: 0}}, second.Assigned())
	stopped()
	q, err := b.Queue("t", 0)
	require.NoError(t, err)
	_, next := q.Offsets()
	require.Eventually(t, func() bool { return log.upTo() == next }, watchdog, time.Millisecond)
	require.NoError(t, first.Close())
	log.mu.Lock()
	defer log.mu.Unlock()
	assert.Empty(t, log.bad)
}

// A dead-letter send that fails is tried again with backoff: the message
// stays unfinished until its dead letter is written, ordered mode does not
// move past it meanwhile, and neither mode stalls.
func TestDeadLetterFailureIsRetried(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run("ordered="+strconv.FormatBool(ordered), func(t *testing.T) {
			st := ferrytest.NewFakeStorage()
			b := newTopic(t, 1, ferry.WithStorage(st))
			t.Cleanup(func() { _ = st.Close() })
			const n = 60
			log := newOrderLog()
			var dlqFails atomic.Int32
			st.OnWrite(func(_ context.Context, _ int, msgs []*ferry.EnhancedMessage) error {
				if msgs[0].Topic == "%DLQ%g" {
					if dlqFails.Add(1) <= 3 {
						return errors.New("dead-letter queue unavailable")
					}
					log.finish("dead letter", 0)
				}
				return nil
			})
			produce(t, b, "t", "m", n, 1)
			var reported atomic.Int32
			opts := []ferry.ConsumerOption{ferry.WithRetry(2, time.Millisecond), ferry.WithMaxSpan(10),
				ferry.WithOnError(func(error) { reported.Add(1) })}
			if ordered {
				opts = append(opts, ferry.Ordered())
			}
			startConsumer(t, b, "g", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
				if m.Offset == 0 {
					return ferry.Permanent(errors.New("poison"))
				}
				log.finish("handler", m.Offset)
				return nil
			}), opts...)
			require.Eventually(t, func() bool { return log.upTo() == n }, watchdog, time.Millisecond, "every message finishes")
			assert.GreaterOrEqual(t, reported.Load(), int32(3), "each failed dead-letter send is reported")
			dl := st.Messages("%DLQ%g")
			require.Len(t, dl, 1)
			assert.Equal(t, "0", dl[0].Headers[ferry.HeaderOriginOffset])
			if ordered {
				log.mu.Lock()
				defer log.mu.Unlock()
				assert.Empty(t, log.bad, "nothing overtakes a message whose dead letter is not written yet")
			}
		})
	}
}

// A message as large as a producer may send can be dead-lettered, though
// the dead letter carries more headers than the original.
func TestDeadLetterOfLargestMessage(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run("ordered="+strconv.FormatBool(ordered), func(t *testing.T) {
			b := newTopic(t, 1)
			p := newProducer(t, b)
			big := make([]byte, ferry.DefaultMaxMessageBytes-50)
			_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Key: "k", Body: big})
			require.NoError(t, err)
			for i := range 30 {
				_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
				require.NoError(t, err)
			}
			var handled atomic.Int32
			opts := []ferry.ConsumerOption{ferry.WithMaxSpan(10)}
			if ordered {
				opts = append(opts, ferry.Ordered())
			}
			startConsumer(t, b, "g", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
				if m.Offset == 0 {
					return ferry.Permanent(errors.New("too big to handle"))
				}
				handled.Add(1)
				return nil
			}), opts...)
			require.Eventually(t, func() bool { _, ok := b.Topic("%DLQ%g"); return ok }, watchdog, time.Millisecond)
			q, err := b.Queue("%DLQ%g", 0)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), watchdog)
			defer cancel()
			dst := make([]*ferry.EnhancedMessage, 1)
			_, err = q.Read(ctx, 0, dst)
			require.NoError(t, err, "the large message is dead-lettered")
			assert.Len(t, dst[0].Body, len(big))
			require.Eventually(t, func() bool { return handled.Load() == 30 }, watchdog, time.Millisecond, "and the rest handled")
		})
	}
}

// Block: every group with a committed cursor on the topic holds back
// release after a restart, whether or not it has a member now.
func TestBlockHoldsForGroupsAfterRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	meta := ferry.TopicMeta{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: 16, Overflow: ferry.Block}}
	open := func() (*filestore.Store, *ferry.Broker) {
		st, err := filestore.Open(dir)
		require.NoError(t, err)
		b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
		require.NoError(t, err)
		return st, b
	}
	st, b := open()
	require.NoError(t, b.CreateTopic(ctx, meta))
	produce(t, b, "t", "a", 5, 1)
	for _, g := range []string{"A", "B"} {
		tl := newTally(5)
		c, err := b.NewConsumer(g, "t", tl.handler())
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		tl.waitAll(t)
		require.NoError(t, c.Close())
		offs, err := st.Load(ctx, "t", g, 1)
		require.NoError(t, err)
		require.Equal(t, []int64{5}, offs)
	}
	require.NoError(t, b.Close())
	require.NoError(t, st.Close())

	st, b = open()
	defer st.Close()
	defer b.Close()
	a := newTally(5)
	ca, err := b.NewConsumer("A", "t", a.handler())
	require.NoError(t, err)
	require.NoError(t, ca.Start(ctx))
	defer ca.Close()
	p := newProducer(t, b)
	sent := 0
	for ; sent < 100; sent++ {
		_, err := p.TrySend(&ferry.Message{Topic: "t", Body: []byte("b" + strconv.Itoa(sent))})
		if errors.Is(err, ferry.ErrQueueFull) {
			break
		}
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, sent, 16, "B, at offset 5, holds the queue back")
	a.waitAll(t)

	var resets atomic.Int32
	bt := newTally(sent)
	cb, err := b.NewConsumer("B", "t", bt.handler(), ferry.WithOnReset(func(ferry.QueueID, int64, int64) { resets.Add(1) }))
	require.NoError(t, err)
	require.NoError(t, cb.Start(ctx))
	defer cb.Close()
	bt.waitAll(t)
	assert.Zero(t, resets.Load(), "B lost nothing")
}

// slowLoadStore is a cursor store whose Load waits until release is
// closed, once armed.
type slowLoadStore struct {
	*ferry.MemoryCursorStore
	armed   atomic.Bool
	loading chan struct{}
	release chan struct{}
}

func (s *slowLoadStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if s.armed.Load() && group == "B" {
		close(s.loading)
		<-s.release
	}
	return s.MemoryCursorStore.Load(ctx, topic, group, queues)
}

// ForgetGroup while the group's last member is closing is refused, or
// lasts: the closing member does not register the group again.
func TestForgetGroupRacingClose(t *testing.T) {
	ctx := context.Background()
	cs := &slowLoadStore{MemoryCursorStore: ferry.NewMemoryCursorStore(), loading: make(chan struct{}), release: make(chan struct{})}
	b, err := ferry.NewBroker(ferry.WithCursorStore(cs))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1,
		Retention: ferry.Retention{MaxMessages: 4, Overflow: ferry.Block}}))
	a := newTally(8)
	startConsumerOn(t, b, "A", a.handler())

	cs.armed.Store(true)
	cb, err := b.NewConsumer("B", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }))
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- cb.Start(ctx) }()
	waitFor(t, cs.loading, "B loads its cursor")
	closed := make(chan error, 1)
	go func() { closed <- cb.Close() }()
	<-started
	forgot := false
	for range 50 {
		err := b.ForgetGroup(ctx, "B", "t")
		if err == nil {
			forgot = true
			break
		}
		require.ErrorIs(t, err, ferry.ErrGroupActive)
		time.Sleep(time.Millisecond) // let Close get as far as it can
	}
	close(cs.release)
	require.NoError(t, <-closed)
	if !forgot {
		require.NoError(t, b.ForgetGroup(ctx, "B", "t"), "once B is closed")
	}
	p := newProducer(t, b)
	for i := range 8 {
		sctx, cancel := context.WithTimeout(ctx, watchdog)
		_, err := p.Send(sctx, &ferry.Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		cancel()
		require.NoError(t, err, "after ForgetGroup, only A holds the topic back")
	}
	a.waitAll(t)
}

func startConsumerOn(t *testing.T, b *ferry.Broker, group string, h ferry.Handler, opts ...ferry.ConsumerOption) *ferry.Consumer {
	t.Helper()
	c, err := b.NewConsumer(group, "t", h, opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A Poll whose context ends while the consumer waits for its first
// queues ends that Poll only: the consumer goes on and a later Poll gets
// messages.
func TestPollTimeoutLeavesConsumerRunning(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 10, 1)
	holding := make(chan struct{})
	unblock := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	called := map[int64]bool{}
	// m2 holds the queue with handlers stuck on the first messages of its
	// batch (which start first is the scheduler's choice).
	m2 := startConsumer(t, b, "g", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		mu.Lock()
		called[m.Offset] = true
		mu.Unlock()
		once.Do(func() { close(holding) })
		<-unblock
		return errors.New("fails")
	}), ferry.WithMemberID("m2"), ferry.WithRetry(2, time.Hour))
	waitFor(t, holding, "m2 handles its first message")

	pc, err := b.NewPullConsumer("g", "t", ferry.WithMemberID("m1")) // takes the queue from m2
	require.NoError(t, err)
	defer pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err = pc.Poll(ctx, 10)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "m2 drains: the first Poll times out")
	assert.Equal(t, 1, strings.Count(err.Error(), "ferry:"), "one ferry: per chain: %v", err)

	close(unblock)
	// More messages: whatever m2's batch took (its handler fails them
	// all, so they go to the group's retry topic), m1 has some to get.
	produce(t, b, "t", "n", 5, 1)
	ctx, cancel = context.WithTimeout(context.Background(), watchdog)
	defer cancel()
	msgs, err := pc.Poll(ctx, 10)
	require.NoError(t, err, "the consumer lives on")
	require.NotEmpty(t, msgs)
	// Every message m2 handled went to the retry topic (its attempt failed
	// while the queue was still m2's to release), and its cursor moved
	// past them; the ones it took but had not started went back
	// unfinished. m1 goes on with exactly those: from the first one m2 did
	// not handle, none that m2 handled.
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, len(called), int(m2.Stats().Retried), "m2 retried each message it handled")
	first := int64(0)
	for called[first] {
		first++
	}
	assert.Equal(t, first, msgs[0].Offset, "m1 starts at the first message m2 did not handle (m2 handled %v)", called)
	for _, m := range msgs {
		assert.False(t, called[m.Offset], "offset %d: handled by m2 and delivered to m1", m.Offset)
	}
}

// After the drain timeout the old owner starts no more handler calls for
// the queue it gave up.
func TestNoHandlingAfterDrainTimeout(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 100, 1)
	stuck := make(chan struct{})
	unstick := make(chan struct{})
	var after atomic.Int32
	var gaveUp atomic.Bool
	old := startConsumer(t, b, "g", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		if gaveUp.Load() {
			after.Add(1)
		}
		if m.Offset == 0 {
			close(stuck)
			<-unstick // ignores ctx
		}
		return nil
	}), ferry.WithMemberID("m2"), ferry.WithConcurrency(1), ferry.WithDrainTimeout(20*time.Millisecond))
	waitFor(t, stuck, "m2 handles offset 0")
	next := newTally(100)
	startConsumer(t, b, "g", next.handler(), ferry.WithMemberID("m1")) // takes the queue once m2 gives up
	next.waitAll(t)
	gaveUp.Store(true)
	close(unstick)
	require.NoError(t, old.Close())
	assert.Zero(t, after.Load(), "handler calls on the old owner after it gave the queue up")
}

// failingCommitStore fails every Commit once armed.
type failingCommitStore struct {
	*ferry.MemoryCursorStore
	armed atomic.Bool
}

var errDiskGone = errors.New("disk gone")

func (s *failingCommitStore) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if s.armed.Load() {
		return errDiskGone
	}
	return s.MemoryCursorStore.Commit(ctx, topic, group, queue, offset)
}

func (s *failingCommitStore) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if s.armed.Load() {
		return errDiskGone
	}
	return s.MemoryCursorStore.CommitFenced(ctx, topic, group, queue, offset, token)
}

// Close returns what failed while closing: the final commit here.
func TestCloseReturnsFinalCommitError(t *testing.T) {
	for _, pull := range []bool{false, true} {
		t.Run("pull="+strconv.FormatBool(pull), func(t *testing.T) {
			cs := &failingCommitStore{MemoryCursorStore: ferry.NewMemoryCursorStore()}
			b := newTopic(t, 1, ferry.WithCursorStore(cs))
			produce(t, b, "t", "m", 10, 1)
			var closeFn func() error
			if pull {
				pc, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
				require.NoError(t, err)
				ctx, cancel := context.WithTimeout(context.Background(), watchdog)
				defer cancel()
				got := 0
				for got < 10 {
					msgs, err := pc.Poll(ctx, 10)
					require.NoError(t, err)
					got += len(msgs)
				}
				closeFn = pc.Close
			} else {
				handled := make(chan struct{}, 10)
				block := make(chan struct{})
				c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
					if m.Offset == 9 {
						<-block // the last one finishes while closing
					}
					handled <- struct{}{}
					return nil
				}))
				require.NoError(t, err)
				require.NoError(t, c.Start(context.Background()))
				for range 9 {
					<-handled
				}
				unblock := sync.OnceFunc(func() { close(block) })
				closeFn = func() error {
					unblock() // offset 9 finishes: its commit fails, and so does Close's
					return c.Close()
				}
			}
			cs.armed.Store(true)
			err := closeFn()
			require.ErrorIs(t, err, errDiskGone)
			for _, line := range strings.Split(err.Error(), "\n") {
				assert.Equal(t, 1, strings.Count(line, "ferry:"), "one ferry: per chain: %v", line)
			}
			assert.Equal(t, err, closeFn(), "Close returns the same again")
		})
	}
}

// A cursor commit that failed is tried again, though no message finishes
// after it: before, the cursor stayed behind until the next finish or the
// release, for ever on a queue with no more traffic (the next owner after a
// crash got everything since again).
func TestFailedCommitTriedAgain(t *testing.T) {
	cs := &failingCommitStore{MemoryCursorStore: ferry.NewMemoryCursorStore()}
	b := newTopic(t, 1, ferry.WithCursorStore(cs))
	var errs atomic.Int32
	tally := newTally(10)
	c := startConsumer(t, b, "g", tally.handler(), ferry.WithOnError(func(error) { errs.Add(1) }))
	cs.armed.Store(true) // the queue is taken; from now on the disk is gone
	produce(t, b, "t", "m", 10, 1)
	tally.waitAll(t)
	require.Eventually(t, func() bool { return errs.Load() > 0 }, watchdog, time.Millisecond, "the commits fail")
	cs.armed.Store(false) // the disk is back; nothing more is sent or handled
	require.Eventually(t, func() bool {
		offs, err := cs.Load(context.Background(), "t", "g", 1)
		return err == nil && offs[0] == 10
	}, 10*time.Second, 5*time.Millisecond, "the cursor reaches the end once the store works again")
	assert.Equal(t, int64(10), c.Stats().Queues[0].Committed)
}
