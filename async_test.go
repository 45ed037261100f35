package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/filestore"
)

// acks records SendAsync reports, in the order they came.
type acks struct {
	mu   sync.Mutex
	got  []ack
	wait sync.WaitGroup
}

type ack struct {
	seq int
	res ferry.SendResult
	err error
}

// done returns a callback for send seq; each must be called once.
func (a *acks) done(seq int) func(ferry.SendResult, error) {
	a.wait.Add(1)
	var once atomic.Bool
	return func(r ferry.SendResult, err error) {
		if once.Swap(true) {
			panic("a SendAsync callback called twice")
		}
		a.mu.Lock()
		a.got = append(a.got, ack{seq, r, err})
		a.mu.Unlock()
		a.wait.Done()
	}
}

func (a *acks) all() []ack {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]ack(nil), a.got...)
}

// gate holds every write of a FakeStorage until opened; entered gets one
// value per write that reached it.
type gate struct {
	open    chan struct{}
	entered chan int
}

func newGate(fs *ferrytest.FakeStorage) *gate {
	g := &gate{open: make(chan struct{}), entered: make(chan int, 1000)}
	fs.OnWrite(func(ctx context.Context, call int, msgs []*ferry.EnhancedMessage) error {
		g.entered <- len(msgs)
		select {
		case <-g.open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return g
}

func fakeBroker(t *testing.T, queues int) (*ferry.Broker, *ferrytest.FakeStorage) {
	b, fs := ferrytest.NewFakeBroker(t)
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: queues}))
	return b, fs
}

// Per queue, acknowledgements come in send order and the queue holds the
// messages in send order, on memory (written at once), a fake store
// (written by the producer's goroutines) and filestore (SyncAlways).
func TestSendAsyncOrder(t *testing.T) {
	const n, queues = 3000, 4
	for _, store := range []string{"memory", "fake", "filestore", "async writer"} {
		t.Run(store, func(t *testing.T) {
			var b *ferry.Broker
			var as *asyncStorage
			switch store {
			case "async writer":
				as = &asyncStorage{MemoryStorage: ferry.NewMemoryStorage()}
				t.Cleanup(func() { _ = as.Close() })
				b = ferrytest.NewBroker(t, ferry.WithStorage(as))
				require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: queues}))
			case "memory":
				b = newBroker(t, queues)
			case "fake":
				b, _ = fakeBroker(t, queues)
			case "filestore":
				st, err := filestore.Open(t.TempDir())
				require.NoError(t, err)
				t.Cleanup(func() { _ = st.Close() })
				b = ferrytest.NewBroker(t, ferry.WithStorage(st), ferry.WithCursorStore(st))
				require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: queues}))
			}
			p := newProducer(t, b, ferry.WithMaxInFlight(100))
			var a acks
			for i := range n {
				m := &ferry.Message{Topic: "orders", Key: strconv.Itoa(i % 7), Body: []byte(strconv.Itoa(i))}
				require.NoError(t, p.SendAsync(t.Context(), m, a.done(i)))
			}
			require.NoError(t, p.Flush(t.Context()))
			got := a.all()
			require.Len(t, got, n)
			last := map[int]ack{}
			for _, g := range got {
				require.NoError(t, g.err)
				q := g.res.Queue.Queue
				if prev, ok := last[q]; ok {
					require.Greater(t, g.seq, prev.seq, "queue %d acknowledged out of send order", q)
					require.Equal(t, prev.res.Offset+1, g.res.Offset, "queue %d", q)
				}
				last[q] = g
			}
			for q := range queues {
				rq, err := b.Queue("orders", q)
				require.NoError(t, err)
				_, next := rq.Offsets()
				dst := make([]*ferry.EnhancedMessage, next)
				k := 0
				for k < int(next) {
					r, err := rq.Read(t.Context(), int64(k), dst[k:])
					require.NoError(t, err)
					k += r
				}
				prev := -1
				for _, m := range dst {
					seq, err := strconv.Atoi(string(m.Body))
					require.NoError(t, err)
					require.Greater(t, seq, prev, "queue %d stores out of send order", q)
					prev = seq
				}
			}
			assert.Equal(t, uint64(n), p.Stats().Sent)
			if as != nil {
				assert.Positive(t, as.began(), "the queues' WriteAsync was used")
			}
		})
	}
}

// At the bound SendAsync waits for room, until its ctx ends; a write done
// frees room; Flush waits for every report.
func TestSendAsyncBackPressure(t *testing.T) {
	b, fs := fakeBroker(t, 1)
	g := newGate(fs)
	p := newProducer(t, b, ferry.WithMaxInFlight(3))
	var a acks
	for i := range 3 {
		require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, a.done(i)))
	}
	<-g.entered // the first write is held, with 1 to 3 messages in it

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	err := p.SendAsync(ctx, &ferry.Message{Topic: "orders"}, func(ferry.SendResult, error) { t.Error("a refused send reported") })
	require.ErrorIs(t, err, context.DeadlineExceeded, "the bound is full")

	fctx, fcancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer fcancel()
	require.ErrorIs(t, p.Flush(fctx), context.DeadlineExceeded, "Flush waits for the held write")

	waiting := make(chan error, 1)
	go func() { waiting <- p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, a.done(3)) }()
	close(g.open)
	require.NoError(t, <-waiting, "room came back")
	require.NoError(t, p.Flush(t.Context()))
	got := a.all()
	require.Len(t, got, 4)
	for i, g := range got {
		require.NoError(t, g.err)
		assert.Equal(t, i, g.seq)
		assert.Equal(t, int64(i), g.res.Offset)
	}
	assert.Len(t, fs.Messages("orders"), 4, "the refused send wrote nothing")
}

