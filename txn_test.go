package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// drainTopic reads every queue of topic from the start until it holds
// want messages (or fails the test after a few seconds), then returns
// them by body.
func drainTopic(t *testing.T, b *ferry.Broker, topic string, want int) map[string]int {
	t.Helper()
	ctx := context.Background()
	got := map[string]int{}
	var mu sync.Mutex
	n := 0
	c, err := b.NewConsumer("reader-"+topic, topic, ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		got[string(m.Body)]++
		n++
		return nil
	}), ferry.WithRetry(1, 0))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	require.Eventually(t, func() bool { // everything stored was read, extra ones included
		mu.Lock()
		read := n
		mu.Unlock()
		lag, err := b.Lag(ctx, "reader-"+topic, topic)
		return read >= want && err == nil && lag.Lag == 0
	}, 10*time.Second, time.Millisecond, "outputs in %s", topic)
	require.NoError(t, c.Close())
	mu.Lock()
	defer mu.Unlock()
	return got
}

// TestTransactionalOutputs: in every mode, a Transactional handler's
// outputs are stored once per message handled, those of a failed attempt
// (an error after sending, a panic, a dead letter) never.
func TestTransactionalOutputs(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered", "keyed"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			b, err := ferry.NewBroker()
			require.NoError(t, err)
			defer b.Close()
			require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "in", Queues: 2}))
			require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "out", Queues: 3}))
			require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "audit", Queues: 1}))
			const n = 60
			var mu sync.Mutex
			attempts := map[string]int{}
			var handled sync.WaitGroup
			handled.Add(n)
			h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
				ob := ferry.OutboxFrom(ctx)
				if ob == nil {
					return ferry.Permanent(errors.New("no outbox"))
				}
				body := string(m.Body)
				mu.Lock()
				attempts[body]++
				a := attempts[body]
				mu.Unlock()
				send := func(topic, what string) {
					require.NoError(t, ob.Send(&ferry.Message{Topic: topic, Key: m.Key, Body: fmt.Appendf(nil, "%s/%s/%d", body, what, a)}))
				}
				send("out", "a")
				send("audit", "b")
				i := 0
				fmt.Sscan(strings.TrimPrefix(body, "m"), &i)
				switch {
				case i%10 == 7:
					handled.Done()
					return ferry.Permanent(errors.New("poison")) // dead-lettered: no outputs
				case i%5 == 1 && a == 1:
					return errors.New("first attempt fails")
				case i%5 == 2 && a == 1:
					panic("first attempt panics")
				}
				handled.Done()
				return nil
			})
			opts := []ferry.ConsumerOption{ferry.Transactional(), ferry.WithRetry(4, time.Millisecond)}
			switch mode {
			case "ordered":
				opts = append(opts, ferry.Ordered())
			case "keyed":
				opts = append(opts, ferry.OrderedByKey(), ferry.WithConcurrency(4))
			}
			c, err := b.NewConsumer("g", "in", h, opts...)
			require.NoError(t, err)
			require.NoError(t, c.Start(ctx))
			defer c.Close()
			p, err := b.NewProducer()
			require.NoError(t, err)
			defer p.Close()
			for i := range n {
				_, err := p.Send(ctx, &ferry.Message{Topic: "in", Key: fmt.Sprint(i % 7), Body: fmt.Appendf(nil, "m%d", i)})
				require.NoError(t, err)
			}
			handled.Wait()
			require.NoError(t, c.Close())

			want := map[string]int{}
			wantAudit := map[string]int{}
			for i := range n {
				if i%10 == 7 {
					continue
				}
				a := 1
				if i%5 == 1 || i%5 == 2 {
					a = 2
				}
				want[fmt.Sprintf("m%d/a/%d", i, a)] = 1
				wantAudit[fmt.Sprintf("m%d/b/%d", i, a)] = 1
			}
			assert.Equal(t, want, drainTopic(t, b, "out", len(want)))
			assert.Equal(t, wantAudit, drainTopic(t, b, "audit", len(wantAudit)))
		})
	}
}

