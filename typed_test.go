package ferry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// order is the value the typed tests send.
type order struct {
	ID    int     `json:"id"`
	Item  string  `json:"item"`
	Price float64 `json:"price"`
}

// typedGot is what a typed handler was called with.
type typedGot struct {
	v       order
	key     string
	tag     string
	headers map[string]string
	queue   ferry.QueueID
	attempt int
}

// typedLog records a typed handler's calls.
type typedLog struct {
	mu   sync.Mutex
	got  []typedGot
	wake chan struct{}
}

func newTypedLog() *typedLog { return &typedLog{wake: make(chan struct{}, 1)} }

func (l *typedLog) handle(ctx context.Context, v order, m *ferry.EnhancedMessage) error {
	d, _ := ferry.DeliveryFrom(ctx)
	l.mu.Lock()
	l.got = append(l.got, typedGot{v: v, key: m.Key, tag: m.Tag, headers: m.Headers, queue: m.QueueID(), attempt: d.Attempt})
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

func (l *typedLog) calls() []typedGot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]typedGot(nil), l.got...)
}

func (l *typedLog) count() int { return len(l.calls()) }

// next offsets of every queue of topic, summed: what was written.
func written(t *testing.T, b *ferry.Broker, topic string, queues int) int64 {
	t.Helper()
	var n int64
	for i := range queues {
		q, err := b.Queue(topic, i)
		require.NoError(t, err)
		_, next := q.Offsets()
		n += next
	}
	return n
}

// A typed producer's values reach a typed handler as they were sent, with
// the key (on the queue its result names), tag and headers, on memory and
// filestore, through Send, SendBatch and SendAsync; a repeated DedupKey is
// stored once.
func TestTypedRoundTrip(t *testing.T) {
	for name, open := range adminBackends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			b := open(t)
			p, err := b.NewProducer()
			require.NoError(t, err)
			defer p.Close()
			tp, err := ferry.NewTypedProducer[order](p)
			require.NoError(t, err)
			assert.Same(t, p, tp.Producer())

			log := newTypedLog()
			startConsumer(t, b, "g", ferry.TypedHandler(log.handle))

			want := map[int]typedGot{}
			sent := func(m *ferry.TypedMessage[order], res ferry.SendResult) {
				want[m.Value.ID] = typedGot{v: m.Value, key: m.Key, tag: m.Tag, headers: m.Headers, queue: res.Queue, attempt: 1}
			}
			msg := func(i int) *ferry.TypedMessage[order] {
				return &ferry.TypedMessage[order]{Topic: "t", Key: "c" + strconv.Itoa(i%4), Tag: "new",
					Headers: map[string]string{"n": strconv.Itoa(i)}, Value: order{ID: i, Item: "item" + strconv.Itoa(i), Price: float64(i) / 4}}
			}
			for i := range 10 {
				m := msg(i)
				res, err := tp.Send(ctx, m)
				require.NoError(t, err)
				sent(m, res)
			}
			var batch []*ferry.TypedMessage[order]
			for i := 10; i < 20; i++ {
				batch = append(batch, msg(i))
			}
			results, err := tp.SendBatch(ctx, batch)
			require.NoError(t, err)
			require.Len(t, results, len(batch))
			for i, m := range batch {
				sent(m, results[i])
			}
			var mu sync.Mutex
			for i := 20; i < 30; i++ {
				m := msg(i)
				require.NoError(t, tp.SendAsync(ctx, m, func(res ferry.SendResult, err error) {
					assert.NoError(t, err)
					mu.Lock()
					sent(m, res)
					mu.Unlock()
				}))
			}
			require.NoError(t, p.Flush(ctx))
			m := msg(30)
			m.DedupKey = "order-30"
			first, err := tp.Send(ctx, m)
			require.NoError(t, err)
			sent(m, first)
			again, err := tp.Send(ctx, m)
			require.NoError(t, err)
			assert.True(t, again.Duplicate, "the same DedupKey again is not stored")
			assert.Equal(t, first.Offset, again.Offset)

			ferrytest.WaitFor(t, 0, "every value", func() bool { return log.count() >= len(want) }, log.wake)
			got := log.calls()
			require.Len(t, got, len(want), "each once")
			for _, g := range got {
				assert.Equal(t, want[g.v.ID], g, "order %d", g.v.ID)
			}
		})
	}
}

