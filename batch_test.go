package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// TestBatchHandler: a batch handler gets several messages of one queue
// per call, in offset order, at most max; a BatchError fails only the
// messages it names, each then retried (and, failing for good,
// dead-lettered) as alone; with Ordered the handler sees the queue's
// messages in order, a failed one again before any later one is first
// finished.
func TestBatchHandler(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered"} {
		t.Run(mode, func(t *testing.T) {
			b := newTopic(t, 1)
			const n, max = 300, 32
			var mu sync.Mutex
			sizes := map[int]int{}
			seen := map[string]int{}
			var order []int
			orderOK := true
			h := ferry.Batch(ferry.BatchHandlerFunc(func(ctx context.Context, msgs []*ferry.EnhancedMessage) error {
				mu.Lock()
				defer mu.Unlock()
				sizes[len(msgs)]++
				failed := map[int]error{}
				d, _ := ferry.DeliveryFrom(ctx)
				for i, m := range msgs {
					// A batch of retries (from the retry topic) is in its
					// order there; first attempts in their queue's.
					if d.Attempt == 1 && i > 0 && m.Offset <= msgs[i-1].Offset {
						orderOK = false
					}
					body := string(m.Body)
					seen[body]++
					order = append(order, int(m.Offset))
					v, _ := strconv.Atoi(body)
					switch {
					case v == 7: // always fails: dead-lettered
						failed[i] = errors.New("poison")
					case v%50 == 3 && seen[body] == 1: // fails once
						failed[i] = errors.New("once")
					}
				}
				if len(failed) > 0 {
					return &ferry.BatchError{Failed: failed}
				}
				return nil
			}), max)
			opts := []ferry.ConsumerOption{ferry.WithRetry(3, time.Millisecond)}
			if mode == "ordered" {
				opts = append(opts, ferry.Ordered())
			}
			p := newProducer(t, b)
			msgs := make([]*ferry.Message, n)
			for i := range msgs {
				msgs[i] = &ferry.Message{Topic: "t", Body: []byte(strconv.Itoa(i))}
			}
			_, err := p.SendBatch(t.Context(), msgs)
			require.NoError(t, err)
			c, err := b.NewConsumer("g", "t", h, append(opts, ferry.WithStartFrom(ferry.Earliest))...)
			require.NoError(t, err)
			require.NoError(t, c.Start(t.Context()))
			defer c.Close()
			ferrytest.WaitFor(t, 20*time.Second, "every message finished", func() bool {
				lag, err := b.Lag(t.Context(), "g", "t")
				return err == nil && lag.Lag == 0 && c.Stats().DeadLettered == 1
			}, nil)
			require.NoError(t, c.Close())
			mu.Lock()
			defer mu.Unlock()
			assert.True(t, orderOK, "each batch in offset order")
			big := 0
			for size, k := range sizes {
				assert.LessOrEqual(t, size, max)
				if size > 1 {
					big += k
				}
			}
			assert.Positive(t, big, "batches of more than one message: %v", sizes)
			for i := range n {
				body := strconv.Itoa(i)
				switch {
				case i == 7 && mode == "concurrent":
					assert.Equal(t, 3, seen[body], "the poison message: three attempts")
				case i == 7:
					// Three attempts, and once handed over behind 3's
					// failure in the same batch (seen, not attempted).
					assert.Equal(t, 4, seen[body], "the poison message")
				case i%50 == 3:
					assert.GreaterOrEqual(t, seen[body], 2, "failed once, retried")
				case mode == "concurrent":
					assert.Equal(t, 1, seen[body], "message %d handled once", i)
				default:
					assert.GreaterOrEqual(t, seen[body], 1, "message %d", i)
				}
			}
			if mode == "ordered" {
				// First handlings in offset order.
				first := map[int]bool{}
				last := -1
				for _, off := range order {
					if first[off] {
						continue
					}
					first[off] = true
					assert.Greater(t, off, last, "first handlings in offset order")
					last = off
				}
			}
		})
	}
}

// TestBatchHandlerBadInput: a max below 1, and a nil batch handler.
func TestBatchHandlerBadInput(t *testing.T) {
	b := newTopic(t, 1)
	h := ferry.BatchHandlerFunc(func(context.Context, []*ferry.EnhancedMessage) error { return nil })
	_, err := b.NewConsumer("g", "t", ferry.Batch(h, 0))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewConsumer("g", "t", ferry.Batch(nil, 4))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
}

