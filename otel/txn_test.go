package ferryotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	ferryotel "github.com/ferrymq/ferry/otel"
)

// TestTracingTransactional: a Transactional handler's outputs get a send
// span each, a child of the call's process span, ended when the output
// is written (with its offset) or with an error when its call failed;
// the output's reader continues the output's trace. No span is left
// open.
func TestTracingTransactional(t *testing.T) {
	tr, rec, _ := newTracer(t)
	ctx := context.Background()
	b, err := ferry.NewBroker(ferry.WithHooks(tr))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "out", Queues: 1}))
	c, err := b.NewConsumer("g", "in", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		d, _ := ferry.DeliveryFrom(ctx)
		if err := ferry.OutboxFrom(ctx).Send(&ferry.Message{Topic: "out", Body: m.Body}); err != nil {
			return err
		}
		if d.Attempt == 1 {
			return errors.New("boom")
		}
		return nil
	}), ferry.Transactional(), ferry.WithRetry(2, 0))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	read := make(chan struct{}, 1)
	r, err := b.NewConsumer("reader", "out", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		read <- struct{}{}
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	defer r.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "in", Body: []byte("order")})
	require.NoError(t, err)
	wait(t, read, "output read")
	require.NoError(t, r.Close())
	require.NoError(t, c.Close())

	st := newSpanTree(rec.Ended())
	sends := st.byName["send out"]
	require.Len(t, sends, 2, "a send span per call's output")
	process := map[int64]string{} // attempt → its process span's ID
	for _, s := range st.byName["process in"] {
		process[attrOf(s, ferryotel.AttemptKey).AsInt64()] = s.SpanContext().SpanID().String()
	}
	require.Len(t, process, 2, "a process span per call")
	var ok, failed int
	for _, s := range sends {
		if s.Status().Code == codes.Error {
			failed++
			assert.Equal(t, process[1], s.Parent().SpanID().String(), "the failed call's output")
			continue
		}
		ok++
		assert.Equal(t, process[2], s.Parent().SpanID().String(), "the second call's output")
		assert.Equal(t, int64(0), attrOf(s, ferryotel.OffsetKey).AsInt64())
		reader := st.one(t, "process out")
		assert.Equal(t, s.SpanContext().SpanID(), reader.Parent().SpanID(), "the output's reader is a child of its send")
	}
	assert.Equal(t, 1, ok, "written")
	assert.Equal(t, 1, failed, "dropped with its call")
	assert.Len(t, rec.Started(), len(rec.Ended()), "every span started ended")
}
