package ferry_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// flakyLoads is a cursor store whose first Loads fail, as a distributed
// store's do while its leader is being elected.
type flakyLoads struct {
	*ferry.MemoryCursorStore
	fail atomic.Int32
}

func (s *flakyLoads) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if s.fail.Add(-1) >= 0 {
		return nil, errors.New("leader election in progress")
	}
	return s.MemoryCursorStore.Load(ctx, topic, group, queues)
}

// A take whose cursor load fails gives the queue back and takes it again
// after a pause: a transient failure of the cursor store must not leave
// a queue locked and idle until the next rebalance.
func TestTakeRetriesAFailedCursorLoad(t *testing.T) {
	ctx := context.Background()
	cs := &flakyLoads{MemoryCursorStore: ferry.NewMemoryCursorStore()}
	cs.fail.Store(3)
	var reported atomic.Int32
	b, err := ferry.NewBroker(ferry.WithCursorStore(cs))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
	handled := make(chan struct{}, 1)
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		select {
		case handled <- struct{}{}:
		default:
		}
		return nil
	}), ferry.WithOnError(func(error) { reported.Add(1) }))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Start(ctx))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatalf("nothing handled; the failed takes were reported %d times", reported.Load())
	}
	require.GreaterOrEqual(t, reported.Load(), int32(3), "each failed load is reported")
	require.Equal(t, []ferry.QueueID{{Topic: "t", Queue: 0}}, c.Assigned())
}
