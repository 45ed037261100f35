package ferry_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every exported call that takes a context refuses a nil one with an
// error wrapping ErrInvalidOption, and none panics; the reflection check
// below makes a new method with a ctx fail here until it is in the table.
func TestNilContext(t *testing.T) {
	ctx := t.Context()
	b := newBroker(t, 2)
	p := newProducer(t, b)
	c, err := b.NewConsumer("g", "orders", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	pc, err := b.NewPullConsumer("pg", "orders")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	buf, err := ferry.NewBuffer(ferry.BufferConfig{})
	require.NoError(t, err)
	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "q"}, ferry.Retention{})
	t.Cleanup(func() { _ = q.Close() })
	st := ferry.NewMemoryStorage()
	t.Cleanup(func() { _ = st.Close() })
	cs := ferry.NewMemoryCursorStore()
	t.Cleanup(func() { _ = cs.Close() })
	co := ferry.NewMemoryCoordinator()
	t.Cleanup(func() { _ = co.Close() })
	gk := ferry.GroupKey{Scope: "g", Topic: "t"}
	sess, err := co.Join(ctx, gk, "m")
	require.NoError(t, err)
	lease, err := sess.Lock(ctx, 0)
	require.NoError(t, err)
	meta := ferry.TopicMeta{Name: "t", Queues: 1}
	msg := &ferry.Message{Topic: "orders"}
	em := []*ferry.EnhancedMessage{{Message: *msg}}
	tp, err := ferry.NewTypedProducer[string](p)
	require.NoError(t, err)
	tmsg := &ferry.TypedMessage[string]{Topic: "orders"}
	tpc, err := ferry.NewTypedPullConsumer[string](pc)
	require.NoError(t, err)

	calls := map[string]func(context.Context) error{
		"Broker.CreateTopic": func(ctx context.Context) error { return b.CreateTopic(ctx, meta) },
		"Broker.DeleteTopic": func(ctx context.Context) error { return b.DeleteTopic(ctx, "orders") },
		"Broker.AddQueues":   func(ctx context.Context) error { return b.AddQueues(ctx, "orders", 3) },
		"Broker.Groups":      func(ctx context.Context) error { _, err := b.Groups(ctx, "orders"); return err },
		"Broker.Lag":         func(ctx context.Context) error { _, err := b.Lag(ctx, "g", "orders"); return err },
		"Broker.ResetGroup": func(ctx context.Context) error {
			_, err := b.ResetGroup(ctx, "x", "orders", ferry.ResetToLatest())
			return err
		},
		"Broker.ForgetGroup":  func(ctx context.Context) error { return b.ForgetGroup(ctx, "x", "orders") },
		"Producer.Send":       func(ctx context.Context) error { _, err := p.Send(ctx, msg); return err },
		"Producer.SendBatch":  func(ctx context.Context) error { _, err := p.SendBatch(ctx, []*ferry.Message{msg}); return err },
		"Producer.SendAsync":  func(ctx context.Context) error { return p.SendAsync(ctx, msg, nil) },
		"Producer.Flush":      p.Flush,
		"Consumer.Start":      func(ctx context.Context) error { return c.Start(ctx) },
		"Consumer.Seek":       func(ctx context.Context) error { return c.Seek(ctx, ferry.ResetToLatest()) },
		"PullConsumer.Start":  func(ctx context.Context) error { return pc.Start(ctx) },
		"PullConsumer.Poll":   func(ctx context.Context) error { _, err := pc.Poll(ctx, 1); return err },
		"PullConsumer.Commit": func(ctx context.Context) error { return pc.Commit(ctx) },
		"PullConsumer.Seek":   func(ctx context.Context) error { return pc.Seek(ctx, ferry.ResetToLatest()) },
		"PullConsumer.Messages": func(ctx context.Context) error {
			for _, err := range pc.Messages(ctx) {
				return err
			}
			return nil
		},
		"TypedProducer.Send": func(ctx context.Context) error { _, err := tp.Send(ctx, tmsg); return err },
		"TypedProducer.SendBatch": func(ctx context.Context) error {
			_, err := tp.SendBatch(ctx, []*ferry.TypedMessage[string]{tmsg})
			return err
		},
		"TypedProducer.SendAsync":  func(ctx context.Context) error { return tp.SendAsync(ctx, tmsg, nil) },
		"TypedPullConsumer.Poll":   func(ctx context.Context) error { _, err := tpc.Poll(ctx, 1); return err },
		"TypedPullConsumer.Commit": func(ctx context.Context) error { return tpc.Commit(ctx) },
		"TypedPullConsumer.Messages": func(ctx context.Context) error {
			for _, err := range tpc.Messages(ctx) {
				return err
			}
			return nil
		},
		"Buffer.Put":         func(ctx context.Context) error { _, err := buf.Put(ctx, em); return err },
		"Buffer.WaitDrained": func(ctx context.Context) error { return buf.WaitDrained(ctx) },
		"Buffer.Lock":        func(ctx context.Context) error { return buf.Lock(ctx) },
		"MemoryQueue.Write":  func(ctx context.Context) error { _, err := q.Write(ctx, em); return err },
		"MemoryQueue.Read": func(ctx context.Context) error {
			_, err := q.Read(ctx, 0, make([]*ferry.EnhancedMessage, 1))
			return err
		},
		"MemoryStorage.OpenQueue":          func(ctx context.Context) error { _, err := st.OpenQueue(ctx, meta, 0); return err },
		"MemoryStorage.Topics":             func(ctx context.Context) error { _, err := st.Topics(ctx); return err },
		"MemoryStorage.SaveTopic":          func(ctx context.Context) error { return st.SaveTopic(ctx, meta) },
		"MemoryStorage.CreateTopic":        func(ctx context.Context) error { return st.CreateTopic(ctx, meta) },
		"MemoryStorage.DeleteTopic":        func(ctx context.Context) error { return st.DeleteTopic(ctx, "t") },
		"MemoryStorage.Topic":              func(ctx context.Context) error { _, err := st.Topic(ctx, "t"); return err },
		"MemoryCursorStore.Load":           func(ctx context.Context) error { _, err := cs.Load(ctx, "t", "g", 1); return err },
		"MemoryCursorStore.Commit":         func(ctx context.Context) error { return cs.Commit(ctx, "t", "g", 0, 1) },
		"MemoryCursorStore.CommitFenced":   func(ctx context.Context) error { return cs.CommitFenced(ctx, "t", "g", 0, 1, 1) },
		"MemoryCursorStore.CommitFinished": func(ctx context.Context) error { return cs.CommitFinished(ctx, "t", "g", 0, 1, []int64{3}, 1) },
		"MemoryCursorStore.TakeCursor":     func(ctx context.Context) error { _, _, err := cs.TakeCursor(ctx, "t", "g", 0, 1); return err },
		"MemoryCursorStore.Cursors":        func(ctx context.Context) error { _, err := cs.Cursors(ctx, "t", 1); return err },
		"MemoryCursorStore.Forget":         func(ctx context.Context) error { return cs.Forget(ctx, "t", "g") },
		"MemoryCoordinator.Join":           func(ctx context.Context) error { _, err := co.Join(ctx, gk, "other"); return err },
		"MemoryCoordinator.Members":        func(ctx context.Context) error { _, err := co.Members(ctx, gk); return err },
		"Session.Lock":                     func(ctx context.Context) error { _, err := sess.Lock(ctx, 1); return err },
		"Session.Leave":                    func(ctx context.Context) error { return sess.Leave(ctx) },
		"Lease.Release":                    func(ctx context.Context) error { return lease.Release(ctx) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() {
				err = call(nil)
			})
			require.ErrorIs(t, err, ferry.ErrInvalidOption)
			assert.Contains(t, err.Error(), "nil context")
		})
	}

	// A nil context changed nothing: the session still holds its lease,
	// the topic is there with its queues.
	require.NoError(t, lease.Release(ctx))
	require.NoError(t, sess.Leave(ctx))
	got, ok := b.Topic("orders")
	require.True(t, ok)
	assert.Equal(t, 2, got.Queues)
	d, ok := ferry.DeliveryFrom(nil) //lint:ignore SA1012 a nil context is the input under test
	assert.False(t, ok)
	assert.Zero(t, d)

	// Every exported method of these types whose first parameter is a
	// context is in the table.
	ctxType := reflect.TypeFor[context.Context]()
	for name, v := range map[string]any{
		"Broker": b, "Producer": p, "Consumer": c, "PullConsumer": pc, "Buffer": buf,
		"MemoryQueue": q, "MemoryStorage": st, "MemoryCursorStore": cs, "MemoryCoordinator": co,
		"Session": sess, "Lease": lease, "TypedProducer": tp, "TypedPullConsumer": tpc,
	} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumMethod() {
			m := typ.Method(i)
			if m.Type.NumIn() > 1 && m.Type.In(1) == ctxType {
				assert.Contains(t, calls, name+"."+m.Name, "a method taking a context with no nil-context case")
			}
		}
	}
}
