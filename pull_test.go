package ferry_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPullConsumerOptions(t *testing.T) {
	b := newTopic(t, 1)
	for _, o := range []ferry.ConsumerOption{ferry.Ordered(), ferry.WithConcurrency(2), ferry.WithRetry(2, time.Second), ferry.WithDeadLetter("x")} {
		_, err := b.NewPullConsumer("g", "t", o)
		require.ErrorIs(t, err, ferry.ErrInvalidOption)
	}
}

// ExamplePullConsumer_Poll pulls messages and commits them.
func ExamplePullConsumer_Poll() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "events", Queues: 1})
	p, _ := b.NewProducer()
	for i := range 3 {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "events", Body: fmt.Appendf(nil, "event %d", i)})
	}

	pc, err := b.NewPullConsumer("audit", "events")
	if err != nil {
		panic(err)
	}
	defer pc.Close()
	var bodies []string
	for len(bodies) < 3 {
		msgs, err := pc.Poll(ctx, 10)
		if err != nil {
			panic(err)
		}
		for _, m := range msgs {
			bodies = append(bodies, string(m.Body))
		}
		if err := pc.Commit(ctx, msgs...); err != nil {
			panic(err)
		}
	}
	sort.Strings(bodies)
	fmt.Println(bodies)
	// Output:
	// [event 0 event 1 event 2]
}

// A huge max is no reason to allocate: Poll returns what one queue holds.
func TestPullConsumerPollHugeMax(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "x", 10, 1)
	pc, err := b.NewPullConsumer("g", "t", ferry.WithBuffer(4, 1<<20))
	require.NoError(t, err)
	defer pc.Close()
	got := 0
	for got < 10 {
		msgs, err := pc.Poll(context.Background(), math.MaxInt)
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		require.LessOrEqual(t, len(msgs), 4, "no more than the buffer holds")
		require.NoError(t, pc.Commit(context.Background(), msgs...))
		got += len(msgs)
	}
	assert.Equal(t, 10, got)
}
