package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is a hook of every kind that records the events in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

type spanKey struct{}

func (r *recorder) OnSend(_ context.Context, em *ferry.EnhancedMessage) {
	r.add("send %s %s", em.Topic, em.Body)
}
func (r *recorder) OnSent(_ context.Context, em *ferry.EnhancedMessage, err error) {
	r.add("sent %s %s %d %v", em.Topic, em.Body, em.Offset, err)
}
func (r *recorder) OnHandle(ctx context.Context, m *ferry.EnhancedMessage) context.Context {
	d, _ := ferry.DeliveryFrom(ctx)
	r.add("handle %s #%d", m.Body, d.Attempt)
	return context.WithValue(ctx, spanKey{}, "span-"+string(m.Body))
}
func (r *recorder) OnHandled(ctx context.Context, m *ferry.EnhancedMessage, took time.Duration, err error) {
	r.add("handled %s %v span=%v", m.Body, err != nil, ctx.Value(spanKey{}))
}
func (r *recorder) OnCommitted(e ferry.CommitEvent) {
	r.add("committed %s %s %d %v", e.Group, e.Queue, e.Offset, e.Err)
}
func (r *recorder) OnDeadLettered(m *ferry.EnhancedMessage, dl ferry.SendResult, attempts int, cause error) {
	r.add("dead-lettered %s to %s attempts %d", m.Body, dl.Queue, attempts)
}
func (r *recorder) OnRebalanced(group, member string, q ferry.QueueID, assigned bool) {
	r.add("rebalanced %s %s %v", group, q, assigned)
}
func (r *recorder) OnReset(group string, q ferry.QueueID, from, to int64) {
	r.add("reset %s %s %d %d", group, q, from, to)
}

// A scripted run: every event reaches the hooks, in order.
func TestHooksSeeEveryEvent(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	b, err := ferry.NewBroker(ferry.WithHooks(rec))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "%DLQ%g", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("ok")})
	require.NoError(t, err)
	_, err = p.SendBatch(ctx, []*ferry.Message{{Topic: "t", Body: []byte("flaky")}, {Topic: "t", Body: []byte("poison")}})
	require.NoError(t, err)
	_, err = p.Send(ctx, &ferry.Message{Topic: "nope", Body: []byte("x")})
	require.Error(t, err)

	done := make(chan struct{}, 3)
	var spans sync.Map
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		spans.Store(string(m.Body), ctx.Value(spanKey{}))
		d, _ := ferry.DeliveryFrom(ctx)
		switch {
		case string(m.Body) == "flaky" && d.Attempt == 1:
			return errors.New("once")
		case string(m.Body) == "poison":
			defer func() { done <- struct{}{} }()
			return ferry.Permanent(errors.New("never"))
		}
		done <- struct{}{}
		return nil
	}), ferry.WithRetry(2, time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	for range 3 {
		<-done
	}
	require.Eventually(t, func() bool { return slices.Contains(rec.snapshot(), "committed g t[0] 3 <nil>") }, watchdog, time.Millisecond)
	require.NoError(t, c.Close())

	ev := rec.snapshot()
	idx := func(e string) int {
		i := slices.Index(ev, e)
		require.GreaterOrEqual(t, i, 0, "missing %q in %q", e, ev)
		return i
	}
	before := func(a, b string) { assert.Less(t, idx(a), idx(b), "%q before %q", a, b) }
	before("send t ok", "sent t ok 0 <nil>")
	before("send t flaky", "send t poison")
	before("sent t flaky 1 <nil>", "sent t poison 2 <nil>")
	for _, e := range ev {
		assert.NotContains(t, e, "nope", "a message refused before it is stamped is not sent")
	}
	before("rebalanced g t[0] true", "handle ok #1")
	before("handle ok #1", "handled ok false span=span-ok")
	before("handle flaky #1", "handled flaky true span=span-flaky")
	before("handled flaky true span=span-flaky", "handle flaky #2")
	before("handle flaky #2", "handled flaky false span=span-flaky")
	before("handled poison true span=span-poison", "send %DLQ%g poison")
	before("sent %DLQ%g poison 0 <nil>", "dead-lettered poison to %DLQ%g[0] attempts 1")
	before("dead-lettered poison to %DLQ%g[0] attempts 1", "committed g t[0] 3 <nil>")
	before("committed g t[0] 3 <nil>", "rebalanced g t[0] false")
	v, _ := spans.Load("ok")
	assert.Equal(t, "span-ok", v, "the handler got the context OnHandle returned")
}

