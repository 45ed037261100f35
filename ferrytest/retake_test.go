package ferrytest_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/require"
)

// A member whose lease on a queue is lost while its session lives (a
// renewal that failed, say) takes the queue again, with a new token, and
// goes on handling it.
func TestConsumerRetakesLostLease(t *testing.T) {
	ctx := context.Background()
	coord := ferrytest.NewFakeCoordinator()
	defer coord.Close()
	b, err := ferry.NewBroker(ferry.WithCoordinator(coord))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
	var handled atomic.Int64
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		handled.Add(1)
		return nil
	}), ferry.WithMemberID("m"))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	g := ferry.GroupKey{Scope: "g", Topic: "t"}
	_, before, ok := coord.Holder(g, 0)
	require.True(t, ok)

	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	send := func(n int) {
		for i := range n {
			_, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
			require.NoError(t, err)
		}
	}
	send(10)
	ferrytest.WaitFor(t, 0, "10 handled", func() bool { return handled.Load() == 10 }, nil)
	require.True(t, coord.LoseLease(g, 0))
	ferrytest.WaitFor(t, 0, "the queue taken again", func() bool {
		holder, token, ok := coord.Holder(g, 0)
		return ok && holder == "m" && token > before
	}, nil)
	send(10)
	ferrytest.WaitFor(t, 0, "the next 10 handled", func() bool { return handled.Load() >= 20 }, nil)
	require.Eventually(t, func() bool {
		return len(c.Assigned()) == 1
	}, 10*time.Second, time.Millisecond)
}
