package filestore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// A push consumer over a Store resumes after a restart from the cursor it
// committed on Close, reading through the disk (a cache of 2 messages).
func TestConsumerResumesAfterRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := []filestore.Option{filestore.WithCache(2, 1<<20), filestore.WithSegmentBytes(4096)}
	const queues, perRun = 3, 60

	// run sends perRun messages, then consumes until it has seen want
	// messages, and closes everything.
	run := func(first int, want int) map[string]int {
		st, err := filestore.Open(dir, opts...)
		require.NoError(t, err)
		defer st.Close()
		b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
		require.NoError(t, err)
		defer b.Close()
		require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: queues}))
		p, err := b.NewProducer()
		require.NoError(t, err)
		for i := first; i < first+perRun; i++ {
			_, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: fmt.Sprint(i), Body: fmt.Appendf(nil, "m%d", i)})
			require.NoError(t, err)
		}
		require.NoError(t, p.Close())

		var mu sync.Mutex
		seen := map[string]int{}
		done := make(chan struct{})
		c, err := b.NewConsumer("g", "orders", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
			mu.Lock()
			defer mu.Unlock()
			seen[string(m.Body)]++
			if len(seen) == want {
				close(done)
			}
			return nil
		}), ferry.WithStartFrom(ferry.Earliest))
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		<-done
		require.NoError(t, c.Close())
		mu.Lock()
		defer mu.Unlock()
		return seen
	}

	seen := run(0, perRun)
	assert.Len(t, seen, perRun)
	seen = run(perRun, perRun)
	// Only the new messages: the first run's were committed on Close.
	require.Len(t, seen, perRun)
	for i := perRun; i < 2*perRun; i++ {
		assert.Equal(t, 1, seen[fmt.Sprintf("m%d", i)], "m%d", i)
	}
}