// A delayed typed message arrives at its due time, on a fake clock, with
// its SendResult saying when.
func TestTypedDelay(t *testing.T) {
	start := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	clock := ferrytest.NewFakeClock(start)
	b := newTopic(t, 2, ferry.WithClock(clock))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	tp, err := ferry.NewTypedProducer[order](p)
	require.NoError(t, err)
	var at []time.Time
	log := newTypedLog()
	startConsumer(t, b, "g", ferry.TypedHandler(func(ctx context.Context, v order, m *ferry.EnhancedMessage) error {
		at = append(at, clock.Now()) // one message: no race
		return log.handle(ctx, v, m)
	}))

	due := start.Add(90 * time.Minute)
	res, err := tp.Send(t.Context(), &ferry.TypedMessage[order]{Topic: "t", Key: "k", Value: order{ID: 7, Item: "later"}, DeliverAt: due})
	require.NoError(t, err)
	assert.True(t, res.DeliverAt.Equal(due))
	assert.Equal(t, "t", res.Target.Topic)
	assert.Zero(t, log.count(), "not before its time")

	runClock(t, clock, "the delayed value", func() bool { return log.count() == 1 }, log.wake)
	got := log.calls()[0]
	assert.Equal(t, order{ID: 7, Item: "later"}, got.v)
	assert.Equal(t, res.Target, got.queue)
	assert.False(t, at[0].Before(due), "delivered at %v, due %v", at[0], due)
}

// A body that does not decode (not JSON, or JSON null for a pointer type)
// is dead-lettered at once, its decode error in HeaderError, and the
// handler is never called with it; the good messages around it flow. In
// every mode: off-queue retries (the default), in place (Ordered,
// OrderedByKey, Broadcast).
func TestTypedDecodeFailureDeadLettered(t *testing.T) {
	for name, opts := range map[string][]ferry.ConsumerOption{
		"concurrent":   nil,
		"Ordered":      {ferry.Ordered()},
		"OrderedByKey": {ferry.OrderedByKey()},
		"Broadcast":    {ferry.Broadcast()},
	} {
		t.Run(name, func(t *testing.T) { testTypedDecodeFailure(t, opts) })
	}
}

func testTypedDecodeFailure(t *testing.T, opts []ferry.ConsumerOption) {
	ctx := t.Context()
	b := newTopic(t, 1)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	var mu sync.Mutex
	var got []int
	wake := make(chan struct{}, 1)
	opts = append(opts, ferry.WithRetry(5, time.Hour)) // a retry would never come back in time
	c := startConsumer(t, b, "g", ferry.TypedHandler(func(ctx context.Context, v *order, m *ferry.EnhancedMessage) error {
		mu.Lock()
		got = append(got, v.ID) // never nil: a nil value is a decode failure
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
		return nil
	}), opts...)

	for _, body := range []string{`{"id":1}`, `not json`, `null`, `{"id":"two"}`, `{"id":5}`} {
		_, err := p.Send(ctx, &ferry.Message{Topic: "t", Key: "k", Body: []byte(body)})
		require.NoError(t, err)
	}
	ferrytest.WaitFor(t, 0, "three dead letters", func() bool { return c.Stats().DeadLettered == 3 }, nil)
	ferrytest.WaitFor(t, 0, "the good ones", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 }, wake)
	mu.Lock()
	slices.Sort(got)
	assert.Equal(t, []int{1, 5}, got)
	mu.Unlock()

	dl := deadLetters(t, b, "%DLQ%g")
	require.Len(t, dl, 3)
	slices.SortFunc(dl, func(a, b *ferry.EnhancedMessage) int {
		return strings.Compare(a.Headers[ferry.HeaderOriginOffset], b.Headers[ferry.HeaderOriginOffset])
	})
	const codec = "ferry.JSONCodec[*github.com/ferrymq/ferry_test.order]"
	for i, want := range []struct{ body, offset, err string }{
		{`not json`, "1", "ferry: decode t[0] offset 1 with " + codec + ": invalid message: invalid character 'o' in literal null (expecting 'u')"},
		{`null`, "2", "ferry: decode t[0] offset 2 with " + codec + `: invalid message: body "null" decodes to a nil *ferry_test.order`},
		{`{"id":"two"}`, "3", "ferry: decode t[0] offset 3 with " + codec + ": invalid message: json: cannot unmarshal string into Go struct field order.id of type int"},
	} {
		m := dl[i]
		assert.Equal(t, want.body, string(m.Body))
		assert.Equal(t, want.offset, m.Headers[ferry.HeaderOriginOffset])
		assert.Equal(t, "1", m.Headers[ferry.HeaderAttempts], "no retries")
		assert.Equal(t, want.err, m.Headers[ferry.HeaderError])
	}
	assert.Zero(t, c.Stats().Retried)
}

// brokenCodec fails or panics as told.
type brokenCodec struct{ panics bool }