// A send whose ctx ends before its write starts is reported with ctx's
// error and not written; the sends around it are.
func TestSendAsyncCancel(t *testing.T) {
	b, fs := fakeBroker(t, 1)
	g := newGate(fs)
	p := newProducer(t, b)
	var a acks
	require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("a")}, a.done(0)))
	<-g.entered // a's write is in progress: b and c wait for the next
	ctx, cancel := context.WithCancel(t.Context())
	require.NoError(t, p.SendAsync(ctx, &ferry.Message{Topic: "orders", Body: []byte("b")}, a.done(1)))
	require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("c")}, a.done(2)))
	cancel()
	close(g.open)
	require.NoError(t, p.Flush(t.Context()))
	got := a.all()
	require.Len(t, got, 3)
	require.NoError(t, got[0].err)
	require.ErrorIs(t, got[1].err, context.Canceled)
	require.NoError(t, got[2].err)
	assert.Equal(t, []int64{0, 1}, []int64{got[0].res.Offset, got[2].res.Offset})
	var bodies []string
	for _, m := range fs.Messages("orders") {
		bodies = append(bodies, string(m.Body))
	}
	assert.Equal(t, []string{"a", "c"}, bodies)
	assert.Equal(t, ferry.ProducerStats{Sent: 2, Failed: 1}, p.Stats())

	// A ctx done already is an error at once.
	err := p.SendAsync(ctx, &ferry.Message{Topic: "orders"}, a.done(3))
	require.ErrorIs(t, err, context.Canceled)
}

// Close refuses new sends and a send waiting for room (ErrClosed), then
// flushes: it returns once every outstanding send is written and reported.
func TestSendAsyncClose(t *testing.T) {
	b, fs := fakeBroker(t, 2)
	g := newGate(fs)
	p, err := b.NewProducer(ferry.WithMaxInFlight(4), ferry.WithRouter(ferry.RoundRobinRouter()))
	require.NoError(t, err)
	var a acks
	for i := range 4 {
		require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, a.done(i)))
	}
	<-g.entered
	waiting := make(chan error, 1)
	go func() { waiting <- p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, nil) }()
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	require.ErrorIs(t, <-waiting, ferry.ErrClosed, "the send waiting for room")
	select {
	case <-closed:
		t.Fatal("Close returned with sends outstanding")
	default:
	}
	close(g.open)
	require.NoError(t, <-closed)
	got := a.all() // Close waited for every callback
	require.Len(t, got, 4)
	for _, g := range got {
		require.NoError(t, g.err)
	}
	assert.Len(t, fs.Messages("orders"), 4)
	require.ErrorIs(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, nil), ferry.ErrClosed)
	require.NoError(t, p.Close(), "idempotent")
	require.NoError(t, p.Flush(t.Context()))
}

// Sends outstanding when the broker and its storage close fail with
// ErrClosed, each reported once; none is dropped silently.
func TestSendAsyncBrokerClosed(t *testing.T) {
	fs := ferrytest.NewFakeStorage()
	t.Cleanup(func() { _ = fs.Close() })
	b, err := ferry.NewBroker(ferry.WithStorage(fs))
	require.NoError(t, err)
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}))
	g := newGate(fs)
	p, err := b.NewProducer()
	require.NoError(t, err)
	var a acks
	for i := range 10 {
		require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, a.done(i)))
	}
	n := <-g.entered
	require.NoError(t, b.Close())
	require.NoError(t, fs.Close())
	close(g.open)
	require.NoError(t, p.Close())
	got := a.all()
	require.Len(t, got, 10)
	for _, g := range got[n:] { // the first write was under way at the close
		require.ErrorIs(t, g.err, ferry.ErrClosed, "send %d (first write %d)", g.seq, n)
	}
}

// Bad input is an error from SendAsync itself, the callback never called.
func TestSendAsyncInvalid(t *testing.T) {
	b := newBroker(t, 1)
	p := newProducer(t, b, ferry.WithMaxMessageBytes(10))
	never := func(ferry.SendResult, error) { t.Error("callback of a refused send") }
	require.ErrorIs(t, p.SendAsync(t.Context(), nil, never), ferry.ErrInvalidMessage)
	require.ErrorIs(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "nope"}, never), ferry.ErrTopicNotFound)
	require.ErrorIs(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders", Body: make([]byte, 11)}, never), ferry.ErrMessageTooLarge)
	bad := newProducer(t, b, ferry.WithRouter(ferry.RouterFunc(func(*ferry.EnhancedMessage, ferry.TopicMeta) (int, error) { return 5, nil })))
	require.ErrorIs(t, bad.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, never), ferry.ErrInvalidRoute)
	require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, nil), "a nil callback")
	require.NoError(t, p.Flush(t.Context()))
	assert.Equal(t, int64(1), stored(t, b, "orders"))
	_, err := b.NewProducer(ferry.WithMaxInFlight(0))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}