// namedHook records the sends it sees, under its name, in a log it
// shares with other hooks, so the order between hooks shows.
type namedHook struct {
	name string
	log  *recorder
}

func (h namedHook) OnSend(_ context.Context, em *ferry.EnhancedMessage) {
	h.log.add("%s: send %s %s", h.name, em.ProducerName(), em.Body)
}

func (h namedHook) OnSent(_ context.Context, em *ferry.EnhancedMessage, err error) {
	h.log.add("%s: sent %s %s %v", h.name, em.ProducerName(), em.Body, err)
}

// A producer's own hooks see that producer's sends only, the broker's
// hooks every producer's; for each event the broker's run first, then
// the producer's in the order given; Send and SendBatch alike.
func TestProducerHooks(t *testing.T) {
	ctx := context.Background()
	log := &recorder{}
	b := newBroker(t, 1, ferry.WithHooks(namedHook{"broker", log}))
	p1 := newProducer(t, b, ferry.WithProducerName("p1"),
		ferry.WithProducerHooks(namedHook{"p1 first", log}, nil, namedHook{"p1 second", log}))
	p2 := newProducer(t, b, ferry.WithProducerName("p2"))

	_, err := p1.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("a")})
	require.NoError(t, err)
	_, err = p2.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("b")})
	require.NoError(t, err)
	_, err = p1.SendBatch(ctx, []*ferry.Message{{Topic: "orders", Body: []byte("c")}, {Topic: "orders", Body: []byte("d")}})
	require.NoError(t, err)
	_, err = p1.Send(ctx, &ferry.Message{Topic: "nope", Body: []byte("refused")})
	require.Error(t, err)

	assert.Equal(t, []string{
		"broker: send p1 a", "p1 first: send p1 a", "p1 second: send p1 a",
		"broker: sent p1 a <nil>", "p1 first: sent p1 a <nil>", "p1 second: sent p1 a <nil>",
		"broker: send p2 b",
		"broker: sent p2 b <nil>",
		"broker: send p1 c", "p1 first: send p1 c", "p1 second: send p1 c",
		"broker: send p1 d", "p1 first: send p1 d", "p1 second: send p1 d",
		"broker: sent p1 c <nil>", "p1 first: sent p1 c <nil>", "p1 second: sent p1 c <nil>",
		"broker: sent p1 d <nil>", "p1 first: sent p1 d <nil>", "p1 second: sent p1 d <nil>",
	}, log.snapshot())
}

// countingHook counts handled messages; noopHook does nothing.
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) OnHandled(context.Context, *ferry.EnhancedMessage, time.Duration, error) {
	h.n.Add(1)
}

type noopHook struct{}

func (noopHook) OnHandled(context.Context, *ferry.EnhancedMessage, time.Duration, error) {}
func (noopHook) OnSent(context.Context, *ferry.EnhancedMessage, error)                   {}

// BenchmarkHooks is W1 (one producer, one consumer, one queue) with no
// hook, a no-op hook and a counting hook.
func BenchmarkHooks(b *testing.B) {
	for _, tc := range []struct {
		name  string
		hooks []ferry.Hook
	}{{"none", nil}, {"noop", []ferry.Hook{noopHook{}}}, {"counting", []ferry.Hook{&countingHook{}}}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			br, err := ferry.NewBroker(ferry.WithHooks(tc.hooks...))
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1,
				Retention: ferry.Retention{MaxMessages: 1 << 16, Overflow: ferry.Block}}); err != nil {
				b.Fatal(err)
			}
			var got atomic.Int64
			all := make(chan struct{})
			n := int64(b.N)
			c, err := br.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
				if got.Add(1) == n {
					close(all)
				}
				return nil
			}))
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			p, err := br.NewProducer()
			if err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 100)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: body}); err != nil {
					b.Fatal(err)
				}
			}
			<-all
		})
	}
}