func (c brokenCodec) Encode(v order) ([]byte, error) {
	if c.panics {
		panic("encoder bug")
	}
	return nil, errors.New("cannot encode")
}

func (c brokenCodec) Decode(body []byte) (order, error) {
	if c.panics {
		panic("decoder bug")
	}
	return order{}, errors.New("cannot decode")
}

// The handler's decode error: permanent, ErrInvalidMessage, the codec's
// own error in the chain; a panicking codec is a decode error too, and
// f's own errors pass through unchanged.
func TestTypedHandlerErrors(t *testing.T) {
	ctx := t.Context()
	m := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Body: []byte(`{"id":`)}, Queue: 2, Offset: 9}
	called := false
	h := ferry.TypedHandler(func(context.Context, order, *ferry.EnhancedMessage) error { called = true; return nil })
	err := h.Handle(ctx, m)
	assert.True(t, ferry.IsPermanent(err))
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	var syn *json.SyntaxError
	assert.ErrorAs(t, err, &syn, "the codec's error is in the chain")
	var fe *ferry.Error
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "decode t[2] offset 9 with ferry.JSONCodec[github.com/ferrymq/ferry_test.order]", fe.Op)
	assert.False(t, called)

	for _, c := range []brokenCodec{{}, {panics: true}} {
		h := ferry.TypedHandler(func(context.Context, order, *ferry.EnhancedMessage) error { called = true; return nil }, ferry.WithBodyCodec[order](c))
		err := h.Handle(ctx, m)
		assert.True(t, ferry.IsPermanent(err))
		assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
		if c.panics {
			assert.ErrorContains(t, err, "codec panicked: decoder bug")
		} else {
			assert.ErrorContains(t, err, "cannot decode")
		}
		assert.False(t, called)
	}

	boom := errors.New("boom")
	h = ferry.TypedHandler(func(context.Context, order, *ferry.EnhancedMessage) error { return ferry.RetryAfter(boom, time.Second) })
	err = h.Handle(ctx, &ferry.EnhancedMessage{Message: ferry.Message{Body: []byte(`{}`)}})
	assert.ErrorIs(t, err, boom)
	assert.False(t, ferry.IsPermanent(err))
	assert.Equal(t, "boom", err.Error(), "the handler's error as it returned it")
}

// Bad input to the typed wrappers: an error wrapping the sentinel,
// nothing sent, no callback, no panic.
func TestTypedBadInput(t *testing.T) {
	ctx := t.Context()
	b := newTopic(t, 1)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()

	_, err = ferry.NewTypedProducer[order](nil)
	assert.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = ferry.NewTypedPullConsumer[order](nil)
	assert.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = b.NewConsumer("g", "t", ferry.TypedHandler[order](nil))
	assert.ErrorIs(t, err, ferry.ErrInvalidOption, "a nil func is a nil handler")

	tp, err := ferry.NewTypedProducer(p, ferry.WithBodyCodec[order](nil)) // nil: the default
	require.NoError(t, err)
	nan := &ferry.TypedMessage[order]{Topic: "t", Value: order{Price: math.NaN()}}
	_, err = tp.Send(ctx, nan)
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	var uv *json.UnsupportedValueError
	assert.ErrorAs(t, err, &uv)
	assert.EqualError(t, err, "ferry: send: invalid message: encode with ferry.JSONCodec[github.com/ferrymq/ferry_test.order]: json: unsupported value: NaN")
	_, err = tp.TrySend(nan)
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	err = tp.SendAsync(ctx, nan, func(ferry.SendResult, error) { t.Error("callback of a send that was refused") })
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	_, err = tp.SendBatch(ctx, []*ferry.TypedMessage[order]{{Topic: "t"}, {Topic: "t"}, nan})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	assert.ErrorContains(t, err, "ferry: send batch: message 2: invalid message: encode")
	_, err = tp.SendBatch(ctx, []*ferry.TypedMessage[order]{{Topic: "t"}, nil})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	_, err = tp.Send(ctx, nil)
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)

	ptp, err := ferry.NewTypedProducer[*order](p)
	require.NoError(t, err)
	_, err = ptp.Send(ctx, &ferry.TypedMessage[*order]{Topic: "t"})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	assert.ErrorContains(t, err, "nil *ferry_test.order value")
	itp, err := ferry.NewTypedProducer[fmt.Stringer](p)
	require.NoError(t, err)
	_, err = itp.Send(ctx, &ferry.TypedMessage[fmt.Stringer]{Topic: "t"})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)

	btp, err := ferry.NewTypedProducer(p, ferry.WithBodyCodec[order](brokenCodec{}))
	require.NoError(t, err)
	_, err = btp.Send(ctx, &ferry.TypedMessage[order]{Topic: "t"})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
	assert.ErrorContains(t, err, "encode with ferry_test.brokenCodec: cannot encode")

	// Errors of the producer's own are as Send's.
	_, err = tp.Send(ctx, &ferry.TypedMessage[order]{Topic: "nope"})
	assert.ErrorIs(t, err, ferry.ErrTopicNotFound)
	_, err = tp.Send(ctx, &ferry.TypedMessage[order]{Topic: "t", DeliverAt: ferry.MaxDeliverAt.Add(time.Second)})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage)

	assert.Zero(t, written(t, b, "t", 1), "nothing refused was written")
}