// A callback may send again, synchronously or not, without deadlock.
func TestSendAsyncFromCallback(t *testing.T) {
	b, _ := fakeBroker(t, 1)
	p := newProducer(t, b, ferry.WithMaxInFlight(1))
	var a acks
	require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, func(ferry.SendResult, error) {
		_, err := p.Send(t.Context(), &ferry.Message{Topic: "orders"})
		assert.NoError(t, err)
		assert.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, a.done(1)))
	}))
	a.wait.Wait()
	require.NoError(t, p.Flush(t.Context()))
	assert.Equal(t, int64(3), stored(t, b, "orders"))
}

// Delayed messages go through the delay levels: the report says where
// each waits and where it goes, and consumers get it when due.
func TestSendAsyncDelayed(t *testing.T) {
	clock := ferrytest.NewFakeClock(time.Now())
	b, fs := ferrytest.NewFakeBroker(t, ferry.WithClock(clock))
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}))
	p := newProducer(t, b)
	var a acks
	due := clock.Now().Add(time.Minute)
	for i := range 5 {
		m := &ferry.Message{Topic: "orders", Body: []byte(strconv.Itoa(i)), DeliverAt: due}
		require.NoError(t, p.SendAsync(t.Context(), m, a.done(i)))
	}
	require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("now")}, a.done(5)))
	require.NoError(t, p.Flush(t.Context()))
	got := a.all()
	require.Len(t, got, 6)
	var delayed []ack
	for _, g := range got {
		require.NoError(t, g.err)
		if g.seq < 5 {
			delayed = append(delayed, g)
		}
	}
	for i, g := range delayed {
		assert.Equal(t, i, g.seq, "delayed sends acknowledged in send order")
		assert.True(t, ferry.IsDelayTopic(g.res.Queue.Topic), g.res.Queue.Topic)
		assert.Equal(t, ferry.QueueID{Topic: "orders"}, g.res.Target)
		assert.True(t, due.Equal(g.res.DeliverAt))
		if i > 0 {
			assert.Equal(t, delayed[i-1].res.Offset+1, g.res.Offset)
		}
	}
	assert.Len(t, fs.Messages("orders"), 1, "only the undelayed one is there yet")

	c, err := b.NewPullConsumer("g", "orders")
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Start(t.Context()))
	clock.Advance(2 * time.Minute)
	var bodies []string
	for len(bodies) < 6 {
		ms, err := c.Poll(t.Context(), 10)
		require.NoError(t, err)
		for _, m := range ms {
			bodies = append(bodies, string(m.Body))
		}
	}
	assert.ElementsMatch(t, []string{"now", "0", "1", "2", "3", "4"}, bodies)
}

// A failed write fails every send in it, with the store's error.
func TestSendAsyncWriteFails(t *testing.T) {
	b, fs := fakeBroker(t, 1)
	boom := errors.New("boom")
	fs.FailWrites(boom)
	p := newProducer(t, b)
	var a acks
	for i := range 5 {
		require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders"}, a.done(i)))
	}
	require.NoError(t, p.Flush(t.Context()))
	got := a.all()
	require.Len(t, got, 5)
	for _, g := range got {
		require.ErrorIs(t, g.err, boom)
		assert.Zero(t, g.res)
	}
	assert.Equal(t, uint64(5), p.Stats().Failed)
}

// The hooks see an asynchronous send as they see a Send: HookSend when it
// is stamped, HookSent with the write's outcome, before the callback.
func TestSendAsyncHooks(t *testing.T) {
	for _, store := range []string{"memory", "fake"} {
		t.Run(store, func(t *testing.T) {
			log := &recorder{}
			var b *ferry.Broker
			if store == "memory" {
				b = newBroker(t, 1, ferry.WithHooks(namedHook{"broker", log}))
			} else {
				fb, fs := ferrytest.NewFakeBroker(t, ferry.WithHooks(namedHook{"broker", log}))
				require.NoError(t, fb.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}))
				fs.FailNth(2, errors.New("boom"))
				b = fb
			}
			p := newProducer(t, b, ferry.WithProducerName("p"))
			var a acks
			require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("a")}, a.done(0)))
			require.NoError(t, p.Flush(t.Context()))
			require.NoError(t, p.SendAsync(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("b")}, a.done(1)))
			require.NoError(t, p.Flush(t.Context()))
			got := log.snapshot()
			require.Len(t, got, 4)
			assert.Equal(t, []string{"broker: send p a", "broker: sent p a <nil>", "broker: send p b"}, got[:3])
			if store == "memory" {
				assert.Equal(t, "broker: sent p b <nil>", got[3])
			} else {
				assert.Contains(t, got[3], "broker: sent p b")
				assert.Contains(t, got[3], "boom")
				assert.ErrorContains(t, a.all()[1].err, "boom")
			}
		})
	}
}