// TestBatchLinger: with a linger, messages that arrive one by one wait
// for each other up to it and go as one batch; a lone message goes when
// its linger is over.
func TestBatchLinger(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered"} {
		t.Run(mode, func(t *testing.T) {
			b := newTopic(t, 1)
			var mu sync.Mutex
			var sizes []int
			got := make(chan time.Time, 16)
			h := ferry.BatchLinger(ferry.BatchHandlerFunc(func(ctx context.Context, msgs []*ferry.EnhancedMessage) error {
				mu.Lock()
				sizes = append(sizes, len(msgs))
				mu.Unlock()
				got <- time.Now()
				return nil
			}), 64, 300*time.Millisecond)
			var opts []ferry.ConsumerOption
			if mode == "ordered" {
				opts = append(opts, ferry.Ordered())
			}
			startConsumer(t, b, "g", h, opts...)
			p := newProducer(t, b)
			for range 8 {
				_, err := p.Send(t.Context(), &ferry.Message{Topic: "t", Body: []byte("m")})
				require.NoError(t, err)
				time.Sleep(5 * time.Millisecond)
			}
			<-got
			mu.Lock()
			first := sizes[0]
			mu.Unlock()
			assert.Equal(t, 8, first, "eight messages 5 ms apart in one batch")

			sent := time.Now()
			_, err := p.Send(t.Context(), &ferry.Message{Topic: "t", Body: []byte("alone")})
			require.NoError(t, err)
			select {
			case at := <-got:
				assert.GreaterOrEqual(t, at.Sub(sent), 250*time.Millisecond, "a lone message waits for its linger")
			case <-time.After(10 * time.Second):
				t.Fatal("a lone message never went")
			}
			_, err = b.NewConsumer("g2", "t", ferry.BatchLinger(ferry.BatchHandlerFunc(func(context.Context, []*ferry.EnhancedMessage) error { return nil }), 4, -1))
			require.ErrorIs(t, err, ferry.ErrInvalidOption)
		})
	}
}

// spanHook marks each message's handling context and checks that
// OnHandled gets that message's own.
type spanHook struct {
	mu      sync.Mutex
	begun   map[int64]bool
	matched int
	wrong   int
}

type batchSpanKey struct{}

func (h *spanHook) OnHandle(ctx context.Context, m *ferry.EnhancedMessage) context.Context {
	h.mu.Lock()
	h.begun[m.Offset] = true
	h.mu.Unlock()
	return context.WithValue(ctx, batchSpanKey{}, m.Offset)
}

func (h *spanHook) OnHandled(ctx context.Context, m *ferry.EnhancedMessage, _ time.Duration, _ error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if off, ok := ctx.Value(batchSpanKey{}).(int64); ok && off == m.Offset {
		h.matched++
	} else {
		h.wrong++
	}
}

// TestBatchHooks: a batch call runs each message through the handling
// hooks with a context of its own (a tracing span each), and OnHandled
// gets that message's context back.
func TestBatchHooks(t *testing.T) {
	hook := &spanHook{begun: map[int64]bool{}}
	b := newTopic(t, 1)
	p := newProducer(t, b)
	msgs := make([]*ferry.Message, 20)
	for i := range msgs {
		msgs[i] = &ferry.Message{Topic: "t", Body: []byte("m")}
	}
	_, err := p.SendBatch(t.Context(), msgs)
	require.NoError(t, err)
	h := ferry.Batch(ferry.BatchHandlerFunc(func(context.Context, []*ferry.EnhancedMessage) error { return nil }), 8)
	c, err := b.NewConsumer("g", "t", h, ferry.WithStartFrom(ferry.Earliest), ferry.WithConsumerHooks(hook))
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	defer c.Close()
	ferrytest.WaitFor(t, 10*time.Second, "every message through the hooks", func() bool {
		hook.mu.Lock()
		defer hook.mu.Unlock()
		return hook.matched+hook.wrong == 20
	}, nil)
	hook.mu.Lock()
	defer hook.mu.Unlock()
	assert.Len(t, hook.begun, 20)
	assert.Equal(t, 20, hook.matched)
	assert.Zero(t, hook.wrong, "OnHandled got another message's context")
}