// TestOutboxBadInput: sends an outbox refuses, each with its error and
// nothing stored; options Transactional cannot be combined with.
func TestOutboxBadInput(t *testing.T) {
	ctx := context.Background()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	other, err := ferry.NewBroker()
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "out", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "nodedup", Queues: 1, DedupWindow: ferry.DedupOff}))
	require.NoError(t, other.CreateTopic(ctx, ferry.TopicMeta{Name: "out", Queues: 1}))
	op, err := other.NewProducer()
	require.NoError(t, err)
	defer op.Close()

	assert.ErrorIs(t, ferry.OutboxFrom(ctx).Send(&ferry.Message{Topic: "out"}), ferry.ErrInvalidOption, "no outbox outside a transactional call")
	var nilCtx context.Context // a nil context is bad input
	assert.Nil(t, ferry.OutboxFrom(nilCtx))
	assert.Zero(t, ferry.OutboxFrom(ctx).Len())

	kept := make(chan *ferry.Outbox, 1)
	errs := make(chan map[string]error, 1)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		ob := ferry.OutboxFrom(ctx)
		got := map[string]error{
			"nil message":   ob.Send(nil),
			"unknown topic": ob.Send(&ferry.Message{Topic: "nope"}),
			"invalid topic": ob.Send(&ferry.Message{Topic: "a/b"}),
			"system topic":  ob.Send(&ferry.Message{Topic: "%DLQ%g"}),
			"no dedup":      ob.Send(&ferry.Message{Topic: "nodedup"}),
			"too large":     ob.Send(&ferry.Message{Topic: "out", Body: make([]byte, ferry.DefaultMaxMessageBytes+1)}),
			"nil producer":  ob.SendVia(nil, &ferry.Message{Topic: "out"}),
			"other broker":  ob.SendVia(op, &ferry.Message{Topic: "out"}),
		}
		for range 3 {
			if err := ob.Send(&ferry.Message{Topic: "out", Body: make([]byte, ferry.DefaultMaxMessageBytes/3+1)}); err != nil {
				got["outbox full"] = err
			}
		}
		errs <- got
		kept <- ob
		return nil
	})
	c, err := b.NewConsumer("g", "in", h, ferry.Transactional())
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "in", Body: []byte("x")})
	require.NoError(t, err)
	got := <-errs
	for what, want := range map[string]error{
		"nil message": ferry.ErrInvalidMessage, "unknown topic": ferry.ErrTopicNotFound, "invalid topic": ferry.ErrInvalidTopic,
		"system topic": ferry.ErrInvalidTopic, "no dedup": ferry.ErrInvalidOption, "too large": ferry.ErrMessageTooLarge,
		"nil producer": ferry.ErrInvalidOption, "other broker": ferry.ErrInvalidOption, "outbox full": ferry.ErrMessageTooLarge,
	} {
		assert.ErrorIs(t, got[what], want, what)
	}
	ob := <-kept
	require.Eventually(t, func() bool { return ob.Send(&ferry.Message{Topic: "out"}) != nil }, 5*time.Second, time.Millisecond)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // from another goroutine, after the call
		defer wg.Done()
		assert.ErrorIs(t, ob.Send(&ferry.Message{Topic: "out", Body: []byte("late")}), ferry.ErrOutboxDone)
	}()
	wg.Wait()
	require.NoError(t, c.Close())
	// Two outputs were accepted (the third overflowed); nothing else.
	outs := drainTopic(t, b, "out", 2)
	assert.Len(t, outs, 1)
	for body, n := range outs {
		assert.Equal(t, ferry.DefaultMaxMessageBytes/3+1, len(body))
		assert.Equal(t, 2, n)
	}

	for name, opts := range map[string][]ferry.ConsumerOption{
		"broadcast": {ferry.Transactional(), ferry.Broadcast()},
	} {
		_, err := b.NewConsumer("g2", "in", h, opts...)
		assert.ErrorIs(t, err, ferry.ErrInvalidOption, name)
	}
	_, err = b.NewConsumer("g2", "in", ferry.Batch(ferry.BatchHandlerFunc(func(context.Context, []*ferry.EnhancedMessage) error { return nil }), 8), ferry.Transactional())
	assert.ErrorIs(t, err, ferry.ErrInvalidOption, "batch")
}

// outboxHooks records the producer hooks' events of outputs.
type outboxHooks struct {
	mu   sync.Mutex
	sent map[*ferry.EnhancedMessage]*hookedOutput
}

type hookedOutput struct {
	body       string
	errs       []error // one per OnSent
	queue      int
	offset     int64
	storedNano int64
}

