package ferry

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTxnStaleWriterFenced: an owner that has not noticed that a later
// owner took its queue (a take marker with a later token is in the log)
// writes its record after the marker, finds the marker, writes none of
// its outputs and gives the queue up; its record is void, and the
// message's outputs are those of the next call only.
func TestTxnStaleWriterFenced(t *testing.T) {
	ctx := context.Background()
	b, err := NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "in", Queues: 1}))
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "out", Queues: 1}))
	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	calls := 0
	c, err := b.NewConsumer("g", "in", HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if err := OutboxFrom(ctx).Send(&Message{Topic: "out", Body: []byte("call " + strconv.Itoa(n))}); err != nil {
			return err
		}
		if n == 1 {
			close(entered)
			<-release
		}
		return nil
	}), Transactional())
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &Message{Topic: "in", Body: []byte("x")})
	require.NoError(t, err)
	<-entered

	c.m.mu.Lock()
	r := c.m.runs[0]
	c.m.mu.Unlock()
	token := r.lease.Token()
	name, err := TransactionLog("g", "in")
	require.NoError(t, err)
	lt, err := b.topic(name)
	require.NoError(t, err)
	mark := &EnhancedMessage{Message: Message{Topic: name, Tag: txnMarkerTag + strconv.FormatUint(token+1, 10)}}
	_, err = lt.queues[0].Write(ctx, []*EnhancedMessage{mark})
	require.NoError(t, err)
	close(release)

	out, err := b.topic("out")
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the second call finished: its outputs, and any wrong one, are written
		lag, err := b.Lag(ctx, "g", "in")
		mu.Lock()
		defer mu.Unlock()
		return calls == 2 && err == nil && lag.Lag == 0
	}, 5*time.Second, time.Millisecond)
	dst := make([]*EnhancedMessage, 4)
	n, err := out.queues[0].Read(ctx, 0, dst)
	require.NoError(t, err)
	require.Equal(t, 1, n, "outputs")
	assert.Equal(t, "call 2", string(dst[0].Body), "the stale call's output is never stored")
	mu.Lock()
	assert.Equal(t, 2, calls)
	mu.Unlock()
}