// TypedMessage carries every field of Message but Body (Value instead),
// with the same type: a field added to Message must be added here.
func TestTypedMessageFields(t *testing.T) {
	tm := reflect.TypeFor[ferry.TypedMessage[order]]()
	mt := reflect.TypeFor[ferry.Message]()
	for f := range mt.Fields() {
		if f.Name == "Body" {
			continue
		}
		g, ok := tm.FieldByName(f.Name)
		if assert.True(t, ok, "TypedMessage lacks Message.%s", f.Name) {
			assert.Equal(t, f.Type, g.Type, "TypedMessage.%s", f.Name)
		}
	}
	assert.Equal(t, mt.NumField(), tm.NumField(), "TypedMessage has a field Message has not, besides Value")
}

// The typed pull view: values decoded, a bad body yielded with its error
// and its message (the loop goes on), committed like any other; Poll
// likewise; the loop's end is a zero Received with the error.
func TestTypedPull(t *testing.T) {
	ctx := t.Context()
	b := newTopic(t, 1)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for _, body := range []string{`{"id":1}`, `{"id":`, `{"id":3}`, `{"id":4}`, `x`, `{"id":6}`} {
		_, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte(body)})
		require.NoError(t, err)
	}
	pc, err := b.NewPullConsumer("g", "t")
	require.NoError(t, err)
	defer pc.Close()
	tc, err := ferry.NewTypedPullConsumer[order](pc)
	require.NoError(t, err)
	assert.Same(t, pc, tc.PullConsumer())

	var ids []int
	var bad []int64
	var seen []ferry.Received[order]
	for r, err := range tc.Messages(ctx) {
		require.NotNil(t, r.Msg, "a decode error comes with its message: %v", err)
		seen = append(seen, r)
		if err != nil {
			assert.Equal(t, r.Err, err)
			assert.ErrorIs(t, err, ferry.ErrInvalidMessage)
			assert.Zero(t, r.Value)
			bad = append(bad, r.Msg.Offset)
		} else {
			ids = append(ids, r.Value.ID)
		}
		if len(seen) == 3 {
			break
		}
	}
	assert.Equal(t, []int{1, 3}, ids)
	assert.Equal(t, []int64{1}, bad)
	require.NoError(t, tc.Commit(ctx, seen...))

	rs, err := tc.Poll(ctx, 10)
	require.NoError(t, err)
	require.Len(t, rs, 3)
	assert.Equal(t, order{ID: 4}, rs[0].Value)
	assert.NoError(t, rs[0].Err)
	assert.ErrorIs(t, rs[1].Err, ferry.ErrInvalidMessage)
	assert.ErrorContains(t, rs[1].Err, "decode t[0] offset 4")
	assert.Equal(t, "x", string(rs[1].Msg.Body))
	assert.Equal(t, order{ID: 6}, rs[2].Value)
	require.NoError(t, tc.Commit(ctx, rs...))
	lag, err := b.Lag(ctx, "g", "t")
	require.NoError(t, err)
	assert.Zero(t, lag.Lag, "bad messages committed with the rest")

	// With WithAutoCommit a message that did not decode is finished as
	// any other once the loop body is done with it.
	apc, err := b.NewPullConsumer("auto", "t", ferry.WithAutoCommit())
	require.NoError(t, err)
	atc, err := ferry.NewTypedPullConsumer[order](apc)
	require.NoError(t, err)
	n := 0
	for r, err := range atc.Messages(ctx) {
		require.NotNil(t, r.Msg, "%v", err)
		if n++; n == 6 {
			break
		}
	}
	require.NoError(t, apc.Close())
	lag, err = b.Lag(ctx, "auto", "t")
	require.NoError(t, err)
	assert.Zero(t, lag.Lag, "bad messages auto-committed with the rest")

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	n = 0
	for r, err := range tc.Messages(short) {
		n++
		assert.Nil(t, r.Msg)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	}
	assert.Equal(t, 1, n, "the end is yielded once")
	_, err = tc.Poll(short, 1)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}