func (h *outboxHooks) OnSend(_ context.Context, em *ferry.EnhancedMessage) {
	if em.Topic != "out" && em.Topic != "nodedup" {
		return // inputs, retries
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sent[em] = &hookedOutput{body: string(em.Body)}
}

func (h *outboxHooks) OnSent(_ context.Context, em *ferry.EnhancedMessage, err error) {
	if em.Topic != "out" && em.Topic != "nodedup" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.sent[em]
	if o == nil {
		o = &hookedOutput{body: "no OnSend: " + string(em.Body)}
		h.sent[em] = o
	}
	o.errs = append(o.errs, err)
	o.queue, o.offset, o.storedNano = em.Queue, em.Offset, em.StoreUnixNano
}

// TestTransactionalHooks: the producer hooks see every output an outbox
// took (OnSend when it is sent), then once OnSent: with no error and
// its queue, offset and store time once it is written; with an error
// when it is refused at once, or dropped with its failed call.
func TestTransactionalHooks(t *testing.T) {
	ctx := context.Background()
	hooks := &outboxHooks{sent: map[*ferry.EnhancedMessage]*hookedOutput{}}
	b, err := ferry.NewBroker(ferry.WithHooks(hooks))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "out", Queues: 2}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "nodedup", Queues: 1, DedupWindow: ferry.DedupOff}))
	var handled sync.WaitGroup
	handled.Add(3)
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		ob := ferry.OutboxFrom(ctx)
		for k := range 2 {
			if err := ob.Send(&ferry.Message{Topic: "out", Key: fmt.Sprint(k), Body: fmt.Appendf(nil, "%s/%d/%d", m.Body, k, d.Attempt)}); err != nil {
				return err
			}
		}
		assert.ErrorIs(t, ob.Send(&ferry.Message{Topic: "nodedup", Body: fmt.Appendf(nil, "%s/refused/%d", m.Body, d.Attempt)}), ferry.ErrInvalidOption)
		if string(m.Body) == "fails" && d.Attempt == 1 {
			return errors.New("the first call fails after sending")
		}
		handled.Done()
		return nil
	})
	c, err := b.NewConsumer("g", "in", h, ferry.Transactional(), ferry.WithRetry(3, time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for _, body := range []string{"a", "b", "fails"} {
		_, err := p.Send(ctx, &ferry.Message{Topic: "in", Body: []byte(body)})
		require.NoError(t, err)
	}
	handled.Wait()
	require.Eventually(t, func() bool {
		lag, err := b.Lag(ctx, "g", "in")
		return err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, c.Close())

	stored := map[string]ferry.EnhancedMessage{} // body → where it is
	for q := range 2 {
		rq, err := b.Queue("out", q)
		require.NoError(t, err)
		oldest, next := rq.Offsets()
		dst := make([]*ferry.EnhancedMessage, 16)
		for off := oldest; off < next; {
			n, err := rq.Read(ctx, off, dst)
			require.NoError(t, err)
			for _, m := range dst[:n] {
				require.NotContains(t, stored, string(m.Body), "stored once")
				stored[string(m.Body)] = *m
				off = m.Offset + 1
			}
		}
	}
	require.Len(t, stored, 6, "2 outputs of a, b and the second call of fails")

	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	seen := map[string]bool{}
	for _, o := range hooks.sent {
		require.Len(t, o.errs, 1, "%s: one OnSent after its OnSend", o.body)
		seen[o.body] = true
		m, ok := stored[o.body]
		switch {
		case strings.Contains(o.body, "/refused/"):
			assert.ErrorIs(t, o.errs[0], ferry.ErrInvalidOption, o.body)
		case strings.HasPrefix(o.body, "fails/") && strings.HasSuffix(o.body, "/1"):
			assert.Error(t, o.errs[0], "%s: its call failed", o.body)
			assert.False(t, ok, "%s: stored", o.body)
		default:
			require.NoError(t, o.errs[0], o.body)
			require.True(t, ok, "%s: not stored", o.body)
			assert.Equal(t, m.Queue, o.queue, "%s: queue", o.body)
			assert.Equal(t, m.Offset, o.offset, "%s: offset", o.body)
			assert.Equal(t, m.StoreUnixNano, o.storedNano, "%s: store time", o.body)
		}
	}
	for body := range stored {
		assert.True(t, seen[body], "%s: stored with no OnSend", body)
	}
	assert.Len(t, hooks.sent, 6+2+4, "the stored outputs, the failed call's, the refused ones")
}
